"""``sglang-fp4-indexer ab``: its options and the run of the arms (``cli.py`` wires it).

Launch mode: ``sglang-fp4-indexer ab MODEL --out DIR [options] -- [SGLang server flags]`` (or ``--config
serve.yaml``) runs ``python -m sglang.launch_server`` twice on this machine's GPUs, one arm after the other:
FP8 (the flags as given) and FP4 (plus ``--enable-fp4-indexer``); ``--orders fp8-first,fp4-first`` runs both
orders. URL mode: ``--fp8-url URL --fp4-url URL`` measures two servers already running. Each finished arm's
result is kept as ``DIR/ORDER/ARM/result.json`` and not run again; ``DIR/report.json`` and ``DIR/report.png``
hold the report. Before any server starts, the plugin's own check (``check.run_check``) decides whether FP4 would
serve the model and flags; where it would not, the command says why in one line and exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from typing import Callable
from urllib.parse import urlsplit

from ..argtypes import integer, int_list
from ..check.model import PACKAGED_MODELS
from ..serving import (bench_serving_command, client_error, get_json, gpu_description, kv_pool_tokens,
                       launch_command, launched_server, peak_running_requests, running_peaks, read_jsonl, versions)
from . import quality
from .report import AB_FIELDS, ARMS, build_report, plot_report, report_text

__all__ = ["ORDERS", "add_arguments", "main", "parse_orders", "parse_depths", "dummy_weights"]

#: Files of which a local tokenizer folder holds at least one (Hugging Face's fast and slow tokenizers).
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
#: The launched servers' port where ``--port`` is not given.
DEFAULT_PORT = 30741
#: Few-shot examples SGLang's ``few_shot_gsm8k`` puts before each question (its first lines; ``quality.gsm8k_command``).
GSM8K_SHOTS = 5
#: The run orders: which arm's server starts first.
ORDERS = {"fp8-first": ("fp8", "fp4"), "fp4-first": ("fp4", "fp8")}
#: What a kept arm's ``result.json`` holds (``run_arms`` writes it): the keys and their types.
_RESULT_KEYS = {"server_info": dict, "kv": dict, "bench": list, "commands": list}


def parse_orders(text: str) -> list[str]:
    """``--orders``: a comma-separated subset of ``ORDERS``' names, each once.

    Raises:
        argparse.ArgumentTypeError: an unknown or repeated name.
    """
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in ORDERS]
    if not names or bad or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of {', '.join(ORDERS)} (each once), "
                                         f"got {text!r}")
    return names


def parse_depths(text: str) -> list[float]:
    """``--passkey-depths``: comma-separated fractions in [0, 1].

    Raises:
        argparse.ArgumentTypeError: an item that is not a number in [0, 1].
    """
    try:
        depths = [float(t) for t in text.split(",") if t.strip()]
    except ValueError:
        depths = []
    if not depths or any(not 0.0 <= d <= 1.0 for d in depths):
        raise argparse.ArgumentTypeError(f"expected comma-separated fractions in [0, 1], got {text!r}")
    return depths


#: GSM8K questions asked where --gsm8k-data is given without --gsm8k-questions.
GSM8K_QUESTIONS = 200


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``ab``."""
    parser.add_argument("model", nargs="?", default=None,
                        help="the model you serve (local directory with config.json, or, for the models whose "
                             f"config this package carries ({', '.join(sorted(set(PACKAGED_MODELS.values())))}), "
                             "its Hugging Face name, which launch_server downloads the first time as it always "
                             "does), as --model-path; optional "
                             "with --config when the YAML names model-path, and with --fp8-url/--fp4-url (then "
                             "the plugin's check reads its config.json and the serving benchmark its tokenizer)")
    # After "--": the SGLang server flags (cli.main splits them off before argparse sees them).
    parser.set_defaults(server_flags=[])
    parser.usage = "%(prog)s [MODEL] --out DIR [options] [-- SGLANG SERVER FLAGS]"
    parser.epilog = ("SGLang server flags go last, after --, as you serve with them (e.g. -- --tp-size 8 "
                     "--kv-cache-dtype fp8_e4m3); the FP4 arm adds --enable-fp4-indexer. Without --fp8-url/--fp4-url "
                     "the servers run here, one at a time on this machine's GPUs (python -m sglang.launch_server "
                     "with this Python): each order takes two of your server's start-ups plus GSM8K, the passkey "
                     "prompts and the serving benchmark runs on each, with progress shown. With "
                     "--fp8-url/--fp4-url give the flags the two servers run with: the plugin's check reads them.")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="output folder: each arm's result, the report (report.json, report.png); the same "
                             "command again (same DIR, same options) skips the arms already finished")
    parser.add_argument("--config", metavar="YAML", default=None,
                        help="an SGLang server config file (as launch_server --config takes it), passed to both "
                             "servers")
    parser.add_argument("--fp8-url", metavar="URL", default=None,
                        help="a running server without the plugin (http://HOST:PORT); with --fp4-url: measure "
                             "the two servers instead of launching them")
    parser.add_argument("--fp4-url", metavar="URL", default=None,
                        help="a running server launched with --enable-fp4-indexer (http://HOST:PORT)")
    parser.add_argument("--orders", type=parse_orders, default=["fp8-first"], metavar="LIST",
                        help="run orders, comma-separated: fp8-first, fp4-first (default fp8-first); quality is "
                             "measured in the first order only, speed in each")
    parser.add_argument("--input-lens", type=int_list(1), default=[4096], metavar="N,...",
                        help="prompt tokens of the serving benchmark, one run per length (default 4096)")
    parser.add_argument("--output-len", type=integer(1), default=256, metavar="N",
                        help="tokens generated per request in the serving benchmark (default 256)")
    parser.add_argument("--concurrency", type=integer(1), default=8, metavar="N",
                        help="requests at a time in the serving benchmark (default 8)")
    parser.add_argument("--prompts", type=integer(1), default=None, metavar="N",
                        help="requests per serving benchmark run (default 4 x --concurrency)")
    parser.add_argument("--kv-limited-concurrency", type=integer(0), default=None, metavar="N",
                        help="requests at a time of the KV-limited load (the longest --input-lens): default twice "
                             "what the first server's KV pool holds at that length (its pool on every DP-attention "
                             "rank); 0 leaves the load out")
    parser.add_argument("--gsm8k-data", metavar="PATH", default=None,
                        help="GSM8K test set as local JSONL (question and answer per line; no network is used); "
                             "without it GSM8K is left out")
    parser.add_argument("--gsm8k-questions", type=integer(1), default=None, metavar="N",
                        help=f"GSM8K questions asked, with --gsm8k-data (default {GSM8K_QUESTIONS})")
    parser.add_argument("--passkey-lengths", type=int_list(0), default=None, metavar="N,...",
                        help="passkey prompt lengths in tokens (default the longest --input-lens; 0 leaves the "
                             "passkey check out)")
    parser.add_argument("--passkey-depths", type=parse_depths, default=[0.1, 0.5, 0.9], metavar="F,...",
                        help="where the key sits in the prompt, as fractions (default 0.1,0.5,0.9)")
    parser.add_argument("--passkey-trials", type=integer(1), default=4, metavar="N",
                        help="prompts per length and depth, each with its own key (default 4)")
    parser.add_argument("--tokenizer", metavar="PATH", default=None,
                        help="the tokenizer SGLang's serving benchmark loads (a folder with the checkpoint's "
                             "tokenizer files, or a Hugging Face name); default MODEL, else the servers' model path")
    parser.add_argument("--port", type=integer(1, 65535), default=None,
                        help=f"port of the launched servers on 127.0.0.1 (default {DEFAULT_PORT}; launch mode only)")
    parser.add_argument("--ready-timeout", type=integer(1), default=3600, metavar="S",
                        help="seconds a launched server may take to answer /health (default 3600)")


def _flag_values(flags: list[str], name: str) -> list[str]:
    """The values ``flags`` give the server flag ``name`` (``--name VALUE`` or ``--name=VALUE``), in order."""
    return [f.split("=", 1)[1] if "=" in f else (flags[i + 1] if i + 1 < len(flags) else "")
            for i, f in enumerate(flags) if f == name or f.startswith(name + "=")]


def dummy_weights(flags: list[str], config: dict) -> bool:
    """Whether the server flags or the YAML config load dummy weights (``--load-format dummy``)."""
    if "dummy" in _flag_values(flags, "--load-format"):
        return True
    return str(config.get("load-format", config.get("load_format", ""))).strip() == "dummy"


def _read_config(path: str | None) -> dict:
    if path is None:
        return {}
    import yaml

    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except OSError as e:
        raise ValueError(f"--config: cannot read {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ValueError(f"--config: {path} is not YAML ({' '.join(str(e).split())})") from None
    if not isinstance(data, dict):
        raise ValueError(f"--config: {path} must hold a mapping of server options, got {type(data).__name__}")
    return data


def _config_paths(args) -> list[str]:
    """The SGLang config files the servers read: ``--config`` of ab and any ``--config`` among the server flags."""
    inline = _flag_values(list(args.server_flags), "--config")
    return ([args.config] if args.config else []) + [p for p in inline if p]


def _config_enables_fp4(paths: list[str]) -> bool:
    """Whether one of the config files turns FP4 on (``enable-fp4-indexer: true``)."""
    for path in paths:
        cfg = _read_config(path)
        if cfg.get("enable-fp4-indexer", cfg.get("enable_fp4_indexer", False)):
            return True
    return False


def _validate(args: argparse.Namespace, answer_value: Callable | None = None) -> tuple[str, dict]:
    """The mode (``launch`` or ``urls``) and the YAML config; ValueError naming the option when they conflict.
    Everything that can be told from the options is told here, before the check and before any server."""
    config = _read_config(args.config)
    short = [n for n in (args.passkey_lengths or []) if 0 < n < quality.PASSKEY_MIN_TOKENS]
    if short:
        raise ValueError(f"--passkey-lengths: expected 0 (no passkey check) or >= {quality.PASSKEY_MIN_TOKENS} tokens, "
                         f"got {short[0]}")
    if args.kv_limited_concurrency and args.kv_limited_concurrency == args.concurrency:
        raise ValueError(f"--kv-limited-concurrency: {args.kv_limited_concurrency} is --concurrency too; give another "
                         "value (the two loads would not be told apart), or 0 to leave the KV-limited load out")
    if (args.fp8_url is None) != (args.fp4_url is None):
        given = "--fp8-url" if args.fp8_url else "--fp4-url"
        raise ValueError(f"{given}: give both --fp8-url and --fp4-url (two running servers), or neither")
    if args.fp8_url:
        for name in ("fp8_url", "fp4_url"):
            url = getattr(args, name)
            try:
                quality._host_port(url)
                ok = url.startswith("http://") and urlsplit(url).path in ("", "/")
            except ValueError:
                ok = False
            if not ok:  # SGLang's GSM8K client takes a host and port and speaks plain HTTP
                raise ValueError(f"--{name.replace('_', '-')}: expected http://HOST:PORT (no path), got {url!r}")
        if args.port is not None:
            raise ValueError("--port: sets the launched servers' port; with --fp8-url/--fp4-url the URLs name the "
                             "servers' ports, drop it")
        if args.orders != ["fp8-first"]:
            raise ValueError("--orders: with --fp8-url/--fp4-url both servers run already; no order to choose")
        if args.fp8_url.rstrip("/") == args.fp4_url.rstrip("/"):
            raise ValueError(f"--fp4-url: {args.fp4_url} is --fp8-url's server too; give the URL of the server "
                             "launched with --enable-fp4-indexer")
    if len(set(args.input_lens)) < len(args.input_lens):
        raise ValueError(f"--input-lens: each length once, got {','.join(map(str, args.input_lens))}")
    if args.gsm8k_questions is not None and args.gsm8k_data is None:
        raise ValueError("--gsm8k-questions: GSM8K runs only with --gsm8k-data (a local copy of its test set); "
                         "give it, or drop --gsm8k-questions")
    if args.gsm8k_questions is None:
        args.gsm8k_questions = GSM8K_QUESTIONS
    if args.gsm8k_data is not None:
        _check_gsm8k(args.gsm8k_data, args.gsm8k_questions, answer_value)
    if not args.out or (os.path.exists(args.out) and not os.path.isdir(args.out)):
        raise ValueError(f"--out: expected a folder (new or of an earlier run), got {args.out!r}")
    for path in _config_paths(args)[1 if args.config else 0:]:
        _read_config(path)  # a --config among the server flags: readable, or named
    tokenizer = args.tokenizer
    if tokenizer is not None and _missing_local(tokenizer):
        raise ValueError(f"--tokenizer: no folder {tokenizer} on this machine; give a folder with the checkpoint's "
                         "tokenizer files (or its Hugging Face name)")
    # SGLang's serving benchmark loads --tokenizer in either mode, and MODEL's with servers given by URL (a launched
    # server loads MODEL's itself).
    folder = tokenizer or (args.model if args.fp8_url else None)
    if folder is not None and os.path.isdir(folder) and not any(
            os.path.exists(os.path.join(folder, f)) for f in _TOKENIZER_FILES):
        option = "--tokenizer" if tokenizer else "model"
        raise ValueError(f"{option}: {folder} holds none of {', '.join(_TOKENIZER_FILES)}, which SGLang's "
                         "serving benchmark loads; give a folder with the checkpoint's tokenizer files")
    if args.fp8_url:
        return "urls", config
    if args.model is None and not (config.get("model-path") or config.get("model_path")):
        raise ValueError("model: give the model path (or --config with model-path, or --fp8-url and --fp4-url)")
    from_config = str(config.get("model-path") or config.get("model_path") or "")
    if args.model is None and _missing_local(from_config):
        raise ValueError(f"--config: its model-path {from_config} is no folder on this machine; give the "
                         "checkpoint's folder as MODEL or in the file")
    launch_command(args.model, DEFAULT_PORT, list(args.server_flags), fp4=True)  # flags the command sets itself
    if any(f.split("=", 1)[0] in ("--model-path", "--model") for f in args.server_flags):
        raise ValueError("server flags: --model-path: give the model as ab's MODEL instead")
    if args.model is not None and (os.path.isfile(args.model) or (not os.path.exists(args.model)
                                                                  and "/" not in args.model)):
        repo = PACKAGED_MODELS.get(args.model.lower())
        packaged = (f" ({args.model} names a config packaged for check, without weights: give {repo} or its folder)"
                    if repo else "")
        raise ValueError(f"model: expected the checkpoint's folder or its Hugging Face name (ORG/NAME), as "
                         f"launch_server's --model-path takes it, got {args.model!r}{packaged}")
    if args.model is not None and _missing_local(args.model):
        raise ValueError(f"model: no folder {args.model} on this machine; give the checkpoint's folder (with its "
                         "config.json), as launch_server's --model-path takes it")
    return "launch", config


def _missing_local(path: str) -> bool:
    """Whether ``path`` is written as a local path (``/``, ``.`` or ``~`` first: not a Hugging Face name) and no
    folder is there on this machine."""
    return path.startswith(("/", ".", "~")) and not os.path.isdir(os.path.expanduser(path))


def _check_gsm8k(path: str, questions: int, answer_value: Callable | None = None) -> None:
    """``--gsm8k-data`` read before any server starts, as SGLang's few-shot GSM8K will read it: every line not
    starting with ``#`` a JSON object with ``question`` and ``answer`` strings, the answer holding a number SGLang
    can take as its label (``answer_value``, SGLang's ``get_answer_value`` that ``cli`` passes: not its invalid
    marker, which it gives a text without a number; not checked without it; GSM8K's ``test.jsonl``), at least
    ``questions`` of them and at least ``GSM8K_SHOTS`` (SGLang's few-shot GSM8K puts the first lines before every
    question).

    Raises:
        ValueError: naming ``--gsm8k-data`` (and ``--gsm8k-questions`` when the file holds fewer), the file and
            the first line that is not such an object.
    """
    try:
        with open(path, errors="replace") as f:  # as SGLang's read_jsonl reads it: every line but those with "#"
            lines = [(i, ln) for i, ln in enumerate(f, 1) if not ln.startswith("#")]
    except OSError as e:
        raise ValueError(f"--gsm8k-data: cannot read {path} ({e.strerror})") from None
    for i, ln in lines:
        if not ln.strip():
            raise ValueError(f"--gsm8k-data: line {i} of {path} is blank; SGLang's few-shot GSM8K reads every "
                             "line as JSON: remove it")
        try:
            obj = json.loads(ln)
        except ValueError:
            obj = None
        if not (isinstance(obj, dict) and isinstance(obj.get("question"), str) and isinstance(obj.get("answer"), str)):
            raise ValueError(f"--gsm8k-data: line {i} of {path} is not a JSON object with question and answer "
                             "strings; expected GSM8K's test.jsonl (one such object per line)")
        if answer_value is not None and answer_value(obj["answer"]) == answer_value(""):
            raise ValueError(f"--gsm8k-data: line {i} of {path} has an answer without a number SGLang can read "
                             "as its label (GSM8K's answers end in '#### N')")
    need = max(questions, GSM8K_SHOTS)
    if len(lines) < need:
        raise ValueError(f"--gsm8k-data: {path} holds {len(lines)} questions; --gsm8k-questions {questions} (and "
                         f"SGLang's {GSM8K_SHOTS} few-shot examples) need {need}: give a smaller --gsm8k-questions "
                         "or the whole test set")


def _refusal(args, flags: list[str], config: dict, read_sglang) -> tuple[str | None, str | None, dict | None]:
    """``(refusal, check text, GPU layout)``: the plugin's own decision for the model and flags
    (``check.run_check``, its decision only: the servers size their own KV pools), and the GPUs one server takes as
    SGLang's parser reads the flags (``run_check``'s ``gpu_layout``; None where it did not read them).

    Raises:
        ValueError: what ``run_check`` raises for the model and flags, and a load longer than the model's context
            (``--input-lens`` + ``--output-len``, or ``--passkey-lengths``).
    """
    from ..check import run_check

    model = args.model or config.get("model-path") or config.get("model_path")
    if model is None:
        return None, "not run (no model path given with --fp8-url/--fp4-url)", None
    check_flags = flags + (["--config", args.config] if args.config else [])
    try:
        res = run_check(model, server_flags=check_flags, read_sglang=read_sglang, capacity=False,
                        announce=lambda line: print(line, file=sys.stderr, flush=True),
                        whitelist=not (args.fp8_url or args.fp4_url))  # servers by URL: their environment's
    except ValueError as e:
        raise ValueError(_ab_terms(str(e))) from None
    d = res["decision"]
    if not d.enabled:
        return d.reason, "FP4 refused: " + d.reason, res.get("gpu_layout")
    positions = res.get("positions")
    if positions:
        longest = max(args.input_lens) + args.output_len
        if longest > positions:
            raise ValueError(f"--input-lens: {max(args.input_lens)} tokens in and --output-len {args.output_len} "
                             f"out make {longest}, more than the {positions} the model serves "
                             f"({_ab_terms(res['positions_from'])})")
        long_keys = [n for n in (args.passkey_lengths or []) if n > positions]
        if long_keys:
            raise ValueError(f"--passkey-lengths: {long_keys[0]} tokens, more than the {positions} the model "
                             f"serves ({_ab_terms(res['positions_from'])})")
    device = str(res.get("device") or "")
    assumed = " (CUDA 9.0 assumed: no GPU on this machine, and the servers' GPUs are not read)" if "assumed" in device \
        else ""
    return None, "FP4 enabled: " + d.reason + assumed, res.get("gpu_layout")


def _ab_terms(text: str) -> str:
    """``check``'s text in ab's terms: its ``--sglang-args`` are ab's server flags after ``--``, where a ``--config``
    file is ab's own ``--config``, and it is ab that launches the model it is given."""
    text = text.replace("--sglang-args: the --config file", "--config: the file")
    # A hub name check has no config for: ab reads the config from the checkpoint's folder, which it also launches.
    text = re.sub(r"check reads a local config\.json or model directory, not the hub: get the config with: "
                  r"hf download (\S+) config\.json --local-dir DIR, then run check DIR",
                  r"ab reads the model's config.json from its local folder, not from the hub: download the "
                  r"checkpoint with: hf download \1 --local-dir DIR, then give DIR as MODEL", text)
    text = text.replace("(give a model directory with config.json, a config JSON file, or a packaged config:",
                        "(give the checkpoint's folder with its config.json, or the Hugging Face name of a packaged "
                        "config:")
    return (text.replace("--sglang-args", "the server flags after --").replace("as check's model", "as the model")
            .replace("check describes the model it is given", "ab checks the model it is given"))


def _gpus_needed(flags: list[str], config: dict) -> tuple[int, str]:
    """The GPUs one server takes, tensor x pipeline parallel (``--tp-size``/``--tensor-parallel-size``,
    ``--pp-size``/``--pipeline-parallel-size``; the flags win over the YAML config, 1 where neither says), and
    where that was read, e.g. ``"--tp-size 8"``."""
    total, said = 1, []
    for names in (("--tp-size", "--tensor-parallel-size"), ("--pp-size", "--pipeline-parallel-size")):
        value, label = next((v for n in names for v in _flag_values(flags, n)), None), names[0] + " {}"
        if value is None:
            key = next((k for n in names for k in (n[2:], n[2:].replace("-", "_")) if k in config), None)
            if key is not None:
                value, label = config[key], key + " {} in --config"
        try:
            n = int(value) if value is not None else 1
        except (TypeError, ValueError):
            n = 1  # SGLang's own parser names a bad value
        if n > 1:
            total *= n
            said.append(label.format(n))
    return total, " x ".join(said)


def _no_gpu(flags: list[str], gpus: Callable[[], dict], config: dict | None = None,
            parsed: dict | None = None) -> str | None:
    """Why the servers cannot start on this machine (no NVIDIA GPU that ``nvidia-smi`` lists, fewer than one
    server takes or than its highest GPU index needs, or a server over several nodes), or None; None also when
    the flags ask SGLang for another ``--device``. ``parsed``: the GPU layout as SGLang's parser reads the flags
    (``_refusal``; it takes abbreviations such as ``--tp 8``), whose count wins over this module's own reading of
    the flags and config (``_gpus_needed``)."""
    device = (_flag_values(flags, "--device") or ["cuda"])[0]
    if not device.startswith("cuda"):
        return None
    if parsed and parsed.get("nnodes", 1) > 1:
        return (f"--nnodes {parsed['nnodes']}: ab launches both servers on this machine only; launch them on your "
                "nodes and give their URLs as --fp8-url and --fp4-url")
    found = gpus()
    if "error" in found:
        return f"no GPU found on this machine ({found['error']})"
    need, said = _gpus_needed(flags, config or {})
    if parsed and parsed.get("gpus") is not None and parsed["gpus"] != need:
        need, said = parsed["gpus"], ("tensor x pipeline parallel x data-parallel replicas, as SGLang's parser "
                                      "reads the server flags")
    base, step = (parsed or {}).get("base_gpu_id", 0), (parsed or {}).get("gpu_id_step", 1)
    top = base + (need - 1) * step  # the highest GPU index a server takes (SGLang: base + rank x step)
    if isinstance(found.get("count"), int) and found["count"] <= top:
        what = f"a server takes {need} GPU{'s' if need > 1 else ''}" + (f" ({said})" if said else "")
        if (base, step) != (0, 1):
            what += f", up to GPU index {top} (--base-gpu-id {base}, --gpu-id-step {step})"
        return f"{what}; nvidia-smi lists {found['count']} on this machine ({found.get('name', '?')})"
    return None


#: ``/server_info`` fields that must agree between the two servers given by URL (the model, how its weights load,
#: the KV cache's type, speculative decoding and the parallel layout).
_SAME_ON_BOTH = ("model_path", "load_format", "kv_cache_dtype", "speculative_algorithm", "speculative_num_steps",
                 "speculative_num_draft_tokens", "tp_size", "dp_size", "attn_dp_size", "enable_dp_attention",
                 "page_size")


#: Server flags (both spellings SGLang takes) and the ``/server_info`` field each sets: with servers given by URL a
#: flag given after ``--`` must match what the servers report, or the plugin's check describes another deployment.
#: ``/server_info`` reports resolved values, so only flags SGLang keeps as given are compared (not ``--page-size``,
#: which the DSA backend sets itself), ``auto`` is not compared, and NEXTN is SGLang's other name for EAGLE.
_FLAG_FIELDS = (("--kv-cache-dtype", "kv_cache_dtype"), ("--tp-size", "tp_size"), ("--tensor-parallel-size", "tp_size"),
                ("--dp-size", "dp_size"), ("--data-parallel-size", "dp_size"),
                ("--speculative-algorithm", "speculative_algorithm"),
                ("--speculative-num-steps", "speculative_num_steps"),
                ("--speculative-num-draft-tokens", "speculative_num_draft_tokens"), ("--load-format", "load_format"))
_SAME_NAME = {"nextn": "eagle"}


def _flags_problem(flags: list[str], info: dict) -> str | None:
    """The first server flag of ``flags`` (ab's flags after ``--``) in ``_FLAG_FIELDS`` whose value differs from
    the field a server reports in ``info`` (its ``/server_info``; a field it does not report is not compared), as
    one line, or None. Numbers compare as numbers, names without regard to case (NEXTN as EAGLE); ``auto`` is not
    compared."""
    for flag, key in _FLAG_FIELDS:
        given = _flag_values(flags, flag)
        have = info.get(key)
        if not given or have is None:
            continue
        want = given[-1]
        if want.lower() == "auto":
            continue
        try:
            same = int(want) == have if isinstance(have, int) and not isinstance(have, bool) else \
                _SAME_NAME.get(want.lower(), want.lower()) == _SAME_NAME.get(str(have).lower(), str(have).lower())
        except ValueError:
            same = False
        if not same:
            return (f"server flags: {flag} {want}, but the servers run with {key} {have} (their /server_info): the "
                    "plugin's check would describe another deployment than the one measured; give after -- the flags "
                    "the servers run with")
    return None


def _servers_problem(args) -> str | None:
    """With ``--fp8-url``/``--fp4-url``: why the first of the two cannot be measured as its arm (no server answers
    ``/server_info``, it reports ``enable_fp4_indexer`` contrary to its arm, or it does not answer ``/v1/models``,
    which SGLang's serving benchmark waits on), then whether they differ in a field of ``_SAME_ON_BOTH``, then
    whether a server flag after ``--`` differs from what they report (``_flags_problem``), then why
    SGLang's serving benchmark
    could not load their tokenizer here (no MODEL or ``--tokenizer``, and a model path this machine does not
    have), or None."""
    infos = []
    for name, fp4 in (("fp8_url", False), ("fp4_url", True)):
        url, option = getattr(args, name), "--" + name.replace("_", "-")
        info = get_json(url.rstrip("/") + "/server_info", 30.0)
        if "error" in info:
            why = " ".join(str(info["error"]).split())[:200]  # one line, whatever the server answered
            return f"{option}: no SGLang server answers at {url} (/server_info: {why})"
        said = info.get("enable_fp4_indexer")  # where the server reports the plugin's switch
        if said is not None and bool(said) != fp4:
            return (f"{option}: the server at {url} runs with enable_fp4_indexer {said} (its /server_info); "
                    f"expected a server launched {'with' if fp4 else 'without'} --enable-fp4-indexer")
        models = get_json(url.rstrip("/") + "/v1/models", 30.0)  # SGLang's serving benchmark waits on it
        if "error" in models:
            why = " ".join(str(models["error"]).split())[:200]  # one line, whatever the server answered
            return (f"{option}: the server at {url} answers /server_info but not /v1/models ({why}), "
                    "which SGLang's serving benchmark needs; give the SGLang server's own URL")
        infos.append(info)
    for key in _SAME_ON_BOTH:
        a, b = (info.get(key) for info in infos)
        if a is not None and b is not None and a != b:
            return (f"--fp4-url: the two servers differ in {key} (FP8 server {a}, FP4 server {b}, their "
                    "/server_info): an A/B needs the same model and flags on both, FP4's switch apart")
    for info in infos:
        problem = _flags_problem(list(args.server_flags), info)
        if problem:
            return problem
    for info in infos:
        path = str(info.get("model_path") or "")
        if _tokenizer(args) is None and _missing_local(path):
            return (f"--tokenizer: SGLang's serving benchmark loads the tokenizer from the servers' model path "
                    f"{path}, which this machine does not have; give MODEL or --tokenizer (a folder with the "
                    "checkpoint's tokenizer files)")
    return None


def _tokenizer(args) -> str | None:
    """The tokenizer the serving benchmark loads: ``--tokenizer``, else MODEL, else None (the benchmark then reads
    the server's model path)."""
    return args.tokenizer or args.model


#: SGLang's clients the arms run as subprocesses of this Python: the serving benchmark always, few-shot GSM8K with
#: ``--gsm8k-data``.
_CLIENTS = ("sglang.benchmark.serving", "sglang.test.few_shot_gsm8k")


def _clients_problem(modules: tuple[str, ...], run: Callable) -> str | None:
    """Why SGLang's clients that the arms run (``modules``: ``_CLIENTS``, or its first without GSM8K) cannot be
    imported by this Python (``sys.executable``, this environment's ``PYTHONPATH``), from one ``python -c "import
    ..."`` run through ``run`` (``subprocess.run``), or None: the last line of its error, e.g. a module SGLang's
    benchmark client needs that this environment lacks (Hugging Face ``datasets``)."""
    p = run([sys.executable, "-c", "; ".join(f"import {m}" for m in modules)], capture_output=True, text=True)
    if p.returncode == 0:
        return None
    return (f"SGLang's clients ({', '.join(modules)}) do not import with {sys.executable} "
            f"({client_error((p.stdout or '') + (p.stderr or ''))}); install what it names in this environment")


#: What the tokenizer check runs: SGLang's serving benchmark's own tokenizer loader, on the name it would load.
_TOKENIZER_CHECK = "import sys; from sglang.benchmark.utils import get_tokenizer; get_tokenizer(sys.argv[1])"


def _tokenizer_problem(args, mode: str, run: Callable) -> str | None:
    """Why SGLang's serving benchmark could not load its tokenizer here, or None: the tokenizer it will load
    (``--tokenizer``; with servers given by URL also MODEL, else what the FP8 server's ``/model_info`` names, as
    the benchmark reads it) loaded by the benchmark's own ``sglang.benchmark.utils.get_tokenizer`` in one ``python
    -c`` run through ``run`` (``subprocess.run``) before any arm, so that a name this machine cannot resolve (a
    Hugging Face name offline, a folder without tokenizer files) stops the run before any GSM8K or load, not after.
    A launched server's MODEL is not loaded here: the server loads it itself."""
    name = args.tokenizer if mode == "launch" else _tokenizer(args)
    if name is None and mode == "urls":
        info = get_json(args.fp8_url.rstrip("/") + "/model_info", 30.0)
        name = info.get("tokenizer_path") or info.get("model_path")
    if not name:
        return None
    p = run([sys.executable, "-c", _TOKENIZER_CHECK, str(name)], capture_output=True, text=True)
    if p.returncode == 0:
        return None
    return (f"SGLang's serving benchmark cannot load the tokenizer {name} here "
            f"({client_error((p.stdout or '') + (p.stderr or ''))}); give --tokenizer, a folder with the "
            "checkpoint's tokenizer files")


def _plan(args, mode: str) -> dict:
    return {"mode": mode, "model": args.model, "server_flags": args.server_flags, "config": args.config,
            "fp8_url": args.fp8_url, "fp4_url": args.fp4_url, "tokenizer": _tokenizer(args), "input_lens": args.input_lens,
            "output_len": args.output_len, "concurrency": args.concurrency,
            "prompts": args.prompts or 4 * args.concurrency, "kv_limited_concurrency": args.kv_limited_concurrency,
            "gsm8k_data": os.path.abspath(args.gsm8k_data) if args.gsm8k_data else None,
            "gsm8k_questions": args.gsm8k_questions,
            "passkey_lengths": args.passkey_lengths if args.passkey_lengths is not None else [max(args.input_lens)],
            "passkey_depths": args.passkey_depths, "passkey_trials": args.passkey_trials}


def _write_json(path: str, obj) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)  # whole or absent: an interrupted write leaves no half result to resume from


def _read_json(path: str, what: str, then: str):
    """The JSON in ``path``; ValueError naming ``--out``, the file, ``what`` it should be and ``then`` (how to go
    on) when it is not readable JSON."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"--out: {path} is not {what} ({e}); {then}") from None


def finished_arms(out: str) -> list[str]:
    """The arms kept in the output folder ``out``: ``ORDER/ARM`` names (e.g. ``fp8-first/fp8``) whose
    ``result.json`` exists, in run order; empty for a folder without any (or no folder). Raises nothing."""
    return [f"{o}/{a}" for o, arms in ORDERS.items() for a in arms
            if os.path.exists(os.path.join(out, o, a, "result.json"))]


def _load_plan(out: str, plan: dict) -> dict:
    """The plan kept in ``out`` (with what was fixed while running, e.g. the KV-limited concurrency), or ``plan``
    written there; a kept plan without a finished arm is replaced (nothing to resume), with its passkey prompts.

    Raises:
        ValueError: naming ``--out``, when the folder holds finished arms run with other settings, a plan.json
            that is not this command's (never removed), or passkey prompts without a plan.
    """
    path, prompts = os.path.join(out, "plan.json"), os.path.join(out, "passkey_prompts.json")
    then = "use another --out, or delete it (the kept arms then count as run with these options)"
    if os.path.exists(path):
        kept = _read_json(path, "the plan of an A/B run", then)
        if not isinstance(kept, dict) or kept.get("mode") not in ("launch", "urls") or "input_lens" not in kept:
            raise ValueError(f"--out: {path} is not the plan of an A/B run (this command's plan.json); {then}")
        if not finished_arms(out):  # nothing to resume: this command's plan and prompts are replaced
            os.remove(path)
            if os.path.exists(prompts):
                os.remove(prompts)
    elif os.path.exists(prompts):  # prompts without a plan: not what this command left
        raise ValueError(f"--out: {prompts} is there without the run's plan.json, so it is not this command's; use "
                         "another --out, or delete it")
    if os.path.exists(path):
        fixed = {k: v for k, v in kept.items() if k not in ("kv_limited_auto",)}
        want = dict(plan, kv_limited_concurrency=plan["kv_limited_concurrency"] if plan["kv_limited_concurrency"]
                    is not None else fixed.get("kv_limited_concurrency"))
        differ = sorted(k for k in want if fixed.get(k) != want[k])
        if differ:
            raise ValueError(f"--out: {out} holds a run with other settings ({', '.join(differ)}); use another "
                             "--out, or the same options to finish that run")
        return kept
    _write_json(path, plan)
    return plan


def _bench_lines(path: str) -> list[dict]:
    lines = read_jsonl(path) if os.path.exists(path) else []
    for line in lines:
        line.pop("server_info", None)  # the whole server config, kept once per arm instead
    return lines


def _measure(base: str, arm_dir: str, plan: dict, *, with_quality: bool, out: str, progress, answer_value,
             run=subprocess.run) -> dict:
    """Quality (first order only) and speed against one running server; the arm's result (without ``kv``)."""
    info = get_json(base + "/server_info", 60.0)
    res = {"base_url": base, "commands": [],
           "server_info": {k: info.get(k) for k in ("max_total_num_tokens", "error") + _SAME_ON_BOTH},
           "gsm8k": None, "passkey": None, "bench": []}
    if with_quality and plan["gsm8k_data"]:
        progress("GSM8K")
        g = quality.run_gsm8k(base, plan["gsm8k_data"], plan["gsm8k_questions"], arm_dir, answer_value=answer_value,
                              run=run)
        res["commands"].append(g.pop("command"))
        res["gsm8k"] = g
    lengths = [n for n in plan["passkey_lengths"] if n > 0]
    if with_quality and lengths:
        progress("passkey")
        path = os.path.join(out, "passkey_prompts.json")
        if os.path.exists(path):  # the same prompts for every arm
            prompts = _read_json(path, "the passkey prompts of this run", "delete it to build them again")
        else:
            prompts = quality.passkey_prompts(lengths, plan["passkey_depths"], plan["passkey_trials"],
                                              quality.tokens_per_filler(base))
            _write_json(path, prompts)
        res["passkey"] = quality.run_passkey(base, prompts)
    bench_file = os.path.join(arm_dir, "bench.jsonl")
    if os.path.exists(bench_file):
        os.remove(bench_file)  # a partial file of an interrupted arm
    loads = [(il, plan["concurrency"], plan["prompts"]) for il in plan["input_lens"]]
    kvc = plan.get("kv_limited_concurrency")
    if kvc is None:
        pool = res["server_info"].get("max_total_num_tokens")
        if pool:
            # With DP attention SGLang reports one rank's pool, and every rank has one: its width is attn_dp_size
            # in SGLang 0.5.23, dp_size with enable_dp_attention before.
            si = res["server_info"]
            ranks = int(si.get("attn_dp_size") or 1)
            if ranks == 1 and si.get("enable_dp_attention"):
                ranks = int(si.get("dp_size") or 1)
            kvc = 2 * ranks * max(1, pool // (max(plan["input_lens"]) + plan["output_len"]))
            if kvc == plan["concurrency"]:  # one more, so that the two loads stay apart in the report
                kvc += 1
            plan["kv_limited_concurrency"] = kvc
            plan["kv_limited_auto"] = True
            _write_json(os.path.join(out, "plan.json"), plan)
    if kvc:
        loads.append((max(plan["input_lens"]), kvc, 2 * kvc))
    for il, conc, prompts in loads:
        progress(f"bench {il}x{conc}")
        # The first server started compiles kernels on first use, which would land in its first load's figures:
        # SGLang's own warm-up first, as many requests as the load runs at once, then a flush of the prefix cache
        # so that the measured requests reuse nothing the warm-up left.
        cmd = bench_serving_command(base, input_len=il, output_len=plan["output_len"], prompts=prompts,
                                    concurrency=conc, output_file=bench_file, tokenizer=plan.get("tokenizer"),
                                    warmup_requests=conc, flush_cache=True)
        res["commands"].append(cmd)
        p = run(cmd, capture_output=True, text=True)
        log = os.path.join(arm_dir, "bench_stdout.txt")
        with open(log, "a") as f:
            f.write(p.stdout + p.stderr)
        if p.returncode != 0:
            raise RuntimeError(f"bench_serving exited with {p.returncode}: {client_error(p.stdout + p.stderr)} "
                               f"(log: {log})")
    res["bench"] = _bench_lines(bench_file)
    return res


def _environment(mode: str) -> dict:
    import platform

    env = {"gpu": gpu_description(), "versions": versions(), "python": platform.python_version(),
           "host": platform.node()}
    if mode == "urls":
        env["where"] = "the machine that ran the command (the client); the servers may run elsewhere"
    return env


def _is_outcome(x) -> bool:
    return isinstance(x, int) and x in (0, 1)  # bools too


def _is_number(x) -> bool:
    return x is None or (isinstance(x, (int, float)) and not isinstance(x, bool))


#: The serving benchmark fields the report reads from each line: the paired ones and the shape's.
_BENCH_NUMBERS = tuple(key for key, _, _ in AB_FIELDS) + ("random_input_len", "random_output_len", "max_concurrency")


def read_result(path: str) -> dict:
    """A kept arm's result (``ORDER/ARM/result.json``, as ``run_arms`` writes it).

    Raises:
        ValueError: naming ``--out`` and the file, when it is not JSON, not an object, lacks a key of
            ``_RESULT_KEYS`` (or holds another type there), holds a GSM8K or passkey record without outcomes or
            with outcomes other than 0 and 1, benchmark lines that are not objects of numbers, or KV pool sizes
            that are not numbers.
    """
    then = "delete it to run that arm again"
    res = _read_json(path, "a finished arm's result", then)
    why = None
    if not isinstance(res, dict):
        why = f"a JSON {type(res).__name__}, not an object"
    else:
        bad = [k for k, t in _RESULT_KEYS.items() if not isinstance(res.get(k), t)]
        gsm8k, passkey = res.get("gsm8k"), res.get("passkey")
        if bad:
            why = "no " + ", ".join(bad)
        elif gsm8k is not None and not (isinstance(gsm8k, dict) and gsm8k.get("outcomes")):
            why = "a GSM8K record without outcomes"
        elif gsm8k is not None and not (isinstance(gsm8k["outcomes"], list)
                                        and all(_is_outcome(x) for x in gsm8k["outcomes"])):
            why = "GSM8K outcomes other than 0 and 1"
        elif passkey is not None and not (isinstance(passkey, list) and passkey):
            why = "a passkey record without prompts"
        elif passkey is not None and not all(isinstance(r, dict) and isinstance(r.get("length"), int)
                                             and _is_outcome(r.get("correct")) for r in passkey):
            why = "passkey records without an integer length and a 0 or 1 outcome"
        elif not all(isinstance(line, dict) and all(_is_number(line.get(k)) for k in _BENCH_NUMBERS)
                     for line in res["bench"]):
            why = "serving benchmark lines that are not objects of numbers"
        elif not all(_is_number(res["kv"].get(k)) for k in ("kv_cache_tokens", "max_total_num_tokens")):
            why = "KV pool sizes that are not numbers"
    if why:
        raise ValueError(f"--out: {path} is not a finished arm's result ({why}); {then}")
    return res


def _arms_environment(results: dict, mode: str) -> dict:
    """The environment the arms ran in (each kept result records its own), or this machine's, marked as such,
    when no arm recorded one; ``differs`` says when the arms ran in different environments."""
    envs = [r["environment"] for per in results.values() for r in per.values() if isinstance(r.get("environment"), dict)]
    if not envs:
        return dict(_environment(mode), note="this machine's (the kept arms did not record theirs)")
    env = dict(envs[0])
    if any((e.get("gpu"), e.get("versions")) != (env.get("gpu"), env.get("versions")) for e in envs):
        env["differs"] = "the arms ran in different environments (each arm's result.json holds its own)"
    return env


def run_arms(args, plan: dict, mode: str, out: str, *, answer_value=None, run=subprocess.run) -> dict:
    """Run (or resume) every arm of ``plan``; returns ``{order: {arm: result}}``, each result with the
    ``environment`` it ran in. ``answer_value`` scores GSM8K answers (``quality.gsm8k_outcomes``; needed only when
    the plan has GSM8K data).

    Raises:
        ValueError: a kept result that is not one (``read_result``).
        RuntimeError: a server that does not start, or an SGLang client that fails (that arm is not kept).
    """
    from tqdm import tqdm

    orders = args.orders
    arms = [(order, arm) for order in orders for arm in ORDERS[order]]
    results: dict[str, dict] = {o: {} for o in orders}
    with tqdm(total=len(arms), unit="arm", desc="A/B", file=sys.stderr) as bar:  # closed (its line ended) on errors
        for order, arm in arms:
            results[order][arm] = _run_arm(args, plan, mode, out, order, arm, bar, answer_value=answer_value, run=run)
            bar.update(1)
    return results


def _port_taken(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:``port`` (a launched server would not be the one
    answering there)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _run_arm(args, plan: dict, mode: str, out: str, order: str, arm: str, bar, *, answer_value, run) -> dict:
    """One arm of ``run_arms``: its kept result, or the arm run and its result kept."""
    arm_dir = os.path.join(out, order, arm)
    os.makedirs(arm_dir, exist_ok=True)
    path = os.path.join(arm_dir, "result.json")
    if os.path.exists(path):
        bar.set_postfix_str(f"{order}/{arm} kept from an earlier run")
        return read_result(path)
    t0 = time.time()

    def progress(step: str) -> None:
        bar.set_postfix_str(f"{order}/{arm}: {step}")

    with_quality = order == args.orders[0]
    if mode == "urls":
        res = _measure(args.fp8_url if arm == "fp8" else args.fp4_url, arm_dir, plan, with_quality=with_quality,
                       out=out, progress=progress, answer_value=answer_value, run=run)
        res["kv"] = {"max_total_num_tokens": res["server_info"].get("max_total_num_tokens")}
    else:
        flags = list(args.server_flags) + (["--config", os.path.abspath(args.config)] if args.config else [])
        if arm == "fp8" and _config_enables_fp4(_config_paths(args)):
            flags.append("--no-enable-fp4-indexer")  # the file turns FP4 on; the command line overrides it
        port = args.port or DEFAULT_PORT
        cmd = launch_command(args.model, port, flags, fp4=arm == "fp4")
        log = os.path.join(arm_dir, "server.log")
        progress("launching the server")
        if _port_taken(port):
            raise RuntimeError(f"--port: something already answers on 127.0.0.1:{port} (a server left from an "
                               "interrupted run?): stop it or give another --port; nothing was measured")
        with launched_server(cmd, port, log, args.ready_timeout) as base:
            # The plugin logs "FP4 indexer active" while the model loads, before /health answers: the FP4 server
            # must have the line (else the plugin fell back, its warning says why) and the FP8 server must not.
            with open(log, errors="replace") as f:
                active = kv_pool_tokens(f.read())["fp4_indexer_active"] is not None
            if active != (arm == "fp4"):
                why = ("has no \"FP4 indexer active\" line: the plugin kept FP8 (its warning in the log says why)"
                       if arm == "fp4" else "has an \"FP4 indexer active\" line: FP4 is on for it (is "
                       "SGLANG_ENABLE_FP4_INDEXER set in this environment?)")
                raise RuntimeError(f"the {arm.upper()} server's log {why}; nothing was measured (log: {log})")
            res = _measure(base, arm_dir, plan, with_quality=with_quality, out=out, progress=progress,
                           answer_value=answer_value, run=run)
        res["commands"].insert(0, cmd)
        with open(log, errors="replace") as f:
            text = f.read()
        res["kv"] = dict(kv_pool_tokens(text), running_peak=peak_running_requests(text),
                         running_ranks=len(running_peaks(text)) or None)
    res.update(order=order, arm=arm, wall_s=time.time() - t0, environment=_environment(mode))
    _write_json(path, res)
    return res


def main(args: argparse.Namespace, read_sglang: Callable | None = None, answer_value: Callable | None = None, *,
         run=subprocess.run, gpus: Callable[[], dict] = gpu_description) -> int:
    """Run the A/B and print its verdict; 0 when every arm finished and the report found no reason to withhold a
    verdict (``report._problems``), 1 then, or when nothing can run (FP4 refused, no GPU
    to launch the servers on, a given server that does not answer, SGLang's benchmark or GSM8K client not importable
    by this Python), with one line saying why.

    ``read_sglang`` is the adapter's SGLang fact reader that ``check`` uses, ``answer_value`` its GSM8K answer
    reader (``cli`` passes both); ``run`` runs the SGLang client subprocesses (``subprocess.run``) and ``gpus``
    lists this machine's GPUs (``serving.gpu_description``): parameters for tests.

    Raises:
        ValueError: bad or conflicting options (named), a load longer than the model's context, an output folder
            holding another run's settings, or a kept file that is not what the run wrote.
        RuntimeError: a server fails to start, or an SGLang client exits non-zero (the arm is not kept).
    """
    mode, config = _validate(args, answer_value)
    flags = list(args.server_flags)
    to_run = {f"{o}/{a}" for o in args.orders for a in ORDERS[o]} - set(finished_arms(args.out))
    if mode == "urls" and args.model is None and not (config.get("model-path") or config.get("model_path")):
        print("sglang-fp4-indexer ab: warning: no MODEL given, so the plugin's check of the model and flags is not "
              "run: give the model path and, after --, the flags the servers run with", file=sys.stderr)
    refusal, check_text, layout = _refusal(args, flags, config, read_sglang)
    if refusal is not None:
        refusal = f"FP4 would not serve this deployment ({refusal})"
    elif to_run:  # servers needed: on this machine's GPUs, or answering at the given URLs; and SGLang's clients
        refusal = ((_no_gpu(flags, gpus, config, layout) if mode == "launch" else _servers_problem(args))
                   or _clients_problem(_CLIENTS if args.gsm8k_data is not None else _CLIENTS[:1], run)
                   or _tokenizer_problem(args, mode, run))
    if refusal is not None:
        print(f"sglang-fp4-indexer ab: not run: {refusal}", file=sys.stderr)
        return 1
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--out: cannot create {args.out} ({e.strerror})") from None
    plan = _load_plan(args.out, _plan(args, mode))
    if plan["gsm8k_data"] and answer_value is None:
        raise ValueError("--gsm8k-data: scoring GSM8K needs SGLang's answer reader (run through sglang-fp4-indexer)")
    results = run_arms(args, plan, mode, args.out, answer_value=answer_value, run=run)
    dummy = dummy_weights(flags, config) or any(
        (r.get("server_info") or {}).get("load_format") == "dummy" for per in results.values() for r in per.values())
    meta = {"mode": mode, "plan": plan, "check": check_text, "dummy_weights": dummy,
            "environment": _arms_environment(results, mode)}
    report = build_report(results, meta=meta)
    _write_json(os.path.join(args.out, "report.json"), report)
    plot_report(report, os.path.join(args.out, "report.png"))
    print(report_text(report))
    print(f"report: {os.path.join(args.out, 'report.json')}, {os.path.join(args.out, 'report.png')}")
    return 0 if not report["missing"] and not report["problems"] else 1
