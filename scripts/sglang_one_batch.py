"""The plugin inside SGLang's own model runner: SGLang's one-batch path on a tiny DeepSeek-V3.2.

SGLang's ``sglang.benchmark.one_batch`` builds a real ``ModelRunner`` (pool
sizing through SGLang's configurator, the DSA attention backend, decode CUDA
graphs), a real ``ScheduleBatch`` and ``ForwardBatch`` in one process. It does
not load plugins: this script calls SGLang's ``load_plugins()`` first, exactly
as SGLang's server processes do, then lets ``one_batch.main`` resolve the
server arguments and hands it this script's work function in place of its
latency test. The model is a tiny ``DeepseekV32ForCausalLM`` with dummy
weights (``make-model``) whose indexer has DeepSeek-V3.2's geometry (64 index
heads x 128, top-2048), so every indexer kernel runs at its serving shape.

Subcommands:

* ``make-model DIR [--size tiny|tiny-interleaved|v32-layers|v32-rank] [--layers N] [--ep N]``: the model's ``config.json`` and a
  word-level tokenizer (``tokenizers``) of its vocabulary; ``v32-layers`` has
  DeepSeek-V3.2's per-layer sizes on three layers and its MTP layer (``V32_LAYERS_CONFIG``).
* ``run --model DIR --out FILE.pt [--fp4] [--eager] [SGLang server flags]``:
  prefill of seeded prompts (3K-7K tokens, through ``Indexer._get_topk_ragged``)
  then decode steps with seeded input tokens (through ``Indexer._get_topk_paged``,
  replayed from SGLang's decode CUDA graphs unless ``--eager``) at batch sizes
  1, 2 and 4. SGLang's ``--enable-return-indexer-topk`` capturer records every
  layer's top-k, from graph replays too. Every top-k row is checked (in range,
  distinct, ``min(len, 2048)`` entries); with ``--fp4 --eager`` the first decode
  step's index queries, weights, page table and FP4 cache bytes are recorded at
  the paged seam and the Hopper scorer's logits are compared there with the fp64
  oracle (``reference.logits_from_keys`` on the decoded keys) within ``sm90.logit_error_bound``.
* ``engine --model DIR --out FILE.json [--fp4] [--speculative eagle|none]``:
  ``sglang.Engine`` with MTP speculative decoding (EAGLE on the model's own
  next-n layer), so target verify and draft steps run through the plugin, or
  with plain decode (``none``); the top-k of every token is returned by SGLang
  (``return_indexer_topk``) and checked (distinct, ``min(t + 1, 2048)`` entries).
* ``server --model DIR --out FILE.json [--fp8]``: ``python -m sglang.launch_server``
  with ``--enable-fp4-indexer`` and one ``/generate`` request on localhost.
* ``trace-check --fp8 E.json --fp4 E.json``: the MTP runs' top-k checks from the
  test-only trace plugin (``scripts/topk_trace``), per mode, and FP4 against FP8.
* ``compare [FP8.pt FP4.pt FP4_EAGER.pt] [--engine FP8.json FP4.json] [--server S.json] [--json OUT]``:
  the checks as a table (printed last).

``scripts/sglang_gpu_check.sh`` runs the whole sequence on a GPU machine
(docs/sglang-seams.md, "Inside SGLang's model runner").
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "topk_trace"))
from fp4_indexer_topk_trace import read_trace, slot_positions  # noqa: E402 (the test-only trace plugin's reader)
# Shared with sglang-fp4-indexer ab (the package's serving helpers import no SGLang); pd_gpu.py takes them from here.
from sglang_fp4_indexer.serving import launched_server, post_json, versions  # noqa: E402,F401

#: Prompt lengths (tokens) of the seeded batch; batch size ``b`` takes the first ``b``.
PROMPT_LENS = (5121, 3077, 6899, 4165)
BATCH_SIZES = (1, 2, 4)
DECODE_STEPS = 6
TOPK = 2048
VOCAB = 16384

TINY_CONFIG = {
    "architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32",
    "vocab_size": VOCAB, "hidden_size": 1024, "intermediate_size": 2048, "moe_intermediate_size": 256,
    "num_hidden_layers": 2, "first_k_dense_replace": 2, "moe_layer_freq": 1, "num_nextn_predict_layers": 1,
    "num_attention_heads": 16, "num_key_value_heads": 16, "q_lora_rank": 512, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "index_n_heads": 64, "index_head_dim": 128, "index_topk": TOPK,
    "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
    "norm_topk_prob": True, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
    "hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 163840,
    "rope_theta": 10000,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 1,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True, "initializer_range": 0.02,
}

#: DeepSeek-V3.2's per-layer sizes (its Hugging Face config.json) on a few layers: hidden 7168, 128 attention
#: heads (one DP-attention rank's view: attention is not split by TP there), q / kv LoRA ranks 1536 / 512,
#: nope / rope / v head dims 128 / 64 / 128, index 64 heads x 128, top-2048, FP8 block-quantized weights
#: (128 x 128 blocks, e4m3, UE8M0 scales, as the checkpoint stores them), the real vocabulary, one dense layer
#: (intermediate 18432) and two MoE layers holding one EP8 rank's share of the 256 routed experts (32 of
#: intermediate 2048, top-8, one shared expert), and the MTP (next-n) layer. The 61-layer model differs in its
#: layer count only: every per-layer kernel (indexer, sparse MLA, GEMMs, MoE) runs at its serving shape.
V32_LAYERS_CONFIG = dict(
    TINY_CONFIG, vocab_size=129280, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
    num_hidden_layers=3, first_k_dense_replace=1, num_attention_heads=128, num_key_value_heads=128,
    q_lora_rank=1536, kv_lora_rank=512, n_routed_experts=32, n_shared_experts=1, num_experts_per_tok=8,
    quantization_config={"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                         "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
)
#: The tiny model with interleaved indexer RoPE (GLM-5.x's ``indexer_rope_interleave: true``): SGLang then runs its
#: fused indexer kernels, in which the plugin applies the Hadamard rotation to index queries and keys.
TINY_INTERLEAVED_CONFIG = dict(TINY_CONFIG, indexer_rope_interleave=True)
#: One GPU of a DeepSeek-V3.2 DP-attention + EP8 deployment at full depth: the per-layer sizes of
#: ``V32_LAYERS_CONFIG`` on V3.2's 61 layers, the first 3 dense as in the checkpoint, 58 MoE layers of one EP8
#: rank's 32 routed experts, and the MTP layer. ``make-model --layers N`` keeps the first N (the 3 dense first).
V32_RANK_CONFIG = dict(V32_LAYERS_CONFIG, num_hidden_layers=61, first_k_dense_replace=3)
#: GLM-5's per-layer sizes (the packaged ``glm-5`` config, sglang_fp4_indexer/data/models: hidden 6144, 64 attention
#: heads, q / kv LoRA ranks 2048 / 512, nope / rope / v head dims 192 / 64 / 256, index 32 heads x 128 with interleaved
#: indexer RoPE, top-2048, vocabulary 154 880, dense intermediate 12 288, expert intermediate 2048) on 3 layers of
#: SGLang's ``GlmMoeDsaForCausalLM``, as ``V32_LAYERS_CONFIG`` lays them out: one dense layer, two MoE layers holding one
#: EP8 rank's 32 of the 256 routed experts (top-8, one shared), the MTP layer, FP8 block-quantized weights. GLM-5's
#: repository holds bf16 weights; FP8 here keeps the GEMMs on the path a V3.2 rank runs, so that the layers differ
#: from ``v32-layers`` in their sizes and in the indexer path (32 heads, SGLang's fused indexer kernels for FP8, the
#: plugin's rotation and SGLang's unfused query path for FP4). The fields the packaged config leaves out (routing,
#: RoPE base and YaRN settings, norms) are the V3.2 sizes' own, the YaRN factor stretched to 49.5 so that its 4096
#: original positions cover GLM-5's 202 752; they change no kernel's shape.
GLM5_LAYERS_CONFIG = dict(
    V32_LAYERS_CONFIG, architectures=["GlmMoeDsaForCausalLM"], model_type="glm_moe_dsa", vocab_size=154880,
    hidden_size=6144, intermediate_size=12288, moe_intermediate_size=2048, num_attention_heads=64,
    num_key_value_heads=64, q_lora_rank=2048, kv_lora_rank=512, qk_nope_head_dim=192, qk_rope_head_dim=64,
    v_head_dim=256, index_n_heads=32, index_head_dim=128, indexer_rope_interleave=True,
    max_position_embeddings=202752, rope_scaling=dict(V32_LAYERS_CONFIG["rope_scaling"], factor=49.5),
)
#: The full depth of the model each size stands for (decoder layers, the MTP layer not counted): ``make-model
#: --layers`` goes up to it, and the profile step's timeline projects a cut model to it.
FULL_DEPTH = {"tiny": 61, "tiny-interleaved": 61, "v32-layers": 61, "v32-rank": 61, "glm5-layers": 78}
MODEL_SIZES = {"tiny": TINY_CONFIG, "tiny-interleaved": TINY_INTERLEAVED_CONFIG, "v32-layers": V32_LAYERS_CONFIG,
               "v32-rank": V32_RANK_CONFIG, "glm5-layers": GLM5_LAYERS_CONFIG}

#: SGLang server flags every stage uses (dummy weights, FP8 MLA KV -> FlashMLA's sparse FP8 decode on SM90).
COMMON_SERVER_ARGS = (
    "--load-format", "dummy", "--kv-cache-dtype", "fp8_e4m3", "--mem-fraction-static", "0.006", "--disable-prefill-cuda-graph",
    "--chunked-prefill-size", "32768", "--max-running-requests", "8", "--disable-radix-cache",
    "--enable-return-indexer-topk", "--random-seed", "0", "--log-level", "info",
)


#: DeepSeek-V3.2's routed experts (all ranks together); ``--ep N`` gives a rank 256 / N of them.
V32_ROUTED_EXPERTS = 256


def make_model(directory: str, size: str = "tiny", layers: int | None = None, ep: int | None = None) -> None:
    """Write a DSA model's ``config.json`` (``MODEL_SIZES[size]``: DeepSeek-V3.2's architecture, or GLM-5's for
    ``glm5-layers``) and a word-level tokenizer into ``directory``.

    The tokenizer maps ``t<i>`` to id ``i`` (ids 0 and 1 are ``<bos>`` / ``<eos>``) and puts ``<bos>`` before every
    text, as DeepSeek-V3.2's own tokenizer does (``add_bos_token``): an empty text is one token, as a deployer's is
    (SGLang 0.5.23's scheduler fails on a prompt of zero tokens, FP8 and FP4 alike). The runs feed token ids
    directly; the tokenizer serves SGLang's loader and the text prompts of ``ab`` and the soak's bad inputs.
    ``layers`` (decoder layers, the MTP layer not counted) replaces the size's layer count; the dense layers
    (``first_k_dense_replace``) stay first, as many as the size has, at most ``layers``.
    ``ep`` (the v32 sizes only) is the expert-parallel degree of the deployment the rank belongs to: its MoE layers
    hold ``256 / ep`` of V3.2's routed experts (EP8: 32, the sizes' own; EP16: 16, the smallest H100 deployment
    that holds V3.2's FP8 weights, two nodes of 8) plus the shared one, still top-8: a rank's expert work per
    step is its own batch's 8 routes per token whatever ``ep`` is (all-to-all brings it the other ranks' tokens
    for its experts), so only the expert weights it holds and reads change.

    Raises:
        ValueError: ``size`` is not a key of ``MODEL_SIZES``, ``layers`` is given and not 1..its full depth
            (61, GLM-5's 78 for ``glm5-layers``), or ``ep`` is given
            for a size that is not a v32 size or is not one of 8, 16, 32.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    if size not in MODEL_SIZES:
        raise ValueError(f"size: expected one of {sorted(MODEL_SIZES)}, got {size!r}")
    config = dict(MODEL_SIZES[size])
    if layers is not None:
        full = FULL_DEPTH[size]
        if not 1 <= layers <= full:
            raise ValueError(f"layers: expected 1..{full} decoder layers (the model of size {size!r} has {full}), "
                             f"got {layers}")
        config.update(num_hidden_layers=layers, first_k_dense_replace=min(config["first_k_dense_replace"], layers))
    if ep is not None:
        if not size.startswith("v32-"):
            raise ValueError(f"ep: only the v32 sizes hold V3.2's experts, got size {size!r}")
        if ep not in (8, 16, 32):
            raise ValueError(f"ep: expected 8, 16 or 32 (a rank keeps at least top-8 experts), got {ep}")
        config.update(n_routed_experts=V32_ROUTED_EXPERTS // ep)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    vocab = {"<bos>": 0, "<eos>": 1, "<unk>": 2}
    vocab.update({f"t{i}": i for i in range(3, config["vocab_size"])})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", 0)])
    tok.save(os.path.join(directory, "tokenizer.json"))
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
                   "unk_token": "<unk>", "model_max_length": 163840, "add_bos_token": True}, f)
    with open(os.path.join(directory, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 0, "eos_token_id": 1}, f)
    print(f"{size} {config['architectures'][0]} ({config['num_hidden_layers']} layers) written to {directory}")


def seeded_prompts(seed: int = 0) -> list[list[int]]:
    """The seeded prompts (token ids in [3, VOCAB)), lengths ``PROMPT_LENS``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [rng.integers(3, VOCAB, size=n).tolist() for n in PROMPT_LENS]


def seeded_decode_tokens(bs: int, steps: int, seed: int = 1):
    """Decode input tokens ``[steps, bs]`` (the same for every run, so FP4 and FP8 see the same batch)."""
    import numpy as np

    return np.random.default_rng(seed + bs).integers(3, VOCAB, size=(steps, bs))


class _LogLines(logging.Handler):
    """Keeps the plugin's log lines (``sglang_fp4_indexer.*`` loggers)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(f"{record.levelname}: {record.getMessage()}")


def check_topk_rows(topk, lens, slots):
    """Validity of one request's top-k rows: in range, distinct, ``min(len, TOPK)`` entries.

    Args:
        topk: int32 ``[rows, TOPK]`` (``-1`` = empty) as SGLang's capturer holds it.
        lens: int ``[rows]`` visible key count of each row.
        slots: int64 ``[max(lens)]`` the request's KV slots by position (SGLang's
            ``req_to_token`` row): after SGLang's page-table transform the top-k
            holds physical slots; a row counts as in range when every entry is the
            slot of a position ``< len`` (or, failing that, is itself a position ``< len``).

    Returns:
        dict: rows, failures by kind (count, duplicate, out_of_range), and how many
        rows were read as slots or as positions.
    """
    import torch

    topk = topk.long()
    lens = lens.to(topk.device).long()
    valid = topk >= 0
    count_bad = int((valid.sum(1) != torch.clamp(lens, max=TOPK)).sum())
    srt = torch.sort(torch.where(valid, topk, torch.full_like(topk, -1)), dim=1).values
    dup = ((srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] >= 0)).any(1)
    # Only the positions a row may see: the row's entries past them are stale and may repeat one of its slots
    # (as ``slot_positions`` reads them), which would map that slot to a later position.
    slots = slots[: int(lens.max())].to(topk.device).long() if lens.numel() else slots[:0].long()
    size = int(slots.max()) + 2 if slots.numel() else 1
    none = slots.numel()  # no position: the largest, so that the smallest position of a repeated slot wins
    inv = torch.full((size,), none, dtype=torch.long, device=topk.device)
    inv.scatter_reduce_(0, slots, torch.arange(none, device=topk.device), reduce="amin")
    inv[inv == none] = -1
    safe = torch.clamp(topk, 0, inv.numel() - 1)
    pos = torch.where(valid & (topk < inv.numel()), inv[safe], torch.full_like(topk, -1))
    as_slot = (~valid | ((pos >= 0) & (pos < lens[:, None]))).all(1)
    as_pos = (~valid | (topk < lens[:, None])).all(1)
    return {"rows": int(topk.shape[0]), "count": count_bad, "duplicate": int(dup.sum()),
            "out_of_range": int((~as_slot & ~as_pos).sum()), "slot": int(as_slot.sum()),
            "position": int((~as_slot & as_pos).sum())}


def _record_paged_seam(state):
    """Wrap SGLang's (already hooked) ``Indexer._get_topk_paged``: record the first eager call per batch.

    Not a hook of the plugin: an attribute wrapper on SGLang's class, set after
    ``load_plugins()``, that calls the installed method unchanged and copies its
    inputs (index queries, weights, page table, lengths, the layer's cache) and
    its result while ``state["record"]`` is set and no CUDA graph is capturing.
    """
    from sglang.srt.layers.attention.dsa import dsa_indexer
    from sglang.srt.model_executor.runner_utils.capture_mode import get_is_capture_mode

    installed = dsa_indexer.Indexer._get_topk_paged

    def recording(self, forward_batch, layer_id, q_fp8, weights, metadata):
        out = installed(self, forward_batch, layer_id, q_fp8, weights, metadata)
        if state.get("record") and not get_is_capture_mode() and forward_batch.forward_mode.is_decode():
            from sglang.srt.model_executor.forward_context import get_token_to_kv_pool

            pool = get_token_to_kv_pool()
            rows = int(sum(metadata.get_dsa_extend_len_cpu()))
            state["calls"].append({
                "layer": int(layer_id),
                "q": q_fp8[:rows].clone(),
                "weights": weights.reshape(weights.shape[0], -1)[:rows].float().clone(),
                "block_table": metadata.get_page_table_64()[:rows].to("cpu").clone(),
                "lens": metadata.get_seqlens_int32()[:rows].to("cpu").clone(),
                "cache": pool.get_index_k_with_scale_buffer(layer_id=layer_id).clone(),
                "topk": out[:rows].clone(),
                "page_size": int(getattr(pool, "index_page_size", 64)),
            })
        return out

    dsa_indexer.Indexer._get_topk_paged = recording


def _oracle_check(calls):
    """Hopper scorer's logits at the recorded seam inputs against the fp64 oracle and the kernel's bound."""
    import torch

    from sglang_fp4_indexer import reference
    from sglang_fp4_indexer.ops import sm90
    from sglang_fp4_indexer.ops.paged_logits import paged_logits, resolved_impl

    results = []
    for c in calls:
        q, w, cache = c["q"], c["weights"], c["cache"]
        bt = c["block_table"].to(q.device, torch.int32)
        lens = c["lens"].to(q.device, torch.int32)
        page = c["page_size"]
        width = bt.shape[1] * page
        impl = resolved_impl(q, cache, 1)
        got = paged_logits(q, w, cache, bt, lens, width=width, page_size=page)
        worst = 0.0
        topk_agree = []
        for r in range(q.shape[0]):
            n = int(lens[r])
            slots = reference.paged_slots(bt[r].cpu(), n, page)
            keys = reference.dequantize_index_k(*reference.read_index_k(cache.cpu(), slots, page)).double()
            ref = reference.logits_from_keys(q[r].cpu(), w[r].cpu(), keys)  # fp64, as paged_logits_reference
            s = keys @ q[r].cpu().double().t()  # [n, H] exact head scores
            absw = w[r].cpu().double().abs()
            term = (keys.abs() @ q[r].cpu().double().abs().t()) @ absw
            relu_term = torch.relu(s) @ absw
            bound = sm90.logit_error_bound(term, relu_term)
            err = (got[r, :n].cpu().double() - ref).abs()
            worst = max(worst, float((err / (bound + 1e-30)).max()))
            # the returned top-k (physical slots) against the top-k of the kernel's logits (same slots)
            k = min(n, TOPK)
            mine = set(slots[torch.topk(got[r, :n].cpu(), k).indices].tolist())
            theirs = c["topk"][r]
            theirs = set(theirs[theirs >= 0].cpu().long().tolist())
            topk_agree.append(len(mine & theirs) / max(k, 1))
        results.append({"layer": c["layer"], "rows": int(q.shape[0]), "impl": impl,
                        "max_error_over_bound": worst, "topk_agreement_min": min(topk_agree)})
    return results


def _work(opts, state):
    """The work function ``one_batch.main`` runs in place of its latency test (same arguments)."""

    def work(server_args, port_args, bench_args, gpu_id, tp_rank):
        import numpy as np
        import torch
        from sglang.benchmark import one_batch as ob
        from sglang.srt.runtime_context import SpawnRanks, publish, spawn_world_rank
        from sglang.srt.state_capturer.indexer_topk import get_global_indexer_capturer
        from sglang.srt.utils import configure_logger

        publish(server_args, role="scheduler",
                ranks=SpawnRanks(world_rank=spawn_world_rank(server_args, tp_rank=tp_rank, pp_rank=0), gpu_id=gpu_id))
        ob._init_process_global_configs()
        configure_logger(server_args, prefix=f" TP{tp_rank}")
        t0 = time.time()
        runner, _tokenizer = ob.load_model(server_args, port_args, gpu_id, tp_rank)
        state["load_s"] = time.time() - t0
        mr = runner.torch_runner
        pool = mr.token_to_kv_pool
        state["pool"] = {
            "class": type(pool).__name__,
            "index_cache": type(getattr(pool, "index_key_cache", None)).__name__,
            "index_bytes_per_token_layer": _index_bytes_per_token(pool),
            "max_total_num_tokens": int(mr.max_total_num_tokens),
            "graphs": not opts.eager,
        }
        cap = get_global_indexer_capturer()
        if cap is None:
            raise RuntimeError("SGLang created no indexer top-k capturer: --enable-return-indexer-topk missing?")
        prompts = seeded_prompts()
        state["batches"] = []
        for bs in BATCH_SIZES:
            runner.clear()
            reqs = ob.prepare_synthetic_inputs_for_latency_test(bs, 0, [list(p) for p in prompts[:bs]])
            torch.cuda.synchronize()
            _, _, batch = runner.extend(reqs)
            torch.cuda.synchronize()
            tokens = sum(len(p) for p in prompts[:bs])
            prefill = cap.device_cache.buffer[:tokens].clone()  # [tokens, layers, TOPK]
            req_rows = mr.req_to_token_pool.req_to_token
            rec = {"bs": bs, "prompt_lens": [len(p) for p in prompts[:bs]], "prefill_checks": [], "decode": [],
                   "decode_checks": []}
            # prefill rows: token j of request i sees j + 1 keys
            offs = 0
            for i, req in enumerate(batch.reqs):
                n = len(prompts[i])
                slots = req_rows[req.kv.req_pool_idx, :n].long()
                lens = torch.arange(1, n + 1, device=slots.device)
                for layer in range(prefill.shape[1]):
                    rec["prefill_checks"].append(check_topk_rows(prefill[offs:offs + n, layer], lens, slots))
                offs += n
            rec["prefill_tail"] = [prefill[o - 64:o].cpu() for o in np.cumsum(rec["prompt_lens"]).tolist()]
            feed = seeded_decode_tokens(bs, DECODE_STEPS)
            for step in range(DECODE_STEPS):
                state["record"] = opts.fp4 and opts.eager and step == 0
                ids = torch.tensor(feed[step], dtype=torch.int64, device="cuda")
                runner.decode(ids, batch)
                torch.cuda.synchronize()
                state["record"] = False
                got = cap.device_cache.buffer[:bs].clone()  # [bs, layers, TOPK]
                rec["decode"].append(got.cpu())
                for i, r in enumerate(batch.reqs):
                    n = len(prompts[i]) + step + 1
                    slots = req_rows[r.kv.req_pool_idx, :n].long()
                    lens = torch.tensor([n], device=slots.device)
                    for layer in range(got.shape[1]):
                        rec["decode_checks"].append(check_topk_rows(got[i:i + 1, layer], lens, slots))
            state["batches"].append(rec)
        if state["calls"]:
            state["oracle"] = _oracle_check(state["calls"])
        state["calls"] = []

    return work


def _index_bytes_per_token(pool) -> int | None:
    """Index-cache bytes per token per layer of SGLang's pool (either format)."""
    try:
        buf = pool.get_index_k_with_scale_buffer(layer_id=pool.start_layer if hasattr(pool, "start_layer") else 0)
    except Exception:  # noqa: BLE001 - a pool without an index cache
        return None
    page = int(getattr(pool, "index_page_size", getattr(pool, "page_size", 64)))
    return int(buf[0].numel() * buf.element_size() // page)


def run(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="sglang_one_batch.py run")
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--fp4", action="store_true", help="add --enable-fp4-indexer")
    p.add_argument("--eager", action="store_true", help="--disable-cuda-graph, record the paged seam for the oracle")
    opts, extra = p.parse_known_args(argv)

    import torch
    from sglang.srt.plugins import load_plugins

    handler = _LogLines()
    logging.getLogger("sglang_fp4_indexer").addHandler(handler)
    logging.getLogger("sglang_fp4_indexer").setLevel(logging.INFO)
    load_plugins()  # SGLang's own loader: entry point group sglang.srt.plugins
    from sglang.benchmark import one_batch as ob
    from sglang.srt.server_args import ServerArgs

    state = {"calls": [], "record": False, "fp4_requested": opts.fp4}
    _record_paged_seam(state)
    server_argv = ["--model-path", opts.model, *COMMON_SERVER_ARGS,
                   *extra]
    if opts.fp4:
        server_argv.append("--enable-fp4-indexer")
    if opts.eager:
        server_argv.append("--disable-cuda-graph")
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    ob.BenchArgs.add_cli_args(parser)
    args = parser.parse_args(server_argv + ["--batch-size", *map(str, BATCH_SIZES)])
    server_args = ServerArgs.from_cli_args(args)
    bench_args = ob.BenchArgs.from_cli_args(args)
    ob.latency_test = _work(opts, state)  # one_batch.main resolves the arguments, then runs this
    t0 = time.time()
    ob.main(server_args, bench_args)
    state["wall_s"] = time.time() - t0
    state["plugin_log"] = handler.lines
    state["versions"] = versions()
    state.pop("calls", None)
    torch.save(state, opts.out)
    print(f"saved {opts.out}: pool {state['pool']}; plugin log: {handler.lines}")


def engine(argv: list[str]) -> None:
    """``sglang.Engine`` with MTP (EAGLE on the next-n layer): target verify and draft steps through the plugin."""
    p = argparse.ArgumentParser(prog="sglang_one_batch.py engine")
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--fp4", action="store_true")
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--max-total-tokens", type=int, default=None,
                   help="SGLang's --max-total-tokens: a smaller KV pool, and with it a smaller indexer top-k host "
                        "cache (pool tokens x layers x 2048 int32, pinned with cudaHostRegister)")
    p.add_argument("--mem-fraction-static", type=float, default=0.006)
    p.add_argument("--speculative", choices=("eagle", "none"), default="eagle",
                   help="eagle: MTP on the model's next-n layer (target verify at next_n = --draft-tokens); "
                        "none: plain decode, to tell an EAGLE start-up failure from an Engine one")
    p.add_argument("--spec-steps", type=int, default=1, help="SGLang's --speculative-num-steps (EAGLE)")
    p.add_argument("--draft-tokens", type=int, default=2, help="SGLang's --speculative-num-draft-tokens (EAGLE)")
    p.add_argument("--trace", metavar="DIR", default=None,
                   help="read the top-k through the test-only plugin scripts/topk_trace (every call of target "
                        "verify, draft decode and draft extend, CUDA-graph replays included) into DIR instead of "
                        "SGLang's --enable-return-indexer-topk capturer")
    opts = p.parse_args(argv)
    if opts.trace:
        os.environ["FP4_INDEXER_TOPK_TRACE_DIR"] = opts.trace  # inherited by SGLang's scheduler process
    import sglang

    kwargs = dict(
        model_path=opts.model, load_format="dummy", kv_cache_dtype="fp8_e4m3", mem_fraction_static=opts.mem_fraction_static,
        disable_prefill_cuda_graph=True,
        disable_radix_cache=True, enable_return_indexer_topk=not opts.trace, random_seed=0, max_running_requests=8,
        cuda_graph_max_bs_decode=4, log_level="info",
    )
    if opts.speculative == "eagle":
        kwargs.update(speculative_algorithm="EAGLE", speculative_num_steps=opts.spec_steps, speculative_eagle_topk=1,
                      speculative_num_draft_tokens=opts.draft_tokens)
    if opts.fp4:
        kwargs["enable_fp4_indexer"] = True
    if opts.max_total_tokens is not None:
        kwargs["max_total_tokens"] = opts.max_total_tokens
    t0 = time.time()
    eng = sglang.Engine(**kwargs)
    prompts = seeded_prompts()[:2]
    # Engine.generate() does not pass return_indexer_topk on (SGLang 0.5.23): the request goes to the
    # Engine's tokenizer manager as Engine.generate() sends it, with the flag set.
    from sglang.srt.managers.io_struct import GenerateReqInput

    obj = GenerateReqInput(input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": opts.new_tokens,
                                                               "ignore_eos": True}, return_indexer_topk=not opts.trace)
    outs = eng.loop.run_until_complete(eng.tokenizer_manager.generate_request(obj, None).__anext__())
    res = {"fp4": opts.fp4, "speculative": opts.speculative, "max_total_tokens": opts.max_total_tokens,
           "spec_steps": opts.spec_steps, "draft_tokens": opts.draft_tokens, "trace": opts.trace,
           "wall_s": time.time() - t0, "requests": []}
    from sglang.srt.state_capturer.indexer_topk import extract_indexer_topk_from_meta_info

    for prompt, o in zip(prompts, outs):
        meta = o.get("meta_info", {})
        item = {"prompt_len": len(prompt), "output_ids": o.get("output_ids"),
                "spec_verify_ct": meta.get("spec_verify_ct"), "completion_tokens": meta.get("completion_tokens")}
        if meta.get("indexer_topk") is not None:
            flat = extract_indexer_topk_from_meta_info(o)
            item["indexer_topk"] = flat.tolist()
        res["requests"].append(item)
    eng.shutdown()
    with open(opts.out, "w") as f:
        json.dump(res, f)
    print(f"saved {opts.out}: {[(r['prompt_len'], r['completion_tokens'], r['spec_verify_ct']) for r in res['requests']]}")


def server(argv: list[str]) -> None:
    """``python -m sglang.launch_server --enable-fp4-indexer`` on the tiny model, one ``/generate`` on localhost."""
    import urllib.request

    p = argparse.ArgumentParser(prog="sglang_one_batch.py server")
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--port", type=int, default=30731)
    p.add_argument("--ready-timeout", type=float, default=450.0,
                   help="seconds to wait for /health (a fresh machine compiles JIT kernels first)")
    p.add_argument("--fp8", action="store_true", help="leave out --enable-fp4-indexer (SGLang's own FP8 indexer)")
    opts = p.parse_args(argv)
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", opts.model, "--host", "127.0.0.1",
           "--port", str(opts.port), "--load-format", "dummy", "--kv-cache-dtype", "fp8_e4m3",
           "--mem-fraction-static", "0.006", "--disable-prefill-cuda-graph", "--max-running-requests", "8", "--cuda-graph-max-bs-decode", "4",
           # SGLang's radix cache (its Rust tree core) fails on the first insert under torch 2.11 with or
           # without this plugin ("insert value must be an int64 tensor, got Uint8"); the runner and Engine
           # stages run without it too.
           "--disable-radix-cache"]
    if not opts.fp8:
        cmd.append("--enable-fp4-indexer")
    log_path = opts.out + ".log"
    t0 = time.time()
    res = {"cmd": " ".join(cmd)}
    with launched_server(cmd, opts.port, log_path, opts.ready_timeout) as base:
        res["ready_s"] = time.time() - t0
        body = json.dumps({"input_ids": seeded_prompts()[0], "sampling_params": {
            "temperature": 0, "max_new_tokens": 8, "ignore_eos": True}}).encode()
        req = urllib.request.Request(base + "/generate", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            out = json.loads(r.read())
        res["output_ids"] = out.get("output_ids")
        res["completion_tokens"] = out.get("meta_info", {}).get("completion_tokens")
    res["plugin_log"] = [ln.strip() for ln in open(log_path, errors="replace") if "FP4 indexer" in ln]
    with open(opts.out, "w") as f:
        json.dump(res, f)
    print(f"saved {opts.out}: {res}")


#: Top-k rows per request in each forward mode of EAGLE with one draft branch (``--speculative-eagle-topk 1``):
#: target verify and draft extend score every draft token, draft decode one token per step.
MODE_NAMES = {"TARGET_VERIFY": "target verify", "DRAFT_EXTEND_V2": "draft extend", "DECODE": "draft decode"}


def rows_per_request(mode: str, draft_tokens: int) -> int:
    """Top-k rows each request contributes to one call of ``mode`` (``ForwardMode`` name).

    Raises:
        ValueError: ``mode`` is not one of ``MODE_NAMES``.
    """
    if mode not in MODE_NAMES:
        raise ValueError(f"mode: expected one of {sorted(MODE_NAMES)}, got {mode!r}")
    return 1 if mode == "DECODE" else draft_tokens


#: Failing rows kept per mode as examples in ``check_trace`` and ``oracle_check`` (what a reader needs to see why).
EXAMPLES = 5


def check_trace(records: list[dict], draft_tokens: int) -> dict:
    """Check every real row of a top-k trace (``scripts/topk_trace``) and index its rows for comparison.

    A call's first ``batch_size x rows_per_request`` rows are the batch's requests in order (the rest
    pad a CUDA graph's batch); row ``r`` of request ``i`` at position ``p`` sees ``p + 1`` keys in target
    verify and draft extend, and in draft decode the request's sequence length as the forward held it
    (the call's ``seq_lens``, where the trace has it): SGLang 0.5.23's multi-step draft backend for DSA
    (``DeepseekSparseAttnMultiStepBackend``) builds one metadata from the batch's ``seq_lens`` for all its
    steps, so a draft step's indexer does not see the draft tokens' own keys (FP8 and FP4 alike).
    ``check_topk_rows`` holds each row to its count with the request's ``req_to_token`` slots. A call whose rows
    are not at the batch's positions is counted as ``stale`` and not checked: a CUDA-graph capture's
    warm-up run on dummy inputs, or a captured slot that this step did not write (a graph of another
    batch size) or whose memory another graph reused (the trace plugin's first version recorded
    warm-up runs and allocated its slots inside graph capture; it no longer does either).

    Args:
        records: what ``fp4_indexer_topk_trace.read_trace`` returns.
        draft_tokens: SGLang's ``--speculative-num-draft-tokens`` of the run.

    Returns:
        dict: ``modes`` (per mode name: calls, rows, graph calls, stale calls, failures by kind, layers
        seen, and ``examples``: up to ``EXAMPLES`` failing rows with their position, key count, entries and
        request lengths) and ``rows`` ({(mode, layer, prompt_len, position, occurrence): frozenset of key
        positions}, valid rows only) for ``trace_overlap``.
    """
    import torch

    modes: dict = {}
    keyed: dict = {}
    seen: dict = {}
    for rec in records:
        for call in rec["calls"]:
            mode = call["mode"]
            if mode not in MODE_NAMES:
                continue
            per = rows_per_request(mode, draft_tokens)
            st = modes.setdefault(mode, {"calls": 0, "graph_calls": 0, "stale": 0, "rows": 0, "count": 0,
                                         "duplicate": 0, "out_of_range": 0, "missing_rows": 0, "layers": set(),
                                         "examples": []})
            need = rec["batch_size"] * per
            if not _positions_of_batch(call["pos"][:need], rec, per, draft_tokens):
                st["stale"] += 1  # not this batch's rows (see docstring)
                continue
            st["calls"] += 1
            st["graph_calls"] += bool(call.get("graph"))
            st["layers"].add(call["layer"])
            if call["rows"] < need:
                st["missing_rows"] += need - call["rows"]
            for i, slots in enumerate(rec["req_slots"]):
                lo, hi = i * per, min((i + 1) * per, call["rows"])
                if hi <= lo or slots is None:
                    continue
                topk, pos = call["topk"][lo:hi], call["pos"][lo:hi]
                seq = call.get("seq_lens")
                lens = pos + 1
                if mode == "DECODE" and seq is not None and i < seq.numel():
                    lens = torch.full_like(pos, int(seq[i]))
                got = check_topk_rows(topk, lens, slots)
                st["rows"] += got["rows"]
                for kind in ("count", "duplicate", "out_of_range"):
                    st[kind] += got[kind]
                if got["count"] + got["duplicate"] + got["out_of_range"]:
                    if len(st["examples"]) < EXAMPLES:
                        row = topk[0][topk[0] >= 0]
                        st["examples"].append({
                            "layer": int(call["layer"]), "position": int(pos[0]), "keys": int(lens[0]),
                            "entries": int(row.numel()), "prompt_len": rec["prompt_lens"][i],
                            "req_len": rec["req_lens"][i], "seq_len": int(seq[i]) if seq is not None and i < seq.numel() else None,
                            "failures": {k: got[k] for k in ("count", "duplicate", "out_of_range")}})
                    continue  # only valid rows are compared between formats
                inv = slot_positions(slots, int(pos.max()))
                for r in range(hi - lo):
                    row = topk[r][topk[r] >= 0].tolist()
                    key = (mode, call["layer"], rec["prompt_lens"][i], int(pos[r]))
                    k = seen[key] = seen.get(key, -1) + 1
                    keyed[key + (k,)] = frozenset(inv.get(v, -1 - v) for v in row)
    for st in modes.values():
        st["layers"] = sorted(st["layers"])
    return {"modes": modes, "rows": keyed}


def page_keys(pages, length: int, page_size: int = 64):
    """The first ``length`` index keys of a request, decoded exactly (fp64 ``[length, 128]``), and their UE8M0
    group scales (uint8 ``[length, 4]``; ``None`` for FP8) from its cache pages in page-table order, in either
    pool's layout, told apart by the page's bytes: the FP4 page (``page_size x 68``: payload plane, then scale
    plane, ``pool.read_index_k``) or SGLang's FP8 index page (``page_size x 132``: 128 e4m3 bytes per key, then
    one fp32 scale per key, as ``bench.scorers.fp8_index_cache_from_fp4`` writes it).

    Raises:
        ValueError: pages of another size, or fewer pages than ``length`` keys need.
    """
    import torch

    from sglang_fp4_indexer.format import dequantize_index_k
    from sglang_fp4_indexer.pool import read_index_k

    if pages.dim() != 2 or pages.shape[0] * page_size < length:
        raise ValueError(f"pages: expected [>= {-(-length // page_size)}, page bytes], got {tuple(pages.shape)}")
    if pages.shape[1] == page_size * 68:
        payload, scales = read_index_k(pages, torch.arange(length), page_size)
        return dequantize_index_k(payload, scales).double(), scales
    if pages.shape[1] == page_size * 132:
        values = pages[:, : page_size * 128].contiguous().view(torch.float8_e4m3fn).reshape(-1, 128)[:length]
        scales = pages[:, page_size * 128:].contiguous().view(torch.float32).reshape(-1)[:length]
        return values.double() * scales.double()[:, None], None
    raise ValueError(f"pages: {pages.shape[1]} bytes per page is neither the FP4 ({page_size * 68}) nor the FP8 "
                     f"({page_size * 132}) index page")


def oracle_row(q, weights, keys, scales, topk_slots, page_ids, k: int = TOPK, page_size: int = 64,
               forced: dict | None = None, unstable: int = 0) -> dict:
    """Hold one served top-k row to the fp64 oracle on the keys the server held, within the scorer's bound.

    The oracle logit of key j is ``sum_h w_h relu(q_h . k_j)`` (``reference.logits_from_keys``); the scorer may
    be off by ``bound_j``: ``sm90.rel_bound() x sum_h |w_h| sum_d |q_hd k_jd|`` plus ``sm90.logit_error_floor``
    for the FP4 cache (the Hopper kernel's bound, as its GPU tests assert), ``bench.checks.DEEPGEMM_REL x`` the
    same term for FP8. A served set S of ``min(k, n)`` positions is a top-k of some logits within those bounds
    exactly when ``min over S of (ref + bound) >= max over the rest of (ref - bound)``; the row passes then.

    Args:
        q: ``[H, 128]`` the row's index queries (any float dtype); weights: ``[H]``.
        keys: fp64 ``[n, 128]`` the request's keys the row sees (``page_keys``); scales: their UE8M0 codes
            (FP4) or ``None`` (FP8).
        topk_slots: int ``[k]`` the served top-k as KV slots (``page x page_size + offset``; ``< 0`` empty).
        page_ids: int ``[pages]`` the request's page-table row (slot -> position).
        forced: ``{"init": a, "local": b}``: the first ``a`` and last ``b`` keys, which SGLang's
            ``_mask_init_and_local_tokens`` puts in every top-k (``index_init_tokens`` / ``index_local_tokens`` of
            the model's config; 0 for DeepSeek-V3.2), count as chosen before any other.
        unstable: the row's last ``unstable`` keys, whose bytes in ``keys`` may differ from what the scorer read
            (``oracle_check`` says when): they constrain nothing (chosen or not, either is accepted); every other
            key is held to the bound as above.

    Returns:
        dict: ``ok``, ``count`` (served entries), ``expected`` (min(k, n)), ``outside`` (entries that are no
        position of the row), ``margin`` (min over S of (ref + bound) - max over the rest of (ref - bound);
        >= 0 passes), ``ref_max`` (the largest finite |oracle logit|: the row's scale); a failing row also
        ``keys``, ``lowest_chosen`` / ``highest_unchosen`` (position, oracle logit, its fp16 value, bound, free),
        ``outside_positions`` and ``outside_slots``.
    """
    import torch

    from sglang_fp4_indexer import reference
    from sglang_fp4_indexer.bench.checks import DEEPGEMM_REL
    from sglang_fp4_indexer.ops import sm90

    n = keys.shape[0]
    qd, wd = q.double(), weights.double()
    ref = reference.logits_from_keys(qd, wd, keys)
    if forced and (forced.get("init") or forced.get("local")):
        ref[: forced.get("init", 0)] = float("inf")
        if forced.get("local"):
            ref[max(0, n - forced["local"]):] = float("inf")
    term = (keys.abs() @ qd.abs().t()) @ wd.abs()
    bound = (sm90.rel_bound() * term + sm90.logit_error_floor(qd, wd, keys, scales)) if scales is not None \
        else DEEPGEMM_REL * term
    where: dict[int, int] = {}  # page -> its index in the row, over the pages the row's keys fill (first wins)
    for j, page in enumerate(page_ids.tolist()[: -(-n // page_size)]):
        where.setdefault(int(page), j)
    served = [int(v) for v in topk_slots.tolist() if v >= 0]
    pos = [where.get(v // page_size, -1) * page_size + v % page_size if v // page_size in where else -1
           for v in served]
    outside = sum(1 for p in pos if not 0 <= p < n)
    expected = min(k, n)
    chosen = torch.zeros(n, dtype=torch.bool)
    inside = torch.tensor([p for p in pos if 0 <= p < n], dtype=torch.long)
    chosen[inside] = True
    free = torch.zeros(n, dtype=torch.bool)
    if unstable > 0:
        free[max(0, n - unstable):] = True
    upper = torch.where(free, torch.full_like(ref, float("inf")), ref + bound)
    lower = torch.where(free, torch.full_like(ref, float("-inf")), ref - bound)
    lo = float(upper[chosen].min()) if bool(chosen.any()) else float("inf")
    hi = float(lower[~chosen].max()) if bool((~chosen).any()) else float("-inf")
    margin = lo - hi
    ok = outside == 0 and len(served) == expected and int(chosen.sum()) == expected and margin >= 0
    finite = ref[torch.isfinite(ref)]
    out = {"ok": ok, "count": len(served), "expected": expected, "outside": outside, "margin": margin,
           "ref_max": float(finite.abs().max()) if finite.numel() else None}
    if not ok:  # what a reader needs to see why: the two keys that bind, and the entries outside the row
        def key(j):  # ``ref_fp16``: the bin SGLang's decode top-k kernel sorts a score into first (its fp16 value)
            return {"position": j, "ref": float(ref[j]), "ref_fp16": float(ref[j].to(torch.float16)),
                    "bound": float(bound[j]), "free": bool(free[j])}

        inf = torch.full_like(ref, float("inf"))
        low = key(int(torch.where(chosen, upper, inf).argmin())) if bool(chosen.any()) else None
        high = key(int(torch.where(~chosen, lower, -inf).argmax())) if bool((~chosen).any()) else None
        out.update(keys=n, lowest_chosen=low, highest_unchosen=high,
                   outside_positions=[p for p in pos if not 0 <= p < n][:8],
                   outside_slots=[v for v, p in zip(served, pos) if not 0 <= p < n][:8])
    return out


def oracle_check(records: list[dict], draft_tokens: int) -> dict:
    """``oracle_row`` for every recorded row of the first request of each oracle call (``oracle_calls`` of the
    trace plugin's records, written with ``FP4_INDEXER_TOPK_TRACE_ORACLE_LAYERS``), per mode.

    The pages are copied after SGLang's scheduled batch, and SGLang's EAGLE worker runs a batch as draft (draft
    decode), verify, then draft extend, which rewrites the draft model's keys at the draft tokens' positions after
    the draft decode passes read them. A draft decode row's last ``draft_tokens`` keys are therefore ``unstable``
    for ``oracle_row`` (they hold draft extend's bytes, not necessarily those the scorer read); every other key of
    every row, and every key of the target verify and draft extend rows, is held to the bound.

    A call's rows of the first request are its first ``rows_per_request(mode)``, read against its page-table row
    ``block_table[0]`` (one row per request); a call whose rows are not at the batch's positions (``_positions_of_batch``: capture warm-ups, stale slots) is skipped
    as ``check_trace`` skips it.

    Returns:
        dict: per mode name, ``calls``, ``rows``, ``failed`` (rows), ``stale`` (calls skipped), ``layers``,
        ``worst_margin`` (the smallest ``margin``; >= 0 for a passing run), ``examples`` (up to ``EXAMPLES``
        failing rows: ``oracle_row``'s result with the row's position and the binding keys, and
        ``passes_with_keys_off_by``: the offsets ``d`` within ``draft_tokens`` for which the row passes when held to
        ``n + d`` keys, where the copied pages hold them; a diagnosis of which keys the scorer saw, never a pass).
    """
    import torch

    out: dict = {}
    for rec in records:
        for c in rec.get("oracle_calls", []):
            mode = c["mode"]
            if mode not in MODE_NAMES:
                continue
            per = rows_per_request(mode, draft_tokens)
            st = out.setdefault(mode, {"calls": 0, "rows": 0, "failed": 0, "stale": 0, "layers": set(),
                                       "worst_margin": float("inf"), "examples": [], "ref_max": 0.0})
            if not _positions_of_batch(c["pos"][: rec["batch_size"] * per], rec, per, draft_tokens):
                st["stale"] += 1
                continue
            st["calls"] += 1
            st["layers"].add(c["layer"])
            heads = c["weights"].shape[1]
            q = c["q"].view(torch.float8_e4m3fn) if c["q"].shape[1] == heads * 128 else c["q"].view(torch.bfloat16)
            q = q.reshape(c["rows"], heads, 128)
            for r in range(min(per, c["rows"])):
                n = int(c["lens"][r])
                keys, scales = page_keys(c["pages"], n)
                got = oracle_row(q[r], c["weights"][r], keys, scales, c["topk"][r], c["block_table"][0],
                                 forced=c.get("forced"), unstable=draft_tokens if mode == "DECODE" else 0)
                st["rows"] += 1
                st["failed"] += not got["ok"]
                st["worst_margin"] = min(st["worst_margin"], got["margin"])
                st["ref_max"] = max(st["ref_max"], got["ref_max"] or 0.0)
                if not got["ok"] and len(st["examples"]) < EXAMPLES:
                    # Which key counts near the row's own would pass (pages permitting): a diagnosis, not a pass.
                    top = min(n + draft_tokens, c["pages"].shape[0] * 64)
                    all_keys, all_scales = page_keys(c["pages"], top)  # decoded once; each count is a prefix
                    near = [m - n for m in range(max(1, n - draft_tokens), top + 1) if m != n and oracle_row(
                        q[r], c["weights"][r], all_keys[:m], None if all_scales is None else all_scales[:m],
                        c["topk"][r], c["block_table"][0], forced=c.get("forced"),
                        unstable=draft_tokens if mode == "DECODE" else 0)["ok"]]
                    st["examples"].append(dict(got, layer=int(c["layer"]), position=int(c["pos"][r]),
                                               graph=bool(c.get("graph")), passes_with_keys_off_by=near))
    for st in out.values():
        st["layers"] = sorted(st["layers"])
    return out


def _positions_of_batch(pos, rec: dict, per: int, draft_tokens: int) -> bool:
    """Whether a captured call's rows hold positions of the batch's requests (``per`` rows each, in order).

    A request with ``prompt_len`` prompt and ``req_len`` tokens so far scores positions from its last
    prompt token to its draft tokens: ``prompt_len - 1 <= p < req_len + draft_tokens``.
    """
    if pos.numel() < rec["batch_size"] * per:
        return False
    for i, (plen, rlen) in enumerate(zip(rec["prompt_lens"], rec["req_lens"])):
        p = pos[i * per:(i + 1) * per]
        if bool(((p < plen - 1) | (p >= rlen + draft_tokens)).any()):
            return False
    return True


def trace_overlap(fp8: dict, fp4: dict, same_until: dict[int, int]) -> dict:
    """FP4 against FP8 top-k overlap per mode, on rows both runs scored with the same tokens.

    Args:
        fp8, fp4: ``check_trace`` results of the two runs.
        same_until: prompt length -> the first position at which the two runs' tokens differ (rows at
            positions below it saw the same tokens in both runs).

    Returns:
        dict: per mode name, ``rows`` compared and the mean and lowest ``|FP4 & FP8| / |FP8|``.
    """
    out: dict = {}
    for key, b in fp8["rows"].items():
        a = fp4["rows"].get(key)
        mode, _layer, plen, p, _k = key
        if a is None or p >= same_until.get(plen, 0) or not b:
            continue
        v = len(a & b) / len(b)
        st = out.setdefault(mode, {"rows": 0, "sum": 0.0, "min": 1.0})
        st["rows"] += 1
        st["sum"] += v
        st["min"] = min(st["min"], v)
    return {m: {"rows": st["rows"], "mean": st["sum"] / st["rows"], "min": st["min"]} for m, st in out.items()}


def first_difference(a: list, b: list) -> int:
    """The first index at which two token lists differ (the shorter length when one is a prefix of the other)."""
    return next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _first_difference(r8: dict, r4: dict) -> int:
    """The first position at which two Engine results of one prompt differ (prompt + output tokens)."""
    return r8["prompt_len"] + first_difference(r8.get("output_ids") or [], r4.get("output_ids") or [])


def check_table(rows: list[dict], width: int = 66) -> str:
    """Check rows (``check``, ``ok``, ``detail``) as text, one line each: ``check  PASS|FAIL  detail``."""
    return "\n".join(f"{r['check']:<{width}} {'PASS' if r['ok'] else 'FAIL':4} {r['detail']}" for r in rows)


def trace_check(argv: list[str]) -> int:
    """``trace-check [--fp8 ENGINE.json] --fp4 ENGINE.json [--fp4-log LOG] [--oracle] [--json OUT]``: MTP top-k checks,
    as a table.

    Without ``--fp8`` (the FP8 run did not finish) only the FP4 run's rows are checked and no overlap is reported.
    """
    p = argparse.ArgumentParser(prog="sglang_one_batch.py trace-check")
    p.add_argument("--fp8", help="the FP8 run's engine JSON (written with --trace); without it, the FP4 run alone")
    p.add_argument("--fp4", required=True, help="the FP4 run's engine JSON (written with --trace)")
    p.add_argument("--oracle", action="store_true",
                   help="also hold the rows recorded with FP4_INDEXER_TOPK_TRACE_ORACLE_LAYERS to the fp64 oracle "
                        "on the cache pages the server held (oracle_check); a run without such rows fails")
    p.add_argument("--fp4-log", help="the FP4 run's log, for the plugin's start-up line")
    p.add_argument("--json")
    opts = p.parse_args(argv)
    e4 = json.load(open(opts.fp4))
    e8 = json.load(open(opts.fp8)) if opts.fp8 else None
    for name, e in (("--fp8", e8), ("--fp4", e4)):
        if e is not None and not e.get("trace"):
            p.error(f"{name}: the run was not traced (engine ... --trace DIR)")
    if e8 is not None and (e8["spec_steps"], e8["draft_tokens"]) != (e4["spec_steps"], e4["draft_tokens"]):
        p.error("--fp8 / --fp4: runs of different speculative settings")
    n = e4["draft_tokens"]
    runs = {name: check_trace(read_trace(e["trace"]), n) for name, e in (("FP8", e8), ("FP4", e4)) if e is not None}
    ov = {}
    if e8 is not None:
        same = {r8["prompt_len"]: _first_difference(r8, r4) for r8, r4 in zip(e8["requests"], e4["requests"])}
        ov = trace_overlap(runs["FP8"], runs["FP4"], same)
    label = f"EAGLE {e4['spec_steps']} step(s), {n} draft tokens"
    rows = []
    for name, run_ in runs.items():
        for mode, st in sorted(run_["modes"].items()):
            bad = st["count"] + st["duplicate"] + st["out_of_range"] + st["missing_rows"]
            rows.append({"check": f"{label}, {name}: every {MODE_NAMES[mode]} top-k row valid",
                         "ok": st["rows"] > 0 and bad == 0,
                         "detail": f"{st['rows']} rows in {st['calls']} calls ({st['graph_calls']} from CUDA-graph "
                                   f"replays), layers {st['layers']}, {bad} failures"
                                   + (f"; {st['stale']} calls not at the batch's positions (capture warm-ups, stale slots), not checked"
                                      if st["stale"] else "")})
        missing = sorted(set(MODE_NAMES) - set(run_["modes"]) - ({"DECODE"} if e4["spec_steps"] == 1 else set()))
        if missing:
            rows.append({"check": f"{label}, {name}: every mode traced", "ok": False,
                         "detail": "no call of " + ", ".join(MODE_NAMES[m] for m in missing)})
    if opts.oracle:
        for name, e in (("FP8", e8), ("FP4", e4)):
            if e is None:
                continue
            got = oracle_check(read_trace(e["trace"]), n)
            for mode in sorted(set(MODE_NAMES) - ({"DECODE"} if e4["spec_steps"] == 1 else set())):
                st = got.get(mode, {"calls": 0, "rows": 0, "failed": 0, "stale": 0, "layers": [], "worst_margin": None})
                rows.append({"check": f"{label}, {name}: {MODE_NAMES[mode]} top-k = fp64 oracle on the server's pages, "
                                      "within the scorer's bound",
                             "ok": st["rows"] > 0 and st["failed"] == 0,
                             "detail": f"{st['rows']} rows of the first request in {st['calls']} calls, layers "
                                       f"{st['layers']}, "
                                       + (f"largest |logit| {st['ref_max']:.3g}, " if st.get("ref_max") else "")
                                       + f"{st['failed']} failed, worst margin {st['worst_margin']}"
                                       + (f"; {st['stale']} calls not at the batch's positions" if st["stale"] else ""),
                             "examples": st.get("examples", [])})
    for mode, st in sorted(ov.items()):
        rows.append({"check": f"{label}: FP4 vs FP8 {MODE_NAMES[mode]} top-k overlap (reported)", "ok": True,
                     "detail": f"mean {st['mean']:.4f}, lowest row {st['min']:.4f} over {st['rows']} rows scored "
                               "with the same tokens"})
    toks = "; ".join(f"prompt {r['prompt_len']}: {r['completion_tokens']} tokens in {r['spec_verify_ct']} verify steps"
                     + (f" (FP8 {r8['completion_tokens']} in {r8['spec_verify_ct']})" if r8 else "")
                     for r8, r in zip(e8["requests"] if e8 else [None] * len(e4["requests"]), e4["requests"]))
    rows.append({"check": f"{label}: Engine generated", "ok": all(r.get("completion_tokens") for r in e4["requests"]),
                 "detail": toks})
    if opts.fp4_log:
        lines = [ln.strip() for ln in open(opts.fp4_log, errors="replace") if "FP4 indexer active" in ln]
        rows.append({"check": f"{label}: start-up line names the scorer of each mode",
                     "ok": any("scorer:" in ln for ln in lines), "detail": lines[0] if lines else "no start-up line"})
    if opts.json:
        modes = {k: v["modes"] for k, v in runs.items()}
        with open(opts.json, "w") as f:
            json.dump({"checks": rows, "modes": modes, "overlap": ov, "spec_steps": e4["spec_steps"],
                       "draft_tokens": n}, f, indent=1, default=str)
    print(check_table(rows, 78))
    return 0 if all(r["ok"] for r in rows) else 1


def _overlap(a, b):
    """Mean and min over rows of |A ∩ B| / |B| for top-k rows ``[rows, TOPK]`` (``-1`` = empty)."""
    vals = []
    for r in range(a.shape[0]):
        x = set(a[r][a[r] >= 0].tolist())
        y = set(b[r][b[r] >= 0].tolist())
        vals.append(len(x & y) / max(len(y), 1))
    return sum(vals) / len(vals), min(vals)


def compare(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="sglang_one_batch.py compare")
    p.add_argument("runs", nargs="*", metavar="RUN.pt",
                   help="the three one-batch runs FP8.pt FP4.pt FP4_EAGER.pt (or none: engine / server checks only)")
    p.add_argument("--engine", nargs=2, metavar=("FP8_JSON", "FP4_JSON"))
    p.add_argument("--server", metavar="SERVER_JSON")
    p.add_argument("--json")
    opts = p.parse_args(argv)
    import torch

    if len(opts.runs) not in (0, 3):
        p.error(f"runs: expected FP8.pt FP4.pt FP4_EAGER.pt or none, got {len(opts.runs)} files")
    rows = []

    def add(name, ok, detail):
        rows.append({"check": name, "ok": bool(ok), "detail": detail})

    per, fp8, fp4, eager, p8, p4 = [], {}, {}, {}, None, None
    if opts.runs:
        fp8, fp4, eager = (torch.load(f, weights_only=False) for f in opts.runs)
        p8, p4 = fp8["pool"], fp4["pool"]
        add("FP4 pool built by SGLang (68 B per token per layer)",
            p4["index_bytes_per_token_layer"] == 68 and p8["index_bytes_per_token_layer"] == 132,
            f"FP8 run: {p8['class']}/{p8['index_cache']} {p8['index_bytes_per_token_layer']} B; "
            f"FP4 run: {p4['class']}/{p4['index_cache']} {p4['index_bytes_per_token_layer']} B")
        add("FP4 pool holds more tokens in the same memory", p4["max_total_num_tokens"] > p8["max_total_num_tokens"],
            f"{p8['max_total_num_tokens']} -> {p4['max_total_num_tokens']} "
            f"(+{100 * (p4['max_total_num_tokens'] / p8['max_total_num_tokens'] - 1):.1f} %)")
        for name, st in (("FP8", fp8), ("FP4", fp4), ("FP4 eager", eager)):
            bad = 0
            total = 0
            for b in st["batches"]:
                for c in b["prefill_checks"] + b["decode_checks"]:
                    total += c["rows"]
                    bad += c["count"] + c["duplicate"] + c["out_of_range"]
            add(f"{name}: every top-k row valid (prefill and decode)", bad == 0 and total > 0,
                f"{total} rows, {bad} failures")
        # graph replay vs eager (FP4)
        eq_rows = tot_rows = 0
        worst = 1.0
        for bg, be in zip(fp4["batches"], eager["batches"]):
            for g, e in zip(bg["decode"], be["decode"]):
                for layer in range(g.shape[1]):
                    for r in range(g.shape[0]):
                        x, y = g[r, layer], e[r, layer]
                        sx, sy = set(x[x >= 0].tolist()), set(y[y >= 0].tolist())
                        tot_rows += 1
                        eq_rows += sx == sy
                        worst = min(worst, len(sx & sy) / max(len(sy), 1))
        add("FP4 top-k from CUDA-graph replay equals eager", eq_rows == tot_rows and tot_rows > 0,
            f"{eq_rows}/{tot_rows} rows identical sets (worst overlap {worst:.4f})")
        oracle = eager.get("oracle") or []
        ok = bool(oracle) and all(o["max_error_over_bound"] <= 1.0 for o in oracle)
        add("eager FP4 logits vs fp64 oracle within sm90.logit_error_bound", ok,
            "; ".join(f"layer {o['layer']} rows {o['rows']} {o['impl']}: err/bound {o['max_error_over_bound']:.3f}, "
                      f"returned top-k = kernel top-k {o['topk_agreement_min']:.4f}" for o in oracle) or "not recorded")
        # FP4 vs FP8 overlap per layer and step
        per = []
        for b8, b4 in zip(fp8["batches"], fp4["batches"]):
            for step, (d8, d4) in enumerate(zip(b8["decode"], b4["decode"])):
                for layer in range(d8.shape[1]):
                    mean, low = _overlap(d4[:, layer], d8[:, layer])
                    per.append({"bs": b8["bs"], "step": step, "layer": layer, "mean": mean, "min": low})
            for t8, t4 in zip(b8["prefill_tail"], b4["prefill_tail"]):
                for layer in range(t8.shape[1]):
                    mean, low = _overlap(t4[:, layer], t8[:, layer])
                    per.append({"bs": b8["bs"], "step": "prefill", "layer": layer, "mean": mean, "min": low})
        dec = [x["mean"] for x in per if x["step"] != "prefill"]
        pre = [x["mean"] for x in per if x["step"] == "prefill"]
        add("FP4 vs FP8 top-k overlap (reported, not a pass/fail bound)", True,
            f"decode: mean {sum(dec) / len(dec):.4f}, lowest layer-step {min(dec):.4f}; "
            f"prefill (last 64 tokens of each prompt): mean {sum(pre) / len(pre):.4f}")
        lines = [ln for ln in fp4.get("plugin_log", []) if "FP4 indexer" in ln]
        add("startup log names the kernels that run", any("scorer:" in ln for ln in lines), " | ".join(lines) or "no plugin log line")
        lines8 = [ln for ln in fp8.get("plugin_log", []) if "FP4" in ln]
        add("FP8 run: plugin silent", not lines8, " | ".join(lines8) or "no plugin line")
    if opts.engine:
        e8, e4 = (json.load(open(f)) for f in opts.engine)
        spec = e4.get("speculative", "eagle")
        if e8.get("speculative", "eagle") != spec:
            p.error(f"--engine: FP8 run has speculative={e8.get('speculative', 'eagle')}, FP4 run {spec}")
        short = "Engine with MTP" if spec == "eagle" else "Engine, plain decode"
        what = short + (" (target verify + draft through the plugin)" if spec == "eagle" else " (no speculative decoding)")
        got = []
        for r8, r4 in zip(e8["requests"], e4["requests"]):
            steps = f" in {r4['spec_verify_ct']} verify steps (FP8: {r8['completion_tokens']} in {r8['spec_verify_ct']})" \
                if spec == "eagle" else f" (FP8: {r8['completion_tokens']})"
            got.append(f"prompt {r4['prompt_len']}: {r4['completion_tokens']} tokens" + steps)
        have_topk = all(r.get("indexer_topk") for r in e4["requests"])
        add(what, have_topk and e4["requests"], "; ".join(got) + ("" if have_topk else "; no indexer top-k returned"))
        # SGLang returns (prompt + output - 1, indexer layers, index_topk) per request: row t is token t, which sees
        # t + 1 keys (check_topk_rows with lengths 1 .. seq; the request's slots are not returned, so a row's range
        # is read as positions and reported, not counted as a failure).
        for name, run_ in (("FP8", e8), ("FP4", e4)):
            rows_ = bad = as_pos = 0
            shapes = set()
            for r in run_["requests"]:
                if not r.get("indexer_topk"):
                    continue
                seq = r["prompt_len"] + (r["completion_tokens"] or 0) - 1
                flat = torch.tensor(r["indexer_topk"])
                if flat.numel() % (seq * TOPK):
                    shapes.add(f"{flat.numel()} values, not a multiple of {seq} x {TOPK}")
                    bad += 1
                    continue
                a = flat.view(seq, -1, TOPK)
                shapes.add(a.shape[1])
                lens = torch.arange(1, seq + 1)
                for layer in range(a.shape[1]):
                    got = check_topk_rows(a[:, layer], lens, torch.empty(0, dtype=torch.long))
                    rows_ += got["rows"]
                    bad += got["count"] + got["duplicate"]
                    as_pos += got["position"]
            add(f"Engine {name}: every returned top-k row valid (distinct, min(t + 1, {TOPK}) entries)",
                rows_ > 0 and bad == 0,
                f"{rows_} rows ({sorted(shapes, key=str)} layers per token), {bad} failures; "
                f"{as_pos} rows hold positions < t + 1")
        if have_topk and all(r.get("indexer_topk") for r in e8["requests"]):
            ovs = []
            for r8, r4 in zip(e8["requests"], e4["requests"]):
                a8 = torch.tensor(r8["indexer_topk"]).view(-1, TOPK)
                a4 = torch.tensor(r4["indexer_topk"]).view(-1, TOPK)
                n = min(a8.shape[0], a4.shape[0])
                mean, low = _overlap(a4[:n], a8[:n])
                ovs.append(mean)
            add(f"{short}: FP4 vs FP8 returned top-k overlap (reported)", True,
                f"mean per request {', '.join(f'{v:.4f}' for v in ovs)}")
    if opts.server:
        sv = json.load(open(opts.server))
        add("launch_server --enable-fp4-indexer: one /generate on localhost",
            bool(sv.get("completion_tokens")) and bool(sv.get("plugin_log")),
            f"{sv.get('completion_tokens')} tokens; ready after {sv.get('ready_s', 0):.0f} s; "
            + " | ".join(sv.get("plugin_log", [])))
    summary = {"checks": rows, "overlap": per, "versions": fp4.get("versions"), "pools": [p8, p4],
               "plugin_log_fp4": fp4.get("plugin_log"), "wall_s": [fp8.get("wall_s"), fp4.get("wall_s"),
                                                                   eager.get("wall_s")]}
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(summary, f, indent=1, default=str)
    print(f"versions: {fp4.get('versions')}")
    print(f"{'check':<66} {'':4} detail")
    print(check_table(rows))
    return 0 if all(r["ok"] for r in rows) else 1


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in ("make-model", "run", "engine", "server", "compare", "trace-check"):
        print(__doc__)
        return 2
    cmd, rest = sys.argv[1], sys.argv[2:]
    if cmd == "make-model":
        mp = argparse.ArgumentParser(prog="sglang_one_batch.py make-model")
        mp.add_argument("directory")
        mp.add_argument("--size", choices=sorted(MODEL_SIZES), default="tiny")
        mp.add_argument("--layers", type=int, help="decoder layers (1..61), the size's own count when left out")
        mp.add_argument("--ep", type=int, help="v32 sizes: the deployment's expert-parallel degree (8, 16 or 32; "
                        "the rank holds 256 / EP routed experts); EP8 when left out")
        mo = mp.parse_args(rest)
        try:
            make_model(mo.directory, mo.size, mo.layers, mo.ep)
        except ValueError as e:
            mp.error(str(e))
        return 0
    if cmd == "run":
        run(rest)
        return 0
    if cmd == "engine":
        engine(rest)
        return 0
    if cmd == "server":
        server(rest)
        return 0
    if cmd == "trace-check":
        return trace_check(rest)
    return compare(rest)


if __name__ == "__main__":
    sys.exit(main())
