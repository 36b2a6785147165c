"""The scorers the benchmark times side by side, behind one small interface.

* ``OursScorer``: this project's paged scorer as the plugin calls it: the
  launcher of the shape's configuration resolved once
  (``ops.paged_logits.paged_scorer``, what ``paged_logits`` and the serving
  path run), with its CTA schedule planned once outside the timed graph
  (``ops.schedule.plan_paged_schedule`` with the op's default ``block_kv`` and
  ``ops.grid.default_num_ctas``), writing into preallocated outputs poisoned
  with NaN; its host time with the logits allocated per call, as the plugin's
  hook does.
* ``SGLangFP4Scorer``: SGLang 0.5.23's Triton FP4 scorer
  ``fp4_index_logits_paged`` on the *same cache bytes*: SGLang's DSv4 index-K
  page is this project's page layout (``page_size * 64`` payload bytes, then
  ``page_size * 4`` UE8M0 bytes, token row ``r`` at scale row ``r``), so the
  cache is passed as is. Its request table holds one cache slot per position
  (``req_table[b, j] = block_table[b, j // 64] * 64 + j % 64``, exactly
  ``reference.paged_slots``); ``req`` maps each query row to its request and
  ``lens`` gives each row's visible keys (``reference.expand_context_lens``);
  queries go in as bf16 (exact for e4m3 values); ``ratio = 1`` (no compression).
* ``DeepGemmFP8Scorer``: DeepGEMM's ``fp8_paged_mqa_logits`` on an FP8 copy of
  the same keys in SGLang's FP8 index layout (per page: ``64 x 128`` e4m3 bytes,
  then 64 fp32 scales; viewed ``[pages, 64, 1, 132]``), scales rounded to powers
  of two so the copy is exact (checked when built), its schedule from
  ``get_paged_mqa_logits_metadata`` planned once outside the graph,
  ``clean_logits=False`` as SGLang calls it.
* ``DeepGemmSm90MulticastScorer``: DeepGEMM's newer SM90 paged kernel (the vLLM 0.34.0 header that takes
  next_n 4 on a cluster of 2 CTAs) through this project's launcher, ``bench.deepgemm_sm90_paged``, on the same
  FP8 copy; next_n 1, 2 and 4 natively, H 32 and 64; its schedule planned once outside the graph
  (``plan_schedule``, checked by ``schedule_problem``), its logits preallocated with rows padded to 256
  columns and poisoned with NaN; its first call waited for with a time limit (``first_call_watchdog``).

A peer that cannot run says why (``unavailable_reason``) and the benchmark
prints ``unavailable: <reason>`` in its place.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch

from ..format import INDEX_HEAD_DIM, dequantize_index_k
from ..pool import FP4_INDEX_BYTES_PER_TOKEN, FP8_INDEX_BYTES_PER_TOKEN, PAGE_SIZE, read_index_k
from ..reference import expand_context_lens, fp8_dequantize_rows, fp8_quantize_rows
from .checks import DEEPGEMM_REL, OURS_REL, SGLANG_REL
from .floor import logits_width, table_width
from .inputs import ScorerInputs
from .shapes import ScorerShape
from .timing import rotation_sets

__all__ = [
    "PreparedScorer",
    "Scorer",
    "OursScorer",
    "SGLangFP4Scorer",
    "DeepGemmFP8Scorer",
    "DeepGemmSm90MulticastScorer",
    "first_call_watchdog",
    "SCORER_NAMES",
    "make_scorers",
    "fp8_index_cache_from_fp4",
    "sglang_request_table",
]


@dataclass
class PreparedScorer:
    """A scorer bound to one shape's inputs.

    Attributes:
        fn: ``fn(set_index) -> logits`` (capturable on CUDA).
        sets: rotation sets it cycles through.
        rel: its check tolerance (``checks``).
        writes_all: whether its contract writes every element (``-inf`` tails).
        case_bytes: bytes of one call's working set (cache + logits), for the record.
        floor: its tolerance adds ``checks.Expected.floor`` (the Hopper kernel's absolute terms).
        host_fn: the call whose host time is measured eagerly (``timing.time_host``), as its serving caller
            makes it (``None``: ``fn``).
    """

    fn: Callable[[int], torch.Tensor]
    sets: int
    rel: float
    writes_all: bool
    case_bytes: int
    floor: bool = False
    host_fn: Callable[[int], torch.Tensor] | None = None


class Scorer:
    """Interface of a benchmarked scorer.

    Attributes:
        name: column name.
        key_bytes: cache bytes per key of its format (its HBM floor: 68 or 132).
        label: one line saying what it is.
        ran: the formulation that ran, set by ``prepare`` where it is chosen per call (ours), else None.
    """

    name = "scorer"
    key_bytes = FP4_INDEX_BYTES_PER_TOKEN
    label = ""
    ran: str | None = None

    def unavailable_reason(self, device: torch.device) -> str | None:
        """``None`` when it can run on ``device``, else why not (shown as ``unavailable: <reason>``)."""
        return None

    def shape_reason(self, shape: ScorerShape) -> str | None:
        """``None`` when it can score ``shape``, else why not (that row's cell is ``unavailable``, no failure)."""
        return None

    def prepare(self, inputs: ScorerInputs, l2_bytes: int | None) -> PreparedScorer:
        """Bind to ``inputs`` (allocate outputs, plan schedules, convert caches) outside any timing."""
        raise NotImplementedError


def _case_bytes(shape: ScorerShape, key_bytes: int) -> int:
    return shape.batch * table_width(shape) * key_bytes + shape.rows * logits_width(shape) * 4


class OursScorer(Scorer):
    """This project's paged FP4 scorer (module docstring).

    Args:
        impl: ``paged_logits``'s ``impl`` variant, or ``None`` for the op's default.
    """

    key_bytes = FP4_INDEX_BYTES_PER_TOKEN

    def __init__(self, impl: str | None = None):
        self.impl = impl
        self.name = "ours" if impl is None else f"ours[{impl}]"
        self.label = ("sglang_fp4_indexer.ops.paged_logits.paged_scorer, as the plugin calls it"
                      + ("" if impl is None else f" (impl={impl!r})"))

    def prepare(self, inputs: ScorerInputs, l2_bytes: int | None) -> PreparedScorer:
        from ..ops import paged_logits as pl
        from ..ops.grid import default_num_ctas
        from ..ops.schedule import plan_paged_schedule

        shape, dev = inputs.shape, inputs.device
        block_kv, num_ctas = pl.default_block_kv(dev, self.impl), default_num_ctas(dev, self.impl)
        schedule = plan_paged_schedule(inputs.context_lens, block_kv, num_ctas)
        case = _case_bytes(shape, self.key_bytes)
        sets = min(len(inputs.caches), rotation_sets(case, l2_bytes))
        outs = [torch.full((shape.rows, inputs.width), float("nan"), device=dev) for _ in range(sets)]
        q, w, bt, lens, caches, width = (
            inputs.q, inputs.weights, inputs.block_table, inputs.context_lens, inputs.caches, inputs.width,
        )
        # A live server's width (shape.width) is scored as the plugin calls it: clean_logits=False, the
        # columns past each request's last page left to SGLang's top-k, which masks by length.
        clean = not shape.width
        scorer = pl.paged_scorer(dev, shape.heads, shape.next_n, lens_2d=lens.dim() == 2, block_kv=block_kv,
                                 clean_logits=clean, q_dtype=q.dtype, impl=self.impl or "auto")
        self.ran = scorer.kernel  # which formulation runs (recorded in the report: "auto" resolved per shape)

        def fn(s: int) -> torch.Tensor:
            return scorer(q, w, caches[s], bt, lens, schedule, outs[s])

        def host_fn(s: int) -> torch.Tensor:  # the plugin's hook allocates the logits of every call
            return scorer(q, w, caches[s], bt, lens, schedule, torch.empty((shape.rows, width), device=dev))

        # The Hopper kernel's bound: its f16 accumulation and head sum (sm90.rel_bound()) and the absolute
        # terms of its decode's rounding and f16 subnormals (sm90.logit_error_floor, checks.Expected.floor).
        if self.ran == "wgmma":
            from ..ops import sm90

            return PreparedScorer(fn, sets, sm90.rel_bound(), clean, case, floor=True, host_fn=host_fn)
        return PreparedScorer(fn, sets, OURS_REL, clean, case, host_fn=host_fn)


def sglang_request_table(block_table: torch.Tensor, width: int, page_size: int = PAGE_SIZE) -> torch.Tensor:
    """SGLang's per-position slot table from a block table: int32 ``[B, width]``.

    ``table[b, j] = block_table[b, j // page_size] * page_size + j % page_size``
    (``reference.paged_slots`` for every position at once).

    Raises:
        ValueError: ``width`` exceeds the block table's capacity.
    """
    if width > block_table.shape[1] * page_size:
        raise ValueError(f"width: {width} positions exceed the block table's {block_table.shape[1]} pages")
    j = torch.arange(width, device=block_table.device)
    return (block_table.to(torch.int64)[:, j // page_size] * page_size + j % page_size).to(torch.int32).contiguous()


class _PeerScorer(Scorer):
    """A peer loaded on first use; ``unavailable_reason`` reports a missing device or a failed import."""

    #: Why the peer cannot run on a non-CUDA device.
    cpu_reason = "needs a CUDA device"

    def __init__(self):
        self._module = None
        self._reason: str | None = None
        self._loaded = False

    def _load(self):
        """Import and return the peer's module (raises when it cannot)."""
        raise NotImplementedError

    def unavailable_reason(self, device: torch.device) -> str | None:
        if device.type != "cuda":
            return self.cpu_reason
        if not self._loaded:
            self._loaded = True
            try:
                self._module = self._load()
            except Exception as exc:  # any import failure (a wheel for another torch too) is a reason, not a crash
                self._reason = f"{type(exc).__name__}: {exc}"
        return self._reason


class SGLangFP4Scorer(_PeerScorer):
    """SGLang's Triton FP4 scorer, loaded through ``peers.load_sglang_fp4_indexer`` (module docstring)."""

    name = "sglang-triton-fp4"
    key_bytes = FP4_INDEX_BYTES_PER_TOKEN
    label = "sglang.kernels.ops.attention.dsv4.fp4_indexer.fp4_index_logits_paged"
    cpu_reason = (
        "needs a CUDA device (it reads the SM count through torch.cuda, and the bf16 dot it "
        "uses is unreliable under the Triton CPU interpreter)"
    )

    def _load(self):
        from .peers import load_sglang_fp4_indexer

        return load_sglang_fp4_indexer()

    def prepare(self, inputs: ScorerInputs, l2_bytes: int | None) -> PreparedScorer:
        shape, dev = inputs.shape, inputs.device
        # SGLang's table also reads 4 B of slot per position: part of its working set.
        case = _case_bytes(shape, self.key_bytes) + shape.batch * inputs.width * 4
        sets = min(len(inputs.caches), rotation_sets(case, l2_bytes))
        req_table = sglang_request_table(inputs.block_table, table_width(shape))
        if inputs.width > req_table.shape[1]:  # a live server's table: slots past the context unused (0)
            req_table = torch.nn.functional.pad(req_table, (0, inputs.width - req_table.shape[1])).contiguous()
        req = (torch.arange(shape.rows, device=dev) // shape.next_n).to(torch.int32)
        lens = expand_context_lens(inputs.context_lens, shape.next_n).reshape(-1).to(torch.int32).contiguous()
        q = inputs.q.to(torch.bfloat16).contiguous()
        w, caches, width = inputs.weights, inputs.caches, inputs.width
        score = self._module.fp4_index_logits_paged

        def fn(s: int) -> torch.Tensor:
            return score(q, w, req, req_table, lens, caches[s], PAGE_SIZE, width, 1)

        return PreparedScorer(fn, sets, SGLANG_REL, False, case)


def fp8_index_cache_from_fp4(cache: torch.Tensor, page_size: int = PAGE_SIZE, chunk_pages: int = 2048) -> torch.Tensor:
    """An FP8 copy of an FP4 cache in SGLang's FP8 index layout (exact for the benchmark's keys, checked).

    Each key is decoded exactly (``pool.read_index_k`` + ``format.dequantize_index_k``)
    and re-quantized with ``reference.fp8_quantize_rows(..., "ue8m0")`` (e4m3 with
    one power-of-two scale per key), exact while a key's group scales lie
    within ``2**14`` of each other (``inputs.SCALE_CODES`` spans 2**7). Page layout: ``page_size * 128`` e4m3
    bytes, then ``page_size`` fp32 scales (132 B per token).

    Returns:
        uint8 ``[num_pages, page_size * 132]`` on the cache's device.

    Raises:
        ValueError: the copy is not exact for some key (its group scales are too
            far apart for one e4m3 scale).
    """
    num_pages = cache.shape[0]
    out = torch.empty((num_pages, page_size * FP8_INDEX_BYTES_PER_TOKEN), dtype=torch.uint8, device=cache.device)
    rows = torch.arange(page_size, device=cache.device)
    for p0 in range(0, num_pages, chunk_pages):
        pages = torch.arange(p0, min(p0 + chunk_pages, num_pages), device=cache.device)
        slots = (pages[:, None] * page_size + rows[None, :]).reshape(-1)
        keys = dequantize_index_k(*read_index_k(cache, slots, page_size))
        values, scales = fp8_quantize_rows(keys, "ue8m0")
        if not torch.equal(fp8_dequantize_rows(values, scales), keys):
            raise ValueError("cache: a key's group scales are too far apart for an exact FP8 copy")
        n = pages.numel()
        block = out[p0 : p0 + n]
        block[:, : page_size * INDEX_HEAD_DIM] = values.view(torch.uint8).reshape(n, page_size * INDEX_HEAD_DIM)
        block[:, page_size * INDEX_HEAD_DIM :] = scales.contiguous().view(torch.uint8).reshape(n, page_size * 4)
    return out


class DeepGemmFP8Scorer(_PeerScorer):
    """DeepGEMM's ``fp8_paged_mqa_logits`` on an exact FP8 copy of the keys (module docstring).

    Args:
        native: ``False`` (column ``deepgemm-fp8``): called as SGLang 0.5.23 calls it on this GPU -- for
            target verify (next_n >= 2) on Hopper one row per request (``next_n = 1``, the block-table
            row repeated; SGLang enables DeepGEMM's native next_n on SM100 only), natively elsewhere.
            ``True`` (column ``deepgemm-fp8-native``): DeepGEMM's native next_n wherever DeepGEMM takes
            it (``DEEPGEMM_SM90_MAX_NEXT_N`` on Hopper), the faster form SGLang does not use on Hopper yet.
    """

    key_bytes = FP8_INDEX_BYTES_PER_TOKEN

    def __init__(self, native: bool = False):
        super().__init__()
        self.native = native
        self.name = "deepgemm-fp8-native" if native else "deepgemm-fp8"
        self.label = ("deep_gemm.fp8_paged_mqa_logits (FP8 cache, 132 B/key), "
                      + ("native next_n" if native else "as SGLang 0.5.23 calls it on this GPU"))

    def _load(self):
        from .peers import load_deep_gemm

        return load_deep_gemm()

    def prepare(self, inputs: ScorerInputs, l2_bytes: int | None) -> PreparedScorer:
        from ..ops.deepgemm import read_api

        shape, dev = inputs.shape, inputs.device
        dg = self._module
        case = _case_bytes(shape, self.key_bytes)
        sets = min(len(inputs.caches), rotation_sets(case, l2_bytes))
        first = fp8_index_cache_from_fp4(inputs.caches[0])
        kv = [first] + [first.clone() for _ in range(sets - 1)]
        kv = [c.view(c.shape[0], PAGE_SIZE, 1, FP8_INDEX_BYTES_PER_TOKEN) for c in kv]
        num_sms = torch.cuda.get_device_properties(dev).multi_processor_count
        hopper = torch.cuda.get_device_capability(dev)[0] == 9
        split_above = (DEEPGEMM_SM90_MAX_NEXT_N if hopper else 1 << 30) if self.native else (1 if hopper else 1 << 30)
        q, lens, bt = deepgemm_paged_inputs(inputs.q, inputs.context_lens, inputs.block_table, shape.next_n,
                                            split_above)
        schedule = dg.get_paged_mqa_logits_metadata(lens, PAGE_SIZE, num_sms)
        w, width = inputs.weights, inputs.width

        paged = read_api(dg).paged  # fp8_paged_mqa_logits (sgl-deep-gemm 0.2.3) or fp8_fp4_paged_mqa_logits (0.2.5)

        def fn(s: int) -> torch.Tensor:
            return paged(q, kv[s], w, lens, bt, schedule, width, False)

        return PreparedScorer(fn, sets, DEEPGEMM_REL, False, case)


#: Environment variable: seconds ``first_call_watchdog`` waits for a peer's first call (default 30).
WATCHDOG_ENV = "SGLANG_FP4_INDEXER_PEER_WATCHDOG_S"
#: Exit status of a benchmark stopped by ``first_call_watchdog``.
HANG_EXIT = 3


def first_call_watchdog(fn: Callable[[int], torch.Tensor], device: torch.device, what: str,
                        seconds: float | None = None) -> None:
    """Run ``fn(0)`` once on ``device`` and wait for it at most ``seconds`` (default ``$WATCHDOG_ENV`` or 30).

    A kernel that never finishes (a TMA transaction count or schedule the launcher got wrong) would hang every
    later CUDA call of the process, the benchmark's own checks included, until the run's outer time limit.
    So the first call of a peer whose launcher is this project's is waited for by polling an event: past the
    limit one line goes to stderr and the process exits at once with status ``HANG_EXIT`` (3), which ends the
    hung kernel with the process's context (the report written after the last finished shape stays).

    Raises:
        whatever ``fn`` raises (a launch refused with a message is an error, not a hang).
    """
    limit = float(os.environ.get(WATCHDOG_ENV) or 30) if seconds is None else seconds
    torch.cuda.synchronize(device)
    fn(0)
    done = torch.cuda.Event()
    done.record(torch.cuda.current_stream(device))
    t0 = time.monotonic()
    while not done.query():
        if time.monotonic() - t0 > limit:
            sys.stdout.flush()
            print(f"sglang-fp4-indexer bench: {what}: its first call did not finish in {limit:g} s (a hung kernel); "
                  f"stopping the benchmark (exit {HANG_EXIT})", file=sys.stderr, flush=True)
            os._exit(HANG_EXIT)
        time.sleep(0.002)


class DeepGemmSm90MulticastScorer(Scorer):
    """DeepGEMM's newer SM90 paged kernel through ``bench.deepgemm_sm90_paged`` on an exact FP8 copy (module docstring).

    Available on an SM90 GPU with nvcc and the packed headers (``bench.deepgemm_sm90_paged.unavailable_reason``);
    shapes of another next_n or head count are ``unavailable`` in their row (``shape_reason``).
    """

    name = "deepgemm-fp8-sm90-multicast"
    key_bytes = FP8_INDEX_BYTES_PER_TOKEN
    label = ("DeepGEMM sm90_fp8_paged_mqa_logits, vLLM 0.34.0's header (next_n 4 on a 2-CTA cluster), this "
             "project's launcher (FP8 cache, 132 B/key, native next_n 1/2/4)")

    def __init__(self):
        self._reasons: dict[str, str | None] = {}

    def unavailable_reason(self, device: torch.device) -> str | None:
        from . import deepgemm_sm90_paged as dg90

        key = str(device)
        if key not in self._reasons:
            self._reasons[key] = dg90.unavailable_reason(device)
        return self._reasons[key]

    def shape_reason(self, shape: ScorerShape) -> str | None:
        from . import deepgemm_sm90_paged as dg90

        return dg90.config_problem(shape.next_n, shape.heads)

    def prepare(self, inputs: ScorerInputs, l2_bytes: int | None) -> PreparedScorer:
        from . import deepgemm_sm90_paged as dg90

        shape, dev = inputs.shape, inputs.device
        case = _case_bytes(shape, self.key_bytes)
        sets = min(len(inputs.caches), rotation_sets(case, l2_bytes))
        first = fp8_index_cache_from_fp4(inputs.caches[0])
        kv = [first] + [first.clone() for _ in range(sets - 1)]
        lens = expand_context_lens(inputs.context_lens, shape.next_n).to(torch.int32).contiguous()
        q, w, bt, width = inputs.q.contiguous(), inputs.weights, inputs.block_table, inputs.width
        num_sms = torch.cuda.get_device_properties(dev).multi_processor_count
        schedule = dg90.plan_schedule(lens, num_sms // dg90.kv_multicast(shape.next_n))
        why = (dg90.schedule_problem(schedule, lens, max_keys=bt.shape[1] * PAGE_SIZE)
               or dg90.table_problem(bt, lens, first.shape[0]))
        if why:
            raise RuntimeError(f"{self.name}: {why}")
        max_context = int(lens.max())
        outs = [dg90.padded_logits(shape.rows, width, dev, fill=float("nan")) for _ in range(sets)]
        for c in kv:
            dg90.validate_call(q, c, w, lens, bt, schedule, outs[0], max_context)
        score = dg90.launcher(dev, shape.next_n, shape.heads)

        def fn(s: int) -> torch.Tensor:
            return score(q, kv[s], w, lens, bt, schedule, outs[s], max_context, validate=False)

        first_call_watchdog(fn, dev, f"{self.name} at {shape.label}")
        return PreparedScorer(fn, sets, DEEPGEMM_REL, False, case)


#: Largest next_n DeepGEMM's SM90 paged scorer takes in one call; above it the
#: rows are scored one per "request", as SGLang does on Hopper.
DEEPGEMM_SM90_MAX_NEXT_N = 2


def deepgemm_paged_inputs(
    q: torch.Tensor, context_lens: torch.Tensor, block_table: torch.Tensor, next_n: int,
    split_above: int = DEEPGEMM_SM90_MAX_NEXT_N,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DeepGEMM ``fp8_paged_mqa_logits`` arguments for ``batch`` requests of ``next_n`` rows.

    DeepGEMM takes per-row visible lengths as int32 ``[B, next_n]`` (row ``i``
    of a request of length ``ctx`` sees ``ctx - next_n + i + 1`` keys,
    ``reference.expand_context_lens``) and, on SM90, ``next_n <= 2``. Above
    ``split_above`` each row becomes its own request (``next_n = 1``, its
    block-table row repeated), which is how SGLang 0.5.23 calls it for target
    verify on Hopper (``split_above = 1``).

    Args:
        q: e4m3 ``[B * next_n, H, 128]`` index queries.
        context_lens: int32 ``[B]`` request lengths.
        block_table: int32 ``[B, max_pages]``.
        next_n: query rows per request.
        split_above: largest next_n passed natively.

    Returns:
        ``(q [B', n', H, 128], context_lens int32 [B', n'], block_table int32 [B', max_pages])``.
    """
    rows, heads, dim = q.shape
    lens = expand_context_lens(context_lens, next_n).to(torch.int32)
    if next_n > split_above:
        return (q.view(rows, 1, heads, dim), lens.reshape(rows, 1).contiguous(),
                block_table.repeat_interleave(next_n, dim=0).contiguous())
    return q.view(rows // next_n, next_n, heads, dim), lens.contiguous(), block_table


#: Scorer names accepted by ``--scorers``.
SCORER_NAMES = ("ours", "sglang", "deepgemm", "deepgemm-native", "deepgemm-multicast")


def make_scorers(names: list[str], impls: list[str] | None = None) -> list[Scorer]:
    """Scorer objects for ``names`` (from ``SCORER_NAMES``), ours first.

    Args:
        names: which scorers.
        impls: ``paged_logits`` ``impl`` variants to time as separate "ours"
            columns (``None``: the op's default only).

    Raises:
        ValueError: an unknown scorer name, or an ``impls`` name ``paged_logits`` does not know.
    """
    bad = [n for n in names if n not in SCORER_NAMES]
    if bad:
        raise ValueError(f"scorers: unknown {bad}; expected names from {SCORER_NAMES}")
    from ..ops.paged_logits import IMPLS

    known = ("auto", *IMPLS)
    unknown = [i for i in impls or () if i not in known]
    if unknown:
        raise ValueError(f"--impl: unknown {', '.join(map(repr, unknown))}; expected names from {known}")
    scorers: list[Scorer] = []
    if "ours" in names:
        scorers.extend(OursScorer(i) for i in (impls or [None]))
    if "sglang" in names:
        scorers.append(SGLangFP4Scorer())
    if "deepgemm" in names:
        scorers.append(DeepGemmFP8Scorer())
    if "deepgemm-native" in names:
        scorers.append(DeepGemmFP8Scorer(native=True))
    if "deepgemm-multicast" in names:
        scorers.append(DeepGemmSm90MulticastScorer())
    return scorers
