"""Test-only SGLang plugin: record every DSA indexer top-k row, CUDA-graph replays included.

Stands for SGLang's own ``--enable-return-indexer-topk`` capturer in the GPU
checks of speculative decoding (MTP/EAGLE): on the GPU machine's stack that
capturer makes SGLang's start-up ``cublasCreate`` fail, with or without
sglang-fp4-indexer loaded (docs/user-guide.md). This plugin is installed only
there, by ``scripts/sglang_gpu_check.sh``; it is never in the product wheel.

Loaded by SGLang's ``load_plugins()`` (entry point ``fp4_indexer_topk_trace``
in ``sglang.srt.plugins``) in every SGLang process; it registers nothing unless
``FP4_INDEXER_TOPK_TRACE_DIR`` is set. Then it registers two AFTER hooks with
SGLang's ``HookRegistry``:

* ``Indexer.forward_cuda`` (the indexer's final top-k, after SGLang's or the
  FP4 plugin's scorer and SGLang's top-k transform): for calls of at most
  ``MAX_ROWS`` rows (decode, target verify, draft decode, draft extend; not
  prefill) it keeps the top-k ``[rows, index_topk]`` int32 and the rows'
  positions. Eager calls of real batches are copied at once (the warm-up runs of
  a graph capture are not recorded); a call made while a CUDA graph is being
  captured gets its own slot in an arena allocated outside any capture, and the
  copy into it is captured, so every replay of that graph writes the slot.
* ``Scheduler.run_batch``: after each scheduled batch it synchronises, reads the
  eager records and every slot written since the last read (slots are poisoned
  with ``-2``, a value top-k never holds), and saves them with the batch's
  ``req_to_token`` rows (``DIR/<pid>_<n>.pt``), then poisons the slots again.

With ``FP4_INDEXER_TOPK_TRACE_ORACLE_LAYERS`` set too (comma-separated layer ids), a third AFTER hook, on
``Indexer._get_topk_paged`` (the paged scorer and its top-k: decode, target verify, draft passes), keeps for
those layers the scorer's inputs -- the index queries (their bytes), the weights, the requests' page-table
rows, each query row's key count, the init / local tokens SGLang forces into the top-k -- and its top-k, in a second arena for captured calls as above; after the batch, the index-key
cache pages the batch's first request reads, copied out of the pool the call scored (the draft model's own
pool for draft passes). ``scripts/sglang_one_batch.py trace-check --oracle`` recomputes those rows' top-k
from those pages in fp64 and holds the server's to it within the scorer's error bound.

With ``FP4_INDEXER_TOPK_TRACE_EVERY=N`` (default 1), only every N-th batch the hook sees is saved (its pages
copied, its record written); the others' slots are read and poisoned as usual, so that a long run (the soak)
keeps a sample of its batches without writing each.

``read_trace(DIR)`` loads the records, ``decode_rows`` gives a one-request trace's decode rows as token
positions; ``scripts/sglang_one_batch.py trace-check`` checks them.
"""

from __future__ import annotations

import os

ENV = "FP4_INDEXER_TOPK_TRACE_DIR"
#: Calls with more rows than this (prefill chunks) are not recorded.
MAX_ROWS = 64
#: Captured indexer calls the arena holds (every captured graph's calls, all layers).
MAX_SLOTS = 512
POISON = -2
#: Layers whose scorer inputs and cache pages are recorded (comma-separated ids); unset: none.
ORACLE_ENV = "FP4_INDEXER_TOPK_TRACE_ORACLE_LAYERS"
#: Captured paged-scorer calls the oracle arena holds, and the page-table columns it keeps (160K tokens).
ORACLE_SLOTS = 64
MAX_PAGES = 2560
#: ``real``: after SGLang's dummy weights are drawn, give the indexer realistic logits (``_after_dummy_load``).
SCALE_ENV = "FP4_INDEXER_TOPK_TRACE_INDEX_SCALE"
#: Keys past a call's longest row whose pages are copied too (see ``_oracle_calls``).
EXTRA_KEYS = 8
#: Save every N-th batch (default 1: every one).
EVERY_ENV = "FP4_INDEXER_TOPK_TRACE_EVERY"

_state = {"slots": [], "eager": [], "n": 0, "capture_seq": 0, "oracle_slots": [], "oracle_eager": [], "pools": {},
          "batches": 0}


def register() -> None:
    """Entry point: register the two AFTER hooks when ``FP4_INDEXER_TOPK_TRACE_DIR`` is set (else nothing), and
    ``_after_dummy_load`` when ``FP4_INDEXER_TOPK_TRACE_INDEX_SCALE=real``.

    Raises:
        ValueError: ``FP4_INDEXER_TOPK_TRACE_INDEX_SCALE`` set to anything but ``real``.
    """
    scale = os.environ.get(SCALE_ENV, "")
    if scale not in ("", "real"):
        raise ValueError(f"{SCALE_ENV}: expected 'real' or unset, got {scale!r}")
    if scale == "real":
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        HookRegistry.register("sglang.srt.model_loader.loader.DummyModelLoader.load_model", _after_dummy_load,
                              HookType.AFTER)
    if not os.environ.get(ENV):
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register("sglang.srt.layers.attention.dsa.dsa_indexer.Indexer.forward_cuda",
                          _after_indexer, HookType.AFTER)
    HookRegistry.register("sglang.srt.managers.scheduler.Scheduler.run_batch", _after_run_batch, HookType.AFTER)
    if oracle_layers():
        register_last("sglang.srt.layers.attention.dsa.dsa_indexer.Indexer._get_topk_paged", _after_paged)


def register_last(target: str, hook) -> None:
    """Register ``hook`` as an AFTER hook on ``target`` when SGLang applies the hooks, after every plugin has
    registered its own, so that it wraps outermost whatever order SGLang loads the plugins in.

    sglang-fp4-indexer's AROUND hook on ``Indexer._get_topk_paged`` serves the FP4 cache without calling the
    function it wraps; an AFTER hook registered before it sits inside it and never runs with FP4 on. SGLang's
    ``load_plugins`` calls ``HookRegistry.apply_hooks`` once, after all plugins: this wraps that call once.
    """
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    original = HookRegistry.__dict__["apply_hooks"]

    def apply_hooks(cls, *args, **kwargs):
        HookRegistry.register(target, hook, HookType.AFTER)
        HookRegistry.apply_hooks = original
        return original.__func__(cls, *args, **kwargs)

    HookRegistry.apply_hooks = classmethod(apply_hooks)


def oracle_layers() -> set[int]:
    """The layer ids ``FP4_INDEXER_TOPK_TRACE_ORACLE_LAYERS`` names (empty when unset).

    Raises:
        ValueError: an entry that is not an int.
    """
    text = os.environ.get(ORACLE_ENV, "").strip()
    try:
        return {int(v) for v in text.split(",") if v.strip()}
    except ValueError:
        raise ValueError(f"{ORACLE_ENV}: expected comma-separated layer ids, got {text!r}") from None


def every() -> int:
    """Every how many batches one is saved (``FP4_INDEXER_TOPK_TRACE_EVERY``; 1 when unset).

    Raises:
        ValueError: a value that is not an int >= 1.
    """
    text = os.environ.get(EVERY_ENV, "").strip() or "1"
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"{EVERY_ENV}: expected an int >= 1 (save every N-th batch), got {text!r}")
    return n


def _after_dummy_load(result, self, *args, **kwargs):
    """AFTER hook of SGLang's ``DummyModelLoader.load_model``: index logits at a real checkpoint's scale (returns
    ``None``: the model, changed in place, is SGLang's result).

    SGLang's dummy weights are uniform in +-1e-3 (``initialize_dummy_weights``), norms included, so every index
    logit is about 1e-16: far below fp16's smallest value, where SGLang's decode top-k kernel cannot order them (it
    bins scores by their fp16 value) and an fp64 oracle cannot tell a wrong top-k from a tie. This sets every
    norm's weight to 1 (bias 0), as a trained model's are about, and draws the indexer's own projections (``wq_b``,
    ``wk``, ``weights_proj``, or the fused ``wk_weights_proj``) from N(0, 1 / fan_in), seeded, so that index queries
    and keys are of order 1 and the logits of order 0.1 to 10. Everything else keeps its dummy values; FP8 and FP4
    servers get the same weights.

    Raises:
        RuntimeError: an indexer projection that is not an unquantized float weight (the FP8 block-quantized sizes:
            only the bf16 tiny models take this).
    """
    import torch

    g = torch.Generator(device="cpu").manual_seed(20261206)
    with torch.no_grad():
        for name, module in result.named_modules():
            if "norm" in type(module).__name__.lower():
                w, b = getattr(module, "weight", None), getattr(module, "bias", None)
                if isinstance(w, torch.Tensor) and w.is_floating_point():
                    w.fill_(1.0)
                if isinstance(b, torch.Tensor) and b.is_floating_point():
                    b.zero_()
            if type(module).__name__ != "Indexer":
                continue
            for proj in ("wq_b", "wk", "weights_proj", "wk_weights_proj"):
                w = getattr(getattr(module, proj, None), "weight", None)
                if w is None:
                    continue
                if w.dtype not in (torch.bfloat16, torch.float16, torch.float32):
                    raise RuntimeError(f"fp4_indexer_topk_trace: {name}.{proj} is {w.dtype}; {SCALE_ENV}=real "
                                       "takes unquantized indexer weights only (the tiny models)")
                w.copy_((torch.randn(tuple(w.shape), generator=g) / w.shape[1] ** 0.5).to(w.dtype))
    return None


def _capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (never on a machine without CUDA)."""
    import torch

    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _arena(width: int, device):
    """The slots' storage, allocated once outside any CUDA-graph capture (``MAX_SLOTS`` slots).

    A slot allocated while a graph is being captured would come from the graphs' shared memory pool,
    where other graphs' tensors can overwrite it; this arena is ordinary memory that nothing else uses.
    """
    import torch

    if "arena_topk" not in _state:
        if _capturing():
            raise RuntimeError("fp4_indexer_topk_trace: the first indexer call came inside a CUDA-graph capture; "
                               "the slot arena must be allocated by an eager call first")
        _state["arena_topk"] = torch.full((MAX_SLOTS, MAX_ROWS, width), POISON, dtype=torch.int32, device=device)
        _state["arena_pos"] = torch.full((MAX_SLOTS, MAX_ROWS), POISON, dtype=torch.int64, device=device)
        _state["arena_seq"] = torch.full((MAX_SLOTS, MAX_ROWS), POISON, dtype=torch.int64, device=device)
    return _state["arena_topk"], _state["arena_pos"]


def _after_indexer(result, self, x, q_lora, positions, forward_batch, layer_id, *args, **kwargs):
    """AFTER hook of ``Indexer.forward_cuda``: keep the top-k of small calls (returns ``None``: result unchanged)."""
    import torch
    from sglang.srt.model_executor.runner_utils.capture_mode import get_is_capture_mode

    if not isinstance(result, torch.Tensor) or result.dim() != 2 or result.shape[0] == 0:
        return None
    rows = int(result.shape[0])
    mode = forward_batch.forward_mode.name
    if rows > MAX_ROWS or mode == "IDLE":
        return None
    arena_topk, arena_pos = _arena(int(result.shape[1]), result.device)
    pos = positions[:rows].to(torch.int64)
    # The batch's sequence lengths as the forward holds them (one per request): a draft decode step's indexer sees
    # this many keys whatever its step (SGLang's multi-step draft backend shares one metadata over the steps).
    seq = forward_batch.seq_lens[:rows].to(torch.int64)
    n_seq = int(seq.shape[0])
    if _capturing():
        k = len(_state["slots"])
        if k >= MAX_SLOTS:
            raise RuntimeError(f"fp4_indexer_topk_trace: more than MAX_SLOTS={MAX_SLOTS} captured indexer calls")
        arena_topk[k, :rows].copy_(result.to(torch.int32))  # captured: every replay writes the slot
        arena_pos[k, :rows].copy_(pos)
        _state["arena_seq"][k, :n_seq].copy_(seq)
        _state["slots"].append({"layer": int(layer_id), "mode": mode, "rows": rows, "seq": k, "requests": n_seq})
    elif not get_is_capture_mode():  # an eager call of a real batch (not a capture's warm-up run)
        _state["eager"].append({"layer": int(layer_id), "mode": mode, "rows": rows, "graph": False,
                                "topk": result.to(torch.int32).clone(), "pos": pos.clone(), "seq_lens": seq.clone()})
    return None


def _oracle_arena(q_bytes: int, heads: int, device):
    """The oracle's slots (``ORACLE_SLOTS``), allocated once outside any capture as ``_arena`` is: per slot the
    rows' index-query bytes, weights (fp32), page-table rows (``MAX_PAGES`` columns), key counts, top-k and
    positions."""
    import torch

    if "oracle_q" not in _state:
        if _capturing():
            raise RuntimeError("fp4_indexer_topk_trace: the first paged call came inside a CUDA-graph capture")
        _state["oracle_q"] = torch.zeros((ORACLE_SLOTS, MAX_ROWS, q_bytes), dtype=torch.uint8, device=device)
        _state["oracle_w"] = torch.zeros((ORACLE_SLOTS, MAX_ROWS, heads), dtype=torch.float32, device=device)
        _state["oracle_bt"] = torch.full((ORACLE_SLOTS, MAX_ROWS, MAX_PAGES), -1, dtype=torch.int32, device=device)
        _state["oracle_lens"] = torch.full((ORACLE_SLOTS, MAX_ROWS), POISON, dtype=torch.int32, device=device)
        _state["oracle_topk"] = torch.full((ORACLE_SLOTS, MAX_ROWS, 1), POISON, dtype=torch.int32, device=device)
        _state["oracle_pos"] = torch.full((ORACLE_SLOTS, MAX_ROWS), POISON, dtype=torch.int64, device=device)
    return _state


def _after_paged(result, self, forward_batch, layer_id, q_fp8, weights, metadata, *args, **kwargs):
    """AFTER hook of ``Indexer._get_topk_paged`` for ``oracle_layers()``: keep the scorer's inputs and top-k
    (returns ``None``: result unchanged). The pool the call reads is remembered by (mode, layer) for
    ``_after_run_batch``, which copies the pages out."""
    import torch
    from sglang.srt.model_executor.forward_context import get_token_to_kv_pool
    from sglang.srt.model_executor.runner_utils.capture_mode import get_is_capture_mode

    layer, mode = int(layer_id), forward_batch.forward_mode.name
    if layer not in oracle_layers() or not isinstance(result, torch.Tensor) or result.dim() != 2:
        return None
    rows = int(result.shape[0])
    if rows == 0 or rows > MAX_ROWS or mode == "IDLE":
        return None
    _state["pools"].setdefault((mode, layer), get_token_to_kv_pool())
    q = q_fp8[:rows].reshape(rows, -1)
    q = q.view(torch.uint8) if q.element_size() == 1 else q.contiguous().view(torch.uint8)
    w = weights.reshape(weights.shape[0], -1)[:rows].float()
    per_row = mode in ("TARGET_VERIFY", "DRAFT_EXTEND_V2")  # as SGLang's scorer call: one key count per query row
    lens = (metadata.get_seqlens_expanded() if per_row else metadata.get_seqlens_int32())[:rows]
    bt = metadata.get_page_table_64()[:rows]  # one row per request
    pos = forward_batch.positions[:rows].to(torch.int64)
    forced = {"init": int(getattr(self, "num_init_tokens", 0)), "local": int(getattr(self, "num_local_tokens", 0))}
    cols = min(int(bt.shape[1]), MAX_PAGES)
    st = _oracle_arena(int(q.shape[1]), int(w.shape[1]), result.device)
    if st["oracle_topk"].shape[2] != result.shape[1]:
        if _capturing():
            raise RuntimeError("fp4_indexer_topk_trace: the oracle arena's top-k width is set by an eager call first")
        st["oracle_topk"] = torch.full((ORACLE_SLOTS, MAX_ROWS, int(result.shape[1])), POISON, dtype=torch.int32,
                                       device=result.device)
    if _capturing():
        k = len(_state["oracle_slots"])
        if k >= ORACLE_SLOTS:
            raise RuntimeError(f"fp4_indexer_topk_trace: more than ORACLE_SLOTS={ORACLE_SLOTS} captured oracle calls")
        st["oracle_q"][k, :rows].copy_(q)  # captured: every replay writes the slot
        st["oracle_w"][k, :rows].copy_(w)
        st["oracle_bt"][k, : bt.shape[0], :cols].copy_(bt[:, :cols].to(torch.int32))
        st["oracle_lens"][k, :rows].copy_(lens.to(torch.int32))
        st["oracle_topk"][k, :rows].copy_(result.to(torch.int32))
        st["oracle_pos"][k, :rows].copy_(pos)
        _state["oracle_slots"].append({"layer": layer, "mode": mode, "rows": rows, "seq": k, "forced": forced,
                                       "requests": int(bt.shape[0])})
    elif not get_is_capture_mode():
        _state["oracle_eager"].append({"layer": layer, "mode": mode, "rows": rows, "graph": False, "q": q.clone(),
                                       "forced": forced,
                                       "weights": w.clone(), "block_table": bt[:, :cols].to(torch.int32).clone(),
                                       "lens": lens.to(torch.int32).clone(), "topk": result.to(torch.int32).clone(),
                                       "pos": pos.clone()})
    return None


def _oracle_calls(keep: bool = True) -> list[dict]:
    """The oracle calls written since the last batch (eager ones and every arena slot written), on the CPU, each
    with the cache pages its first request reads (``pages``: uint8 ``[pages, page bytes]``, in the order of its
    page-table row, as many as the call's longest row needs); the slots are poisoned again. ``keep`` False: only
    the poisoning (a batch left out of the sample), and ``[]``."""
    import torch

    calls = list(_state["oracle_eager"])
    _state["oracle_eager"].clear()
    if _state["oracle_slots"]:
        written = (_state["oracle_lens"][:, 0] != POISON).nonzero().flatten().tolist()
        for k in written:
            s = _state["oracle_slots"][k]
            r = s["rows"]
            calls.append({"layer": s["layer"], "mode": s["mode"], "rows": r, "graph": True, "seq": k,
                          "q": _state["oracle_q"][k, :r].clone(), "weights": _state["oracle_w"][k, :r].clone(),
                          "block_table": _state["oracle_bt"][k, : s["requests"]].clone(),
                          "lens": _state["oracle_lens"][k, :r].clone(), "forced": s["forced"],
                          "topk": _state["oracle_topk"][k, :r].clone(), "pos": _state["oracle_pos"][k, :r].clone()})
        if written:
            _state["oracle_lens"][written] = POISON
    if not keep:
        return []
    out = []
    for c in calls:
        pool = _state["pools"].get((c["mode"], c["layer"]))
        if pool is None:
            continue
        buf = pool.get_index_k_with_scale_buffer(layer_id=c["layer"])
        n = int(c["lens"].max())  # at least what any row of the first request sees; keys past its own are unused
        if n <= 0:
            continue
        # EXTRA_KEYS more keys' pages where the row has them: a failing row is also tried at a few key counts
        # around its own (``oracle_check``'s examples), which says whether the scorer saw more or fewer keys.
        pages = min(-(-(n + EXTRA_KEYS) // 64), int(c["block_table"].shape[1]))
        ids = c["block_table"][0, :pages].to(torch.int64).clamp(0, buf.shape[0] - 1)
        out.append(dict({k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in c.items()},
                        pages=buf[ids].cpu(), page_bytes=int(buf.shape[-1])))
    return out


def _after_run_batch(result, self, batch, *args, **kwargs):
    """AFTER hook of ``Scheduler.run_batch``: save what this batch's forward passes wrote (returns ``None``)."""
    import torch

    if not _state["slots"] and not _state["eager"] and not _state["oracle_slots"] and not _state["oracle_eager"]:
        return None
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    _state["batches"] += 1
    keep = (_state["batches"] - 1) % every() == 0
    oracle = _oracle_calls(keep) if oracle_layers() else []
    calls = [dict(c, topk=c["topk"].cpu(), pos=c["pos"].cpu(), seq_lens=c["seq_lens"].cpu())
             for c in _state["eager"]] if keep else []
    _state["eager"].clear()
    if _state["slots"] and not keep:  # a batch left out of the sample: poison what it wrote, copy nothing out
        arena_topk, arena_pos, arena_seq = _state["arena_topk"], _state["arena_pos"], _state["arena_seq"]
        written = arena_pos[:, 0] != POISON
        arena_topk.masked_fill_(written[:, None, None], POISON)
        arena_pos.masked_fill_(written[:, None], POISON)
        arena_seq.masked_fill_(written[:, None], POISON)
    elif _state["slots"]:
        arena_topk, arena_pos, arena_seq = _state["arena_topk"], _state["arena_pos"], _state["arena_seq"]
        written = (arena_pos[:, 0] != POISON).nonzero().flatten().tolist()
        for k in written:
            s = _state["slots"][k]
            calls.append({"layer": s["layer"], "mode": s["mode"], "rows": s["rows"], "graph": True, "seq": k,
                          "topk": arena_topk[k, :s["rows"]].cpu(), "pos": arena_pos[k, :s["rows"]].cpu(),
                          "seq_lens": arena_seq[k, :s["requests"]].cpu()})
        if written:
            arena_topk[written] = POISON
            arena_pos[written] = POISON
            arena_seq[written] = POISON
    if not keep or (not calls and not oracle):
        return None
    req_to_token = self.req_to_token_pool.req_to_token
    reqs = list(getattr(batch, "reqs", []) or [])
    slots = []
    for r in reqs:
        idx = getattr(getattr(r, "kv", None), "req_pool_idx", getattr(r, "req_pool_idx", None))
        n = len(r.origin_input_ids) + len(r.output_ids) + 16  # the draft tokens' slots too
        slots.append(req_to_token[int(idx), :n].to(torch.int64).cpu() if idx is not None else None)
    record = {"forward_mode": batch.forward_mode.name, "batch_size": len(reqs),
              "prompt_lens": [len(r.origin_input_ids) for r in reqs],
              "req_lens": [len(r.origin_input_ids) + len(r.output_ids) for r in reqs],
              "req_slots": slots, "calls": calls, "oracle_calls": oracle}
    out_dir = os.environ[ENV]
    os.makedirs(out_dir, exist_ok=True)
    torch.save(record, os.path.join(out_dir, f"{os.getpid()}_{_state['n']:05d}.pt"))
    _state["n"] += 1
    return None


def read_trace(directory: str) -> list[dict]:
    """The records saved under ``directory``, in the order they were written (per process, then by number).

    Raises:
        FileNotFoundError: ``directory`` holds no record.
    """
    import torch

    names = sorted(f for f in os.listdir(directory) if f.endswith(".pt"))
    if not names:
        raise FileNotFoundError(f"no top-k trace records in {directory}")
    names.sort(key=lambda f: (int(f.split("_")[0]), int(f.split("_")[1][:-3])))
    return [torch.load(os.path.join(directory, f), weights_only=False) for f in names]


def slot_positions(slots, last: int) -> dict[int, int]:
    """A request's KV slot -> token position, over positions ``0..last`` (its last query position): the
    ``req_to_token`` row's entries past it are stale and may repeat one of the request's own slots.

    Args:
        slots: the record's ``req_slots`` entry (int64 ``[n]``) or None (then no slot maps).
        last: the last position a row of the record may attend.
    """
    where: dict[int, int] = {}
    for p, s in enumerate(slots.tolist()[:last + 1] if slots is not None else []):
        where.setdefault(int(s), p)
    return where


def decode_rows(records: list[dict]):
    """Each decode row of the records of one request per batch, as token positions.

    Top-k entries are KV slots (SGLang's page-table transform), mapped back to the request's token positions
    by ``slot_positions`` up to the record's last query position; a slot that is not among them is kept as
    ``-1 - slot``. Records of
    other forward modes or of batches of several requests are left out.

    Yields:
        ``(prompt_len, layer, query position, sorted positions)``, in the order the records hold them.
    """
    for rec in records:
        if rec.get("forward_mode") != "DECODE" or rec.get("batch_size") != 1:
            continue
        last = max((int(p) for call in rec["calls"] for p in call["pos"].tolist()), default=-1)
        where = slot_positions(rec["req_slots"][0], last)
        for call in rec["calls"]:
            if call["mode"] != "DECODE":
                continue
            for i, row in enumerate(call["topk"].tolist()):
                yield (rec["prompt_lens"][0], int(call["layer"]), int(call["pos"][i]),
                       sorted(where.get(v, -1 - v) for v in row if v >= 0))
