"""Prefill rows of ``sglang-fp4-indexer bench --prefill``: gather and ragged scoring against the FP8 MMA rate.

One prefill shape is one request of ``new`` query tokens on top of a cached
``prefix`` (H 64, 4 K / 16 K / 32 K new tokens, prefix 0 and 32 K).
Its keys live in a paged FP4 cache with shuffled pages (``inputs.random_index_k_cache``,
random valid keys); query token ``t`` sees the flat keys ``[0, prefix + t + 1)``
(causal, as SGLang's ``Indexer._get_topk_ragged`` windows them). Per shape:

* **gather**: ``ops.gather.gather_index_k`` of the request's ``prefix + new``
  keys into flat planes (``check=False``, the capturable path), timed against
  its HBM floor (68 B read + 68 B written per key, at the copy bandwidth
  measured in the same run). Check: every rotation set's planes equal a torch
  gather (``pool.read_index_k`` at ``reference.paged_slots``) exactly.
* **scoring**: ``ops.ragged_logits.iter_ragged_logits`` over the same keys
  (the torch gather's planes, which the gather must equal bit for bit: a gather
  bug then fails the gather row alone), the whole chunked loop timed: the logits are produced in row chunks whose fp32
  buffer fits ``budget_bytes`` (default 2 GiB, like SGLang's MQA-logits budget;
  32 K x 64 K logits would be 8 GiB), the keys decoded once per call,
  ``clean_logits=True``. Each mode that runs is a column: ``grouped`` and
  ``folded`` with FP8 MMA where it runs, else the portable default. As each
  chunk is produced, the chunk's rows among the checked rows are copied out (a
  few rows; what consuming a chunk, e.g. taking its top-k, would read). Those
  copies are the timed output that is checked.
* the **FP8 MMA rate** of the device, measured in the same run:
  ``torch._scaled_mm`` of random e4m3 matrices (``mma_size`` cubed, 8192 on a
  GPU), per-tensor fp32 scales, bf16 out, with and without ``use_fast_accum``;
  the faster is the ceiling. Achieved TFLOP/s of a scorer count
  ``2 * H * 128`` FLOP per visible (query, key) pair only (``prefill_flops``),
  not the tile padding along the causal diagonal.
* SGLang's Triton FP4 prefill path, when the installed SGLang has one
  (``sglang_prefill_reason``); SGLang 0.5.23 has none, so it is reported
  ``unavailable: <reason>``.

Checks: the checked rows (``checked_rows``: the first, the last and two between)
against ``reference.ragged_logits_reference`` (fp64), within ``PREFILL_REL``
(``2**-10``, the tolerance of tests/test_ragged_logits.py's GPU test: Hopper's
FP8 MMA accumulates with about 14 bits) of the term-magnitude bound
``sum_h |w| sum_d |q k|``, every column past a row's window ``-inf``
(``checks.check_logits``).

Timing is ``timing.time_calls`` (CUDA graphs) with at least ``MIN_CALLS``
calls per graph: a 32 K x 32 K-prefix call takes tens of milliseconds, so the
decode rows' 20 calls would make the run long. Inputs are rotated
(``timing.rotation_sets``) only where a call's bytes are under 4 x L2.
"""

from __future__ import annotations

import gc
import re
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Iterator

import torch

from ..format import INDEX_HEAD_DIM, dequantize_index_k
from ..pool import FP4_INDEX_BYTES_PER_TOKEN, PAGE_SIZE, read_index_k
from ..reference import logits_from_keys, paged_slots, ragged_logits_reference
from .checks import CheckResult, Expected, check_logits
from .floor import floor_seconds, percent_of_floor
from .inputs import random_index_k_cache
from .runner import BenchConfig, _error, _meta, _sync
from .timing import CPU_TIMING_NOTE, copy_bandwidth, l2_cache_bytes, rotation_sets, time_calls

__all__ = [
    "PREFILL_HEADS",
    "PREFILL_REL",
    "GPU_BUDGET_BYTES",
    "CPU_BUDGET_BYTES",
    "GPU_MMA_SIZE",
    "CPU_MMA_SIZE",
    "MIN_CALLS",
    "MMA_CHECK_REL",
    "CHECK_ROWS",
    "SGLANG_PEER",
    "DEEPGEMM_PEER",
    "DeepGemmFP8Prefill",
    "PrefillShape",
    "GPU_PREFILL_SHAPES",
    "CPU_PREFILL_SHAPES",
    "parse_prefill_shapes",
    "visible_pairs",
    "prefill_flops",
    "gather_bytes",
    "checked_rows",
    "PrefillVariant",
    "default_variants",
    "sglang_prefill_reason",
    "PrefillConfig",
    "measure_mma_rate",
    "bench_prefill",
    "render_prefill_table",
    "render_prefill_summary",
]

#: Index heads of the prefill rows (DeepSeek-V3.2).
PREFILL_HEADS = 64
#: Tolerance of the checks, relative to the term-magnitude bound (module docstring).
PREFILL_REL = 2.0**-10
#: Logits byte budget of the chunked loop: SGLang's order of magnitude (2 GiB), and a tiny one on the CPU
#: so that the CPU shapes run several chunks.
GPU_BUDGET_BYTES = 2 << 30
CPU_BUDGET_BYTES = 2048
#: Side of the square e4m3 ``torch._scaled_mm`` measuring the FP8 MMA rate.
GPU_MMA_SIZE = 8192
CPU_MMA_SIZE = 64
#: Relative (Frobenius) error allowed in the sanity check of the ``_scaled_mm`` output.
MMA_CHECK_REL = 0.25
#: Fewest calls per CUDA graph (module docstring).
MIN_CALLS = 3
#: Query rows compared with the fp64 reference per shape.
CHECK_ROWS = 4
#: Name of the SGLang peer column.
SGLANG_PEER = "sglang-triton-fp4"
#: Column name of the FP8 incumbent (DeepGEMM's ragged scorer on FP8 keys), where DeepGEMM runs.
DEEPGEMM_PEER = "deepgemm-fp8"
#: Functions SGLang's FP4 indexer module would need for a ragged (flat-key) prefill scorer.
_SGLANG_RAGGED_NAMES = ("fp4_index_logits_ragged", "fp4_index_logits_flat", "fp4_mqa_logits")


@dataclass(frozen=True)
class PrefillShape:
    """One prefill call: ``new`` query tokens of one request with ``prefix`` cached tokens, ``heads`` index heads.

    Written ``HxNEWxPREFIX`` on the command line (``K`` = 1024), e.g. ``64x16Kx32K``.

    Raises:
        ValueError: ``heads`` or ``new`` not a positive int, ``prefix`` not an int >= 0.
    """

    heads: int
    new: int
    prefix: int

    def __post_init__(self) -> None:
        for name, least in (("heads", 1), ("new", 1), ("prefix", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"{name}: expected an int >= {least}, got {value!r}")

    @property
    def keys(self) -> int:
        """Keys of the request (the flat buffer's length): ``prefix + new``."""
        return self.prefix + self.new

    @property
    def spec(self) -> str:
        return f"{self.heads}x{_k(self.new)}x{_k(self.prefix)}"

    @property
    def label(self) -> str:
        return f"H{self.heads} {_k(self.new)} new + {_k(self.prefix)} prefix"


def _k(n: int) -> str:
    return f"{n // 1024}K" if n and n % 1024 == 0 else str(n)


#: The prefill rows: H 64, 4 K / 16 K / 32 K new tokens, prefix 0 and 32 K.
GPU_PREFILL_SHAPES: tuple[PrefillShape, ...] = tuple(
    PrefillShape(PREFILL_HEADS, n, p) for n in (4096, 16384, 32768) for p in (0, 32768)
)
#: Tiny stand-ins for the CPU interpreter (a functional run, not a speed figure).
CPU_PREFILL_SHAPES: tuple[PrefillShape, ...] = (PrefillShape(PREFILL_HEADS, 24, 0), PrefillShape(PREFILL_HEADS, 16, 40))

_SPEC = re.compile(r"^(\d+)x(\d+)([kK]?)x(\d+)([kK]?)$")


def parse_prefill_shapes(text: str) -> list[PrefillShape]:
    """Parse comma-separated ``HxNEWxPREFIX`` specs (``K`` = x1024), or ``gpu`` / ``cpu`` (the default sets).

    Raises:
        TypeError: ``text`` not a string.
        ValueError: an item of another form (named in the message), a bad field, or no shape.
    """
    if not isinstance(text, str):
        raise TypeError(f"prefill shapes: expected a string, got {type(text).__name__}")
    sets = {"gpu": GPU_PREFILL_SHAPES, "cpu": CPU_PREFILL_SHAPES}
    shapes: list[PrefillShape] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        if item.lower() in sets:
            shapes.extend(sets[item.lower()])
            continue
        m = _SPEC.match(item)
        if m is None:
            raise ValueError(f"prefill shapes: {item!r} is neither HxNEWxPREFIX (e.g. 64x16Kx32K) nor gpu / cpu")
        h, n, nk, p, pk = m.groups()
        shapes.append(PrefillShape(int(h), int(n) * (1024 if nk else 1), int(p) * (1024 if pk else 1)))
    if not shapes:
        raise ValueError("prefill shapes: expected at least one shape")
    return list(dict.fromkeys(shapes))


def visible_pairs(new: int, prefix: int) -> int:
    """(query, key) pairs inside the causal windows: ``sum_t (prefix + t + 1) = new * prefix + new (new + 1) / 2``."""
    if new < 0 or prefix < 0:
        raise ValueError(f"new, prefix: expected >= 0, got {new}, {prefix}")
    return new * prefix + new * (new + 1) // 2


def prefill_flops(shape: PrefillShape) -> int:
    """FLOP of one scoring call: ``2 * H * 128`` per visible pair (the ``q . k`` dots; relu and the head sum not counted)."""
    return 2 * shape.heads * INDEX_HEAD_DIM * visible_pairs(shape.new, shape.prefix)


def gather_bytes(keys: int) -> int:
    """Compulsory bytes of gathering ``keys`` FP4 keys: 68 read + 68 written each."""
    if keys < 0:
        raise ValueError(f"keys: expected >= 0, got {keys}")
    return 2 * FP4_INDEX_BYTES_PER_TOKEN * keys


def checked_rows(new: int, count: int = CHECK_ROWS) -> list[int]:
    """Query rows compared with the reference: ``count`` rows evenly spread, the first and the last included."""
    if new < 1 or count < 1:
        raise ValueError(f"new, count: expected >= 1, got {new}, {count}")
    if count == 1:
        return [new - 1]
    return sorted({round(i * (new - 1) / (count - 1)) for i in range(count)})


ChunkFn = Callable[..., Iterator[tuple[int, int, torch.Tensor]]]


@dataclass
class PrefillVariant:
    """One scoring column: ``chunks(q, weights, payload, scales, ks, ke, budget_bytes=...)`` yields
    ``(start, end, logits)`` row chunks as ``ops.ragged_logits.iter_ragged_logits`` does."""

    name: str
    label: str
    chunks: ChunkFn


class DeepGemmFP8Prefill:
    """The FP8 incumbent: DeepGEMM's ``fp8_mqa_logits`` on SGLang's FP8 form of the same keys (e4m3 + one
    fp32 scale per key, 132 B), what SGLang's FP8 indexer runs for prefill. The FP8 copy of each key
    buffer is made once, at the first (warm-up, untimed) call, so only the scoring is timed; it is exact
    for the benchmark's keys (``inputs.SCALE_CODES`` span 2**7), so its logits are checked like ours.
    Chunked by the same budget, with ``clean_logits=True``."""

    def __init__(self):
        self._fp8: dict[int, tuple] = {}

    def __call__(self, q, w, payload, scales, ks, ke, *, budget_bytes: int):
        from ..ops import deepgemm
        from ..ops import ragged_logits as rl

        key = payload.data_ptr()
        if key not in self._fp8:
            keys = rl.prepare_keys(payload, scales, mode="folded", mma="fp8", element_order=True)
            self._fp8[key] = (keys.values.clone(), keys.key_factor.clone())
        kv = self._fp8[key]
        ragged = deepgemm.api().ragged  # present: default_variants adds this peer only where deepgemm_reason is None
        rows = rl.rows_per_chunk(q.shape[0], payload.shape[0], budget_bytes)
        for start in range(0, q.shape[0], rows):
            end = min(start + rows, q.shape[0])
            yield start, end, ragged(q[start:end], kv, w[start:end], ks[start:end], ke[start:end], True, torch.float32)


def default_variants(device: torch.device) -> list[PrefillVariant]:
    """``iter_ragged_logits`` in each mode that runs on ``device``: ``grouped`` and ``folded`` with FP8 MMA
    where it runs (``ops._common.fp8_mma_available``), else the portable default (``mode``/``mma`` ``auto``);
    where DeepGEMM runs (``ops.ragged_logits.deepgemm_reason``), also ``impl="deepgemm"`` (the serving
    default there) and the FP8 incumbent ``DeepGemmFP8Prefill``. All with ``check=False`` (no host sync:
    capturable)."""
    from ..ops import ragged_logits as rl
    from .peers import add_peer_site

    if rl.fp8_mma_available(device):
        variants = [
            PrefillVariant(f"ours[{m}]", f"iter_ragged_logits(mode={m!r}, mma='fp8', impl='triton')",
                           partial(rl.iter_ragged_logits, mode=m, mma="fp8", check=False, impl="triton"))
            for m in ("folded", "grouped")
        ]
    else:
        return [PrefillVariant("ours[portable]", "iter_ragged_logits(mode='auto', mma='auto')",
                               partial(rl.iter_ragged_logits, check=False, impl="triton"))]
    add_peer_site()  # where scripts/gpu_run.sh puts the DeepGEMM it builds
    probe = torch.empty(1, PREFILL_HEADS, INDEX_HEAD_DIM, device=device, dtype=torch.float8_e4m3fn)
    if rl.deepgemm_reason(probe, PREFILL_HEADS) is None:
        variants.insert(0, PrefillVariant("ours[deepgemm]", "iter_ragged_logits(impl='deepgemm'): FP4 decode + "
                                          "DeepGEMM fp8_mqa_logits", partial(rl.iter_ragged_logits, check=False,
                                                                               impl="deepgemm")))
        variants.append(PrefillVariant(DEEPGEMM_PEER, "deep_gemm.fp8_mqa_logits on the FP8 form of the keys "
                                       "(132 B/key)", DeepGemmFP8Prefill()))
    return variants


def sglang_prefill_reason(device: torch.device) -> str:
    """Why SGLang's Triton FP4 prefill path cannot be timed here (it always has a reason with SGLang 0.5.23).

    On CUDA, loads SGLang's FP4 indexer module through ``peers.load_sglang_fp4_indexer``
    and looks for a ragged (flat-key) scorer; 0.5.23 has only per-row-slot
    scorers (``fp4_index_logits_decode`` / ``fp4_index_logits_paged``), and its
    flat prefill path (``dsv4.index_logits.flat_index_logits_tiles``) calls
    DeepGEMM's ``fp8_fp4_mqa_logits``, not Triton.
    """
    if device.type != "cuda":
        return "needs a CUDA device"
    from .peers import SGLANG_FP4_MODULE, load_sglang_fp4_indexer

    try:
        module = load_sglang_fp4_indexer()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    found = [n for n in _SGLANG_RAGGED_NAMES if hasattr(module, n)]
    if found:
        return f"{SGLANG_FP4_MODULE}.{found[0]} exists, but this benchmark has no adapter for it (written against 0.5.23)"
    return (f"{SGLANG_FP4_MODULE} has no ragged (flat-key) FP4 index-logits function, only per-row-slot "
            "scorers (fp4_index_logits_decode/_paged); SGLang's FP4 prefill path "
            "(dsv4.index_logits.flat_index_logits_tiles) calls DeepGEMM's fp8_fp4_mqa_logits, not Triton")


@dataclass
class PrefillConfig:
    """What one ``--prefill`` run measures.

    Attributes:
        device: where the ops run (``cpu``: the Triton interpreter).
        shapes: prefill shapes.
        variants: scoring columns (``None``: ``default_variants``).
        budget_bytes: logits byte budget of the chunked loop.
        mma_size: side of the ``_scaled_mm`` measuring the FP8 MMA rate (0: skip).
        seed: input seed.
        copy_bytes: size of the bandwidth copy (``None``: 1 GiB on CUDA, 64 MiB on the CPU).
        check_rows: query rows checked per shape.
        command: the command line, for the record.
    """

    device: torch.device
    shapes: list[PrefillShape]
    variants: list[PrefillVariant] | None = None
    budget_bytes: int = GPU_BUDGET_BYTES
    mma_size: int = GPU_MMA_SIZE
    seed: int = 0
    copy_bytes: int | None = None
    check_rows: int = CHECK_ROWS
    command: str = ""
    extra_meta: dict = field(default_factory=dict)


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def measure_mma_rate(device: torch.device, size: int, seed: int = 0) -> dict:
    """The FP8 MMA rate: ``torch._scaled_mm`` of random e4m3 ``[size, size] x [size, size]``, per-tensor scales.

    ``a`` row-major, ``b`` column-major (what cuBLASLt's FP8 path takes), both
    ``N(0, 1)`` rounded to e4m3 (never zeros), fp32 scales 1.0, bf16 out; timed
    with ``timing.time_calls`` for ``use_fast_accum`` False and True. Check:
    four output rows against the fp64 product, ``||out - ref|| <= MMA_CHECK_REL
    * ||ref||`` -- a sanity check that catches a wrong, empty or mis-scaled
    product (each gives a relative error near 1), not a precision test (bf16
    output, and fast accumulation keeps about 14 bits).

    Returns:
        JSON-ready dict: ``status``, ``size``, ``flops`` (``2 size**3``),
        ``variants`` (per fast-accum setting: ``seconds``, ``tflops``, ``timing``
        or ``status``), ``seconds`` and ``tflops`` of the faster (the ceiling).
    """
    flops = 2 * size**3
    res: dict = {"size": size, "flops": flops, "variants": {}, "status": "error"}
    try:
        g = torch.Generator(device=device).manual_seed(seed + 7)
        a = torch.randn(size, size, generator=g, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(size, size, generator=g, device=device).to(torch.float8_e4m3fn).t()
        one = torch.ones((), dtype=torch.float32, device=device)
    except Exception as exc:
        res["status"] = _error(exc)
        return res
    for fast in (False, True):
        key = "fast_accum" if fast else "fp32_accum"
        entry: dict = {"status": "error"}
        try:
            def fn(s: int, fast=fast) -> torch.Tensor:
                return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=fast)

            run = time_calls(fn, device, 1, min_calls=MIN_CALLS)
            _sync(device)
            out = run.outputs[0][:4].double()
            want = a[:4].double() @ b.double()
            ok = bool(torch.linalg.vector_norm(out - want) <= MMA_CHECK_REL * torch.linalg.vector_norm(want))
            entry = {"seconds": run.timing.seconds, "tflops": flops / run.timing.seconds / 1e12,
                     "timing": run.timing.to_dict(), "status": "ok" if ok else "check failed"}
            del run
        except Exception as exc:
            entry["status"] = _error(exc)
        res["variants"][key] = entry
    good = [v for v in res["variants"].values() if v.get("status") == "ok"]
    if good:
        best = min(good, key=lambda v: v["seconds"])
        res.update(status="ok", seconds=best["seconds"], tflops=best["tflops"],
                   ceiling=next(k for k, v in res["variants"].items() if v is best))
    else:
        res["status"] = next(iter(res["variants"].values()))["status"]
    del a, b
    return res


def _time_gather(shape: PrefillShape, cache: torch.Tensor, block_table, want, l2, bandwidth, device) -> dict:
    """Time the gather and check every set's planes against ``want`` (the torch gather) exactly."""
    from ..ops import gather as gather_ops

    n = shape.keys
    row: dict = {"keys": n, "bytes": gather_bytes(n), "status": "error"}
    row["floor_s"] = floor_seconds(row["bytes"], bandwidth)
    try:
        sets = rotation_sets(row["bytes"], l2)
        caches = [cache] + [cache.clone() for _ in range(sets - 1)]
        lens = torch.tensor([n], dtype=torch.int32, device=device)

        def fn(s: int):
            return gather_ops.gather_index_k(caches[s], block_table, lens, n, n, check=False)

        run = time_calls(fn, device, sets, min_calls=MIN_CALLS)
        _sync(device)
        row.update(seconds=run.timing.seconds, timing=run.timing.to_dict(), sets=sets)
        row["pct_floor"] = percent_of_floor(run.timing.seconds, row["floor_s"])
        bad = [s for s in sorted(run.outputs) if not all(torch.equal(x, y) for x, y in zip(run.outputs[s], want))]
        check = CheckResult(not bad, f"set {bad[0]}: gathered planes differ from the torch gather" if bad
                            else f"all {n} keys bit-exact vs a torch gather, {len(run.outputs)} set(s)",
                            rows_checked=n, sets_checked=len(run.outputs))
        row["check"] = check.to_dict()
        row["status"] = "ok" if check.ok else "check failed"
        del run, caches
    except Exception as exc:
        row["status"] = _error(exc)
    return row


def _expected(q, w, payload, scales, ks, ke, rows: list[int]) -> Expected:
    """Reference and term-magnitude bound of ``rows`` (``checks.Expected`` with the window ends as lengths)."""
    idx = torch.tensor(rows, device=q.device)
    qr, wr, ksr, ker = q[idx], w[idx], ks[idx], ke[idx]
    ref = ragged_logits_reference(qr, wr, payload, scales, ksr, ker)
    keys = dequantize_index_k(payload, scales).abs()
    bound = torch.zeros(len(rows), payload.shape[0], dtype=torch.float64, device=q.device)
    for i, (lo, hi) in enumerate(zip(ksr.tolist(), ker.tolist())):
        if hi > lo:
            bound[i, lo:hi] = logits_from_keys(qr[i].float().abs(), wr[i].abs(), keys[lo:hi])
    if int(ksr.max()) != 0:  # check_logits reads a row's visible columns as [0, length)
        raise ValueError("ks: the prefill check expects windows starting at 0")
    lens = ker.to(torch.int64)
    return Expected(list(range(len(rows))), lens, ref, bound, lens)


def _time_variant(variant: PrefillVariant, shape, inputs, rows, exp, budget, l2, device) -> dict:
    from ..ops.ragged_logits import rows_per_chunk

    q, w, payload, scales, ks, ke = inputs
    res: dict = {"status": "error", "label": variant.label}
    try:
        tokens, width = shape.new, shape.keys
        per_chunk = rows_per_chunk(tokens, width, budget)
        res["chunks"] = -(-tokens // per_chunk)
        res["rows_per_chunk"] = per_chunk
        case = q.numel() + w.numel() * 4 + payload.numel() + scales.numel() + tokens * width * 4
        sets = rotation_sets(case, l2)
        qs = [(q, w, payload, scales)] + [(q.clone(), w.clone(), payload.clone(), scales.clone()) for _ in range(sets - 1)]
        outs = [torch.full((len(rows), width), float("nan"), dtype=torch.float32, device=device) for _ in range(sets)]

        def fn(s: int) -> torch.Tensor:
            out = outs[s]
            sq, sw, sp, ss = qs[s]
            for start, end, chunk in variant.chunks(sq, sw, sp, ss, ks, ke, budget_bytes=budget):
                for i, r in enumerate(rows):
                    if start <= r < end:
                        out[i].copy_(chunk[r - start])
            return out

        run = time_calls(fn, device, sets, min_calls=MIN_CALLS)
        _sync(device)
        res.update(seconds=run.timing.seconds, timing=run.timing.to_dict(), sets=sets)
        res["tflops"] = prefill_flops(shape) / run.timing.seconds / 1e12
        check = check_logits(run.outputs, exp, PREFILL_REL, writes_all=True)
        res["check"] = check.to_dict()
        res["status"] = "ok" if check.ok else "check failed"
        del run, qs, outs
    except Exception as exc:
        res["status"] = _error(exc)
        try:
            _sync(device)
        except Exception:
            pass
    return res


def _inputs(shape: PrefillShape, device, seed: int):
    g = torch.Generator(device=device).manual_seed(seed)
    num_pages = -(-shape.keys // PAGE_SIZE)
    cache = random_index_k_cache(num_pages, device, g)
    block_table = torch.randperm(num_pages, generator=g, device=device).to(torch.int32).view(1, num_pages)
    q = (torch.randn(shape.new, shape.heads, INDEX_HEAD_DIM, generator=g, device=device) * 2).to(torch.float8_e4m3fn)
    w = torch.rand(shape.new, shape.heads, generator=g, device=device) * shape.heads**-0.5
    ks = torch.zeros(shape.new, dtype=torch.int32, device=device)
    ke = (shape.prefix + 1 + torch.arange(shape.new, device=device)).to(torch.int32)
    return cache, block_table, q, w, ks, ke


def bench_prefill(
    config: PrefillConfig,
    log: Callable[[str], None] = lambda line: None,
    on_progress: Callable[[dict], None] | None = None,
) -> dict:
    """Run the prefill rows (module docstring) and return the report.

    Returns:
        JSON-ready dict: ``meta``, ``mma`` (``measure_mma_rate``), ``variants``,
        ``peers``, ``prefill`` (one row per shape: ``flops``, ``visible_pairs``,
        ``gather``, ``results`` per column with ``seconds``, ``tflops``,
        ``pct_mma``, ``check``) and ``failures`` (failed checks and errors;
        an unavailable peer is not one).
    """
    dev = config.device
    if config.budget_bytes <= 0:
        raise ValueError(f"budget_bytes: expected > 0, got {config.budget_bytes}")
    variants = config.variants if config.variants is not None else default_variants(dev)
    bandwidth, samples = copy_bandwidth(dev, config.copy_bytes)
    l2 = l2_cache_bytes(dev)
    meta_cfg = BenchConfig(dev, [], [], seed=config.seed, command=config.command, extra_meta={
        "kind": "prefill",
        "timing": (f"CUDA graphs (>= {MIN_CALLS} calls each), median of replays" if dev.type == "cuda"
                   else f"wall clock: {CPU_TIMING_NOTE}"),
        "budget_bytes": config.budget_bytes,
        "check_rows": config.check_rows,
        "rel": PREFILL_REL,
        "flop_rule": f"2 * H * {INDEX_HEAD_DIM} per visible (query, key) pair",
        **config.extra_meta,
    })
    report: dict = {"meta": _meta(meta_cfg, bandwidth, samples, l2), "mma": {}, "failures": 0,
                    "variants": [{"name": v.name, "label": v.label} for v in variants],
                    "peers": {SGLANG_PEER: "unavailable: " + sglang_prefill_reason(dev)}, "prefill": []}
    log(f"copy bandwidth {bandwidth / 1e9:.1f} GB/s; {SGLANG_PEER}: {report['peers'][SGLANG_PEER]}")
    if config.mma_size:
        report["mma"] = measure_mma_rate(dev, config.mma_size, config.seed)
        mma = report["mma"]
        log(f"FP8 MMA rate (_scaled_mm {config.mma_size}^3): "
            + (f"{mma['tflops']:.3g} TFLOP/s ({mma['ceiling']})" if "tflops" in mma else mma["status"]))
        report["failures"] += mma["status"] != "ok"
        _free(dev)
    ceiling = report["mma"].get("tflops")
    for idx, shape in enumerate(config.shapes, 1):
        row: dict = {"spec": shape.spec, "label": shape.label, "heads": shape.heads, "new": shape.new,
                     "prefix": shape.prefix, "keys": shape.keys,
                     "visible_pairs": visible_pairs(shape.new, shape.prefix), "flops": prefill_flops(shape),
                     "results": {}}
        report["prefill"].append(row)
        try:
            cache, block_table, q, w, ks, ke = _inputs(shape, dev, config.seed + idx)
            # The scorers read the torch gather's planes (the same keys), so a gather bug fails only the gather.
            payload, scales = read_index_k(cache, paged_slots(block_table[0], shape.keys))
            rows = checked_rows(shape.new, config.check_rows)
            exp = _expected(q, w, payload, scales, ks, ke, rows)
        except Exception as exc:
            row["gather"] = {"status": _error(exc)}
            report["failures"] += 1
            log(f"[{idx}/{len(config.shapes)}] {shape.label}: inputs failed: {exc}")
            _free(dev)
            continue
        row["gather"] = _time_gather(shape, cache, block_table, (payload, scales), l2, bandwidth, dev)
        g = row["gather"]
        report["failures"] += g["status"] != "ok"
        log(f"[{idx}/{len(config.shapes)}] {shape.label} gather: "
            + (f"{g['seconds'] * 1e6:.1f} us" if "seconds" in g else "-") + f" ({g['status']})")
        del cache
        _free(dev)
        for v in variants:
            res = _time_variant(v, shape, (q, w, payload, scales, ks, ke), rows, exp, config.budget_bytes, l2, dev)
            if ceiling and "tflops" in res:
                res["pct_mma"] = 100.0 * res["tflops"] / ceiling
            row["results"][v.name] = res
            report["failures"] += res["status"] != "ok"
            t = f"{res['seconds'] * 1e3:.2f} ms, {res['tflops']:.0f} TFLOP/s" if "seconds" in res else "-"
            log(f"[{idx}/{len(config.shapes)}] {shape.label} {v.name}: {t} ({res['status']})")
            _free(dev)
        row["results"][SGLANG_PEER] = {"status": "unavailable"}
        del q, w, payload, scales, ks, ke, exp
        _free(dev)
        if on_progress is not None:
            on_progress(report)
    report["failures"] = int(report["failures"])
    if on_progress is not None:
        on_progress(report)
    return report


def _ms(seconds) -> str:
    return f"{seconds * 1e3:.3f}" if isinstance(seconds, (int, float)) else "-"


def _budget_text(nbytes: int) -> str:
    return f"{nbytes / 2**30:g} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:g} MiB" if nbytes >= 2**20 else f"{nbytes} B"


def _cell(res: dict) -> str:
    if "seconds" not in res:
        status = res.get("status", "-")
        return "n/a" if status == "unavailable" else "ERROR"
    pct = f" ({res['pct_mma']:.0f}%)" if "pct_mma" in res else ""
    return f"{_ms(res['seconds'])} ms, {res['tflops']:.3g} TF{pct}"


def _gather_cell(g: dict) -> str:
    if "seconds" not in g:
        return "ERROR" if g else "-"
    return f"{g['seconds'] * 1e6:.1f} us ({g['pct_floor']:.0f}%)"


def _fails(row: dict) -> list[str]:
    out = []
    for name, res in [("gather", row.get("gather", {}))] + list(row["results"].items()):
        if res.get("status") not in ("ok", "unavailable"):
            detail = res.get("check", {}).get("detail") if res.get("status") == "check failed" else None
            out.append(f"{name}: {res.get('status')}" + (f" ({detail})" if detail else ""))
    return out


def _notes(report: dict) -> list[str]:
    meta, mma = report.get("meta", {}), report.get("mma", {})
    budget = meta.get("budget_bytes") or 0
    notes = []
    if "tflops" in mma:
        per = ", ".join(f"{k} {v['tflops']:.3g}" for k, v in mma.get("variants", {}).items() if "tflops" in v)
        notes.append(f"FP8 MMA ceiling: torch._scaled_mm e4m3 {mma['size']}^3, per-tensor scales: "
                     f"{mma['tflops']:.3g} TFLOP/s ({per}); % = of it")
    elif mma:
        notes.append(f"FP8 MMA rate: {mma.get('status')}")
    notes.append(f"TFLOP/s count {meta.get('flop_rule', '2 * H * 128 per visible pair')} (causal: query t sees "
                 f"prefix + t + 1 keys)")
    notes.append(f"scoring = the whole chunked loop (iter_ragged_logits, fp32 logits chunks within a "
                 f"{_budget_text(budget)} budget, keys decoded once per call, clean -inf), checked rows copied out "
                 f"per chunk; gather = gather_index_k from shuffled pages, % = of its 136 B/key HBM floor")
    notes.extend(f"{k}: {v}" for k, v in report.get("peers", {}).items())
    return notes


def render_prefill_table(report: dict):
    """The prefill table (rich): per shape, the gather and each scoring column, the checks; notes in the caption."""
    from rich.markup import escape
    from rich.table import Table

    meta = report.get("meta", {})
    table = Table(title=f"prefill, {meta.get('device', '?')}: {meta.get('timing', '')}", title_justify="left")
    names = [v["name"] for v in report.get("variants", [])]
    table.add_column("shape")
    table.add_column("chunks", justify="right")
    table.add_column("gather (% floor)", justify="right")
    for name in names:
        table.add_column(escape(f"{name}: ms, TFLOP/s (% MMA)"), justify="right")
    table.add_column(SGLANG_PEER, justify="right")
    table.add_column("checks")
    for row in report.get("prefill", []):
        g = row.get("gather", {})
        chunks = next((r["chunks"] for r in row["results"].values() if "chunks" in r), "-")
        cells = [row["label"], str(chunks), _gather_cell(g)]
        cells += [_cell(row["results"].get(n, {})) for n in names]
        cells.append(_cell(row["results"].get(SGLANG_PEER, {})))
        fails = _fails(row)
        cells.append("ok" if not fails else "; ".join(fails))
        table.add_row(*(escape(c) for c in cells))
    table.caption = escape("\n".join(_notes(report)))
    table.caption_justify = "left"
    return table


def fp8_ratio(row: dict) -> float | None:
    """DeepGEMM FP8's time over ours (the serving default ``ours[deepgemm]`` where it ran, else the fastest
    of ours) for one prefill row: above 1, FP4 is faster; ``None`` without both times."""
    fp8 = row.get("results", {}).get(DEEPGEMM_PEER, {}).get("seconds")
    ours = [r["seconds"] for n, r in row.get("results", {}).items() if n.startswith("ours") and "seconds" in r]
    pick = row.get("results", {}).get("ours[deepgemm]", {}).get("seconds") or (min(ours) if ours else None)
    return fp8 / pick if fp8 and pick else None


def fp8_ratio_text(row: dict) -> str:
    r = fp8_ratio(row)
    return "-" if r is None else f"{r:.2f}"


def render_prefill_summary(report: dict) -> str:
    """Plain-text summary of a prefill report (fits a log tail)."""
    meta = report.get("meta", {})
    names = [v["name"] for v in report.get("variants", [])]
    lines = [f"== prefill summary: {meta.get('device', '?')}, torch {meta.get('torch')}, triton {meta.get('triton')}",
             f"   {meta.get('timing', '')}"]
    lines += [f"   {n}" for n in _notes(report)]
    lines.append(f"{'shape':<26}{'gather':>18}" + "".join(f"{n:>34}" for n in names) + f"{'FP8 / ours':>12}  checks")
    for row in report.get("prefill", []):
        cells = f"{row['label']:<26}{_gather_cell(row.get('gather', {})):>18}"
        cells += "".join(f"{_cell(row['results'].get(n, {})):>34}" for n in names)
        cells += f"{fp8_ratio_text(row):>12}"
        fails = _fails(row)
        lines.append(cells + "  " + ("ok" if not fails else "FAIL " + "; ".join(fails)))
    lines.append(f"failures: {report.get('failures', 0)}")
    return "\n".join(lines)
