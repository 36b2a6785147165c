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

_state = {"slots": [], "eager": [], "n": 0, "capture_seq": 0}


def register() -> None:
    """Entry point: register the two AFTER hooks when ``FP4_INDEXER_TOPK_TRACE_DIR`` is set (else nothing)."""
    if not os.environ.get(ENV):
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register("sglang.srt.layers.attention.dsa.dsa_indexer.Indexer.forward_cuda",
                          _after_indexer, HookType.AFTER)
    HookRegistry.register("sglang.srt.managers.scheduler.Scheduler.run_batch", _after_run_batch, HookType.AFTER)


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
    if _capturing():
        k = len(_state["slots"])
        if k >= MAX_SLOTS:
            raise RuntimeError(f"fp4_indexer_topk_trace: more than MAX_SLOTS={MAX_SLOTS} captured indexer calls")
        arena_topk[k, :rows].copy_(result.to(torch.int32))  # captured: every replay writes the slot
        arena_pos[k, :rows].copy_(pos)
        _state["slots"].append({"layer": int(layer_id), "mode": mode, "rows": rows, "seq": k})
    elif not get_is_capture_mode():  # an eager call of a real batch (not a capture's warm-up run)
        _state["eager"].append({"layer": int(layer_id), "mode": mode, "rows": rows, "graph": False,
                                "topk": result.to(torch.int32).clone(), "pos": pos.clone()})
    return None


def _after_run_batch(result, self, batch, *args, **kwargs):
    """AFTER hook of ``Scheduler.run_batch``: save what this batch's forward passes wrote (returns ``None``)."""
    import torch

    if not _state["slots"] and not _state["eager"]:
        return None
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    calls = [dict(c, topk=c["topk"].cpu(), pos=c["pos"].cpu()) for c in _state["eager"]]
    _state["eager"].clear()
    if _state["slots"]:
        arena_topk, arena_pos = _state["arena_topk"], _state["arena_pos"]
        written = (arena_pos[:, 0] != POISON).nonzero().flatten().tolist()
        for k in written:
            s = _state["slots"][k]
            calls.append({"layer": s["layer"], "mode": s["mode"], "rows": s["rows"], "graph": True, "seq": k,
                          "topk": arena_topk[k, :s["rows"]].cpu(), "pos": arena_pos[k, :s["rows"]].cpu()})
        if written:
            arena_topk[written] = POISON
            arena_pos[written] = POISON
    if not calls:
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
              "req_slots": slots, "calls": calls}
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
