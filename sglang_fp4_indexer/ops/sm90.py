"""The Hopper (sm_90a) paged scorer: CUDA C++ built at first use by NVRTC.

``paged_logits(impl="wgmma")`` (the default on compute capability 9.0) runs
``cuda/paged_logits_sm90.cu``: decoded FP4 index keys as the register A
operand of FP8 ``wgmma``, the index queries as its shared-memory B operand,
pages copied by the bulk-copy engine into an mbarrier ring by a producer warp.
By default (``DEFAULT_WGS``) one CTA per SM holds four math warpgroups, each
with its own schedule entry, ring and producer warp, the producers' registers
moved to the math warpgroups by ``setmaxnreg`` (benchmarks/results/PERF_LOG.md, run 15).
Why CUDA C++ and not Triton: benchmarks/results/PERF_LOG.md (run 8 onwards).

The kernel is compiled once per configuration (next_n, heads, logits dtype,
lengths layout, pipeline depth, warpgroups) with NVRTC from ``cuda-bindings`` (an SGLang
dependency; ``pip install 'sglang-fp4-indexer[cuda]'`` otherwise), loaded
into the current device's context and launched on torch's current stream, so
it is captured by CUDA graphs like any torch kernel. Nothing here imports
SGLang.
"""

from __future__ import annotations

import ctypes
import functools
import warnings
from pathlib import Path

import torch

from ..pool import PAGE_SIZE
from . import nvrtc
from ._common import scale_row_is_identity

__all__ = ["available", "unavailable_reason", "serving_unavailable", "record_serving_failure", "build", "launch", "supports",
           "query_tile_problem", "SOURCE", "DEFAULT_STAGES", "DEFAULT_MIN_CTAS",
           "default_min_ctas", "smem_bytes", "wg_smem_bytes", "threads", "launch_regs", "math_regs", "HEADS", "MAX_Q_BYTES",
           "HEADSUM_REL", "MMA_REL", "rel_bound", "logit_error_bound", "MMA_ROWS_DEFAULTS", "MAX_MMA_N",
           "default_mma_rows"]

#: The kernel's CUDA C++ source.
SOURCE = Path(__file__).with_name("cuda") / "paged_logits_sm90.cu"
#: Pages in flight per CTA (the ring depth).
DEFAULT_STAGES = 4
#: With ``wgs`` 1 only: CTAs per SM the register budget is set for (``__launch_bounds__``:
#: 96 registers); H = 128 gets 2. Four resident CTAs measured fastest (benchmarks/results/PERF_LOG.md, run 10).
DEFAULT_MIN_CTAS = 4


def default_min_ctas(heads: int) -> int:
    """CTAs per SM the kernel for ``heads`` is built for (its accumulators grow with H)."""
    return 2 if heads >= 128 else DEFAULT_MIN_CTAS


#: Sign handling of the decode (build option SPLIT_SIGN; benchmarks/results/PERF_LOG.md, runs 12, 14, 15, 18, 21 and 22):
#: 3, the signs by PRMT sign-replicate (7 ALU operations per payload word against 9).
DEFAULT_SPLIT_SIGN = 3
#: Head sum of the epilogue (build option HEADSUM): 0 fp32 FFMA, 1 tf32 wgmma, 2 bf16 wgmma
#: (benchmarks/results/PERF_LOG.md, runs 14, 29 and 31): 2, 3-4 % faster than 0 at long context; its rounding
#: (``HEADSUM_REL[2]``) moves the top-k recall by at most 3.4e-4 (scripts/headsum_recall.py).
DEFAULT_HEADSUM = 2
#: Software pipeline of the math loop (build option PIPELINE; benchmarks/results/PERF_LOG.md, runs 14, 17 and 21).
DEFAULT_PIPELINE = 0
#: Math warpgroups per CTA (build option WGS): 1 with one producer warp, several CTAs per SM;
#: 2-4 warp-specialised with a producer warpgroup and setmaxnreg, one CTA per SM (docs/perf-notes.md,
#: runs 15 and 27).
DEFAULT_WGS = 4
#: Relative rounding per term of each head sum (build option HEADSUM): 0 fp32 FFMA (none beyond fp32),
#: 1 tf32 (relu(S) truncated, weights rounded: 2**-10 + 2**-11), 2 bf16 (relu(S) rounded, bf16's unit
#: roundoff, and the weights as hi + lo: 2**-8 + 2**-16).
HEADSUM_REL = {0: 0.0, 1: 2.0**-10 + 2.0**-11, 2: 2.0**-8 + 2.0**-16}
#: Register budget of the producer warpgroup when WGS > 1 (setmaxnreg.dec; the smallest allowed).
PRODUCER_REGS = 24
#: PROBE 64 (timeline) record layout: per math warp, its first TIMELINE_JOBS jobs x TIMELINE_STAMPS u32
#: (scripts/sm90_probe.py reads them).
TIMELINE_JOBS, TIMELINE_STAMPS = 32, 8

#: Heads the kernel is built for (wgmma N = heads).
HEADS = (16, 32, 64, 128)
#: Largest next_n x heads x 128 bytes of index queries kept in shared memory.
MAX_Q_BYTES = 32 * 1024
#: Dynamic shared memory one CTA may use on Hopper (227 KB).
MAX_SMEM_BYTES = 227 * 1024
_OUT_KINDS = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


#: next_n rows per wgmma (build option MMA_ROWS) by (next_n, heads); 1 where absent. Measured on H200
#: (docs/perf-notes.md, "One wgmma across next_n rows"): at H 32 one N = 128 wgmma per page is 1-5 %
#: faster than one per row; at H 64 it is 1-3 % slower, so rows keep their own wgmma there.
MMA_ROWS_DEFAULTS: dict[tuple[int, int], int] = {(2, 32): 2, (4, 32): 4}
#: Widest wgmma N (rows per wgmma x heads) whose accumulators fit a math thread's registers at
#: ``DEFAULT_WGS`` (N = 256 does not build).
MAX_MMA_N = 128


def default_mma_rows(next_n: int, heads: int) -> int:
    """Rows of a request's next_n scored by one wgmma (``MMA_ROWS_DEFAULTS``, else 1)."""
    return MMA_ROWS_DEFAULTS.get((next_n, heads), 1)


def threads(wgs: int) -> int:
    """Threads of one CTA: ``wgs`` math warpgroups and a producer warp (``wgs`` 1) or warpgroup (one warp
    per math warpgroup; setmaxnreg works on whole warpgroups)."""
    return 128 * wgs + (32 if wgs == 1 else 128)


#: Relative error of a head score ``s_h`` from Hopper FP8 MMA's accumulation, narrower than fp32
#: (DeepGEMM's notes; benchmarks/results/PERF_LOG.md, run 26), relative to ``sum_d |q_hd k_d|``.
MMA_REL = 1e-3


def rel_bound(headsum: int = DEFAULT_HEADSUM) -> float:
    """The kernel's logit error bound as one factor of the term bound ``sum_h |w_h| sum_d |q_hd k_d|`` of
    each key (what the benchmark's check allows): ``MMA_REL`` plus ``HEADSUM_REL[headsum]`` (the head
    sum's rounding is relative to ``sum_h |w_h| relu(s_h)``, which the term bound exceeds, so this is
    looser than ``logit_error_bound``).

    Raises:
        KeyError: ``headsum`` not a build option.
    """
    return MMA_REL + HEADSUM_REL[headsum]


def logit_error_bound(term, relu_term, headsum: int = DEFAULT_HEADSUM):
    """The kernel's error bound per logit (what the Hopper GPU tests assert).

    Args:
        term: ``sum_h |w_h| sum_d |q_hd k_d|`` per (row, key) (a tensor or a float).
        relu_term: ``sum_h |w_h| relu(s_h)`` per (row, key), same shape, ``s_h`` the exact head score.

    Returns:
        ``MMA_REL * term + HEADSUM_REL[headsum] * (relu_term + MMA_REL * term)``: each head score off
        by at most ``MMA_REL * sum_d |q k|`` (the FP8 MMA's accumulation), then its relu rounded with
        relative error ``HEADSUM_REL[headsum]`` (bf16 for HEADSUM 2; the weights' hi + lo split
        included) in the head sum, whose fp32 additions the generous ``MMA_REL`` covers.

    Raises:
        KeyError: ``headsum`` not a build option.
    """
    rel = HEADSUM_REL[headsum]
    return MMA_REL * term + rel * (relu_term + MMA_REL * term)


def launch_regs(wgs: int) -> int:
    """Registers per thread a CTA of ``threads(wgs)`` threads is launched with when ``wgs`` > 1
    (``__launch_bounds__(threads, 1)``: 65536 / threads, rounded down to 8)."""
    return 65536 // threads(wgs) // 8 * 8


def math_regs(wgs: int) -> int:
    """Registers per math thread after ``setmaxnreg.inc`` (``wgs`` > 1): what the producer warpgroup
    gives up by ``setmaxnreg.dec`` to ``PRODUCER_REGS``, shared among the math warpgroups. setmaxnreg only
    moves registers within the CTA's launch allocation, so
    ``128 * PRODUCER_REGS + 128 * wgs * math_regs(wgs) <= threads(wgs) * launch_regs(wgs)`` (else the
    increase never completes)."""
    total = threads(wgs) * launch_regs(wgs)
    return min(240, (total - 128 * PRODUCER_REGS) // (128 * wgs) // 8 * 8)


def _wgmma_wrapper(n: int) -> str:
    """C++ for ``wgmma_f8(acc, a, desc, accumulate)`` (``acc (+)= A B``) and ``wgmma_f8_neg(acc, a, desc)``
    (``acc -= A B``, imm-scale-a = -1): m64 n``n`` k32 (``n`` = rows per wgmma x heads), e4m3 x e4m3 -> fp32,
    A in registers."""
    heads = n
    n_acc = n // 2
    d = ", ".join(f"%{i}" for i in range(n_acc))
    a = ", ".join(f"%{n_acc + i}" for i in range(4))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(n_acc))
    ins = '"r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc)'
    return (
        "__device__ __forceinline__ void wgmma_f8(float* d, const u32* a, u64 desc, bool accumulate) {\n"
        '    asm volatile("{\\n.reg .pred p;\\n"\n'
        f'        "setp.ne.b32 p, %{n_acc + 5}, 0;\\n"\n'
        f'        "wgmma.mma_async.sync.aligned.m64n{heads}k32.f32.e4m3.e4m3 {{{d}}}, {{{a}}}, %{n_acc + 4}, p, 1, 1;\\n"\n'
        '        "}\\n"\n'
        f"        : {outs}\n"
        f'        : {ins}, "r"(static_cast<u32>(accumulate)));\n'
        "}\n"
        "__device__ __forceinline__ void wgmma_f8_neg(float* d, const u32* a, u64 desc) {\n"
        f'    asm volatile("wgmma.mma_async.sync.aligned.m64n{heads}k32.f32.e4m3.e4m3 {{{d}}}, {{{a}}}, %{n_acc + 4}, 1, -1, 1;\\n"\n'
        f"        : {outs}\n"
        f"        : {ins});\n"
        "}\n"
        "__device__ __forceinline__ void wgmma_bf16_n8(float* d, const u32* a, u64 desc, bool accumulate) {\n"
        '    asm volatile("{\\n.reg .pred p;\\n"\n'
        '        "setp.ne.b32 p, %9, 0;\\n"\n'
        '        "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1, 0;\\n"\n'
        '        "}\\n"\n'
        '        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])\n'
        '        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(static_cast<u32>(accumulate)));\n'
        "}\n"
        "__device__ __forceinline__ void wgmma_tf32(float* d, const u32* a, u64 desc, bool accumulate) {\n"
        '    asm volatile("{\\n.reg .pred p;\\n"\n'
        '        "setp.ne.b32 p, %9, 0;\\n"\n'
        '        "wgmma.mma_async.sync.aligned.m64n8k8.f32.tf32.tf32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1;\\n"\n'
        '        "}\\n"\n'
        '        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])\n'
        '        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(static_cast<u32>(accumulate)));\n'
        "}\n"
    )


def _source(next_n: int, heads: int, out_kind: int, lens_2d: bool, stages: int, min_ctas: int, probe: int,
            split_sign: int, headsum: int, pipeline: int, wgs: int, mma_rows: int) -> str:
    body = SOURCE.read_text()
    marker = "extern \"C\" __global__"
    head, tail = body.split(marker, 1)
    defines = (
        f"#define NEXT_N {next_n}\n#define HEADS {heads}\n#define OUT_KIND {out_kind}\n"
        f"#define LENS_2D {int(lens_2d)}\n#define STAGES {stages}\n#define MIN_CTAS {min_ctas}\n#define PROBE {probe}\n"
        f"#define SPLIT_SIGN {split_sign}\n#define HEADSUM {headsum}\n#define PIPELINE {pipeline}\n#define WGS {wgs}\n"
        f"#define MMA_ROWS {mma_rows}\n"
        f"#define PRODUCER_REGS {PRODUCER_REGS}\n#define MATH_REGS {math_regs(wgs)}\n"
        f"#define THREADS {threads(wgs)}\n#define WG_BYTES {wg_smem_bytes(next_n, heads, stages, headsum)}\n"
        f"#define TL_JOBS {TIMELINE_JOBS}\n#define TL_STAMPS {TIMELINE_STAMPS}\n"
    )
    return defines + head + _wgmma_wrapper(mma_rows * heads) + marker + tail


@functools.lru_cache(maxsize=None)
def build(next_n: int, heads: int, out_kind: int = 0, lens_2d: bool = False, stages: int = DEFAULT_STAGES,
          min_ctas: int | None = None, arch: str = "sm_90a", probe: int = 0,
          split_sign: int = DEFAULT_SPLIT_SIGN, headsum: int = DEFAULT_HEADSUM,
          pipeline: int = DEFAULT_PIPELINE, wgs: int = DEFAULT_WGS,
          mma_rows: int | None = None) -> tuple[bytes, str]:
    """Compile the scorer for one configuration with NVRTC (``ops.nvrtc.compile_cubin``).

    Works without a GPU (NVRTC is a library), which is how the CPU tests
    check that the kernel builds, without spills.

    Args:
        next_n: query rows per request, >= 1 with ``next_n * heads * 128 <= MAX_Q_BYTES``.
        heads: index heads, one of ``HEADS``.
        out_kind: 0 fp32, 1 bf16, 2 fp16 logits.
        lens_2d: ``context_lens`` given per row (``[B, next_n]``) rather than per request.
        stages: pages in flight per math warpgroup, >= 1; all ``wgs`` rings, queries and weights
            within the 227 KB of shared memory a CTA may use.
        min_ctas: with ``wgs`` 1, CTAs per SM the registers are budgeted for (``None``:
            ``default_min_ctas(heads)``); ignored with ``wgs`` > 1 (one CTA per SM, ``setmaxnreg``).
        arch: NVRTC target.
        probe: measurement builds (scripts/sm90_probe.py), bit flags: 1 loads only, 2 no page copies, 4 no wgmma,
            8 no decode, 16 one wgmma per page (on the XOR of the four k steps' fragments), 32 no
            relu/weights/head sum, 64 a timeline of clock stamps over the logits buffer; 0 the scorer.
        split_sign: sign handling: 0 PRMT magnitudes + PRMT signs; 1
            sign-split PRMTs and a negated wgmma; 2 the same split with the negative
            elements read through a reversed LUT by complemented nibbles (IMAD); 3 one wgmma, the
            signs spread by PRMT's sign-replicate mode. See the .cu file.
        headsum: epilogue head sum: 0 fp32 FFMA; 1 a tf32 wgmma of relu(S)
            by the weights (relative error per term below 2**-10 + 2**-11); 2 a bf16 wgmma of relu(S)
            by the weights as hi + lo bf16 (relative error per term below 2**-8 + 2**-16). See the .cu file.
        pipeline: 1 reads the next job's page while this job's wgmma runs.
        wgs: math warpgroups per CTA, 1-4 (> 1: warp-specialised, ``setmaxnreg``; ``min_ctas`` is then 1).
        mma_rows: next_n rows scored by one wgmma (N = ``mma_rows * heads`` <= ``MAX_MMA_N``; a divisor of
            ``next_n``): the page is decoded once and its key fragments multiply the rows' queries in
            one instruction chain; ``None``: ``default_mma_rows(next_n, heads)``.

    Returns:
        ``(cubin bytes, ptxas log)``.

    Raises:
        ValueError: an unsupported configuration, naming the argument.
        RuntimeError: NVRTC is missing or the compile fails (its log in the message).
    """
    if heads not in HEADS:
        raise ValueError(f"heads: expected one of {HEADS}, got {heads}")
    if not isinstance(next_n, int) or next_n < 1:
        raise ValueError(f"next_n: expected an int >= 1, got {next_n!r}")
    if mma_rows is None:
        mma_rows = default_mma_rows(next_n, heads)
    if not isinstance(mma_rows, int) or mma_rows < 1 or next_n % mma_rows or mma_rows * heads > MAX_MMA_N:
        raise ValueError(f"mma_rows: expected a divisor of next_n {next_n} with mma_rows x {heads} heads <= "
                         f"{MAX_MMA_N}, got {mma_rows!r}")
    if query_tile_problem(next_n, heads):
        raise ValueError(f"next_n: {query_tile_problem(next_n, heads)}")
    if out_kind not in (0, 1, 2):
        raise ValueError(f"out_kind: expected 0, 1 or 2, got {out_kind}")
    for name, value, allowed in (("probe", probe, tuple(range(128))), ("split_sign", split_sign, (0, 1, 2, 3)),
                                 ("wgs", wgs, (1, 2, 3, 4)),
                                 ("headsum", headsum, (0, 1, 2)), ("pipeline", pipeline, (0, 1))):
        if value not in allowed:
            raise ValueError(f"{name}: expected one of {allowed}, got {value!r}")
    if not isinstance(stages, int) or stages < 1 or smem_bytes(next_n, heads, stages, headsum, wgs) > MAX_SMEM_BYTES:
        raise ValueError(f"stages: expected an int >= 1 whose rings (one per math warpgroup, wgs {wgs!r}) fit "
                         f"{MAX_SMEM_BYTES} bytes of shared memory with next_n {next_n} x {heads} heads of queries, "
                         f"got {stages!r}")
    if min_ctas is not None and (not isinstance(min_ctas, int) or min_ctas < 1):
        raise ValueError(f"min_ctas: expected an int >= 1, got {min_ctas!r}")
    if min_ctas is None:
        min_ctas = default_min_ctas(heads) if wgs == 1 else 1
    src = _source(next_n, heads, out_kind, lens_2d, stages, min_ctas, probe, split_sign, headsum, pipeline, wgs,
                  mma_rows)
    return nvrtc.compile_cubin(src, "paged_logits_sm90.cu", arch)


def unavailable_reason(device: torch.device | str) -> str | None:
    """Why the sm90 scorer cannot run on ``device`` (``None`` when it can).

    Reasons: not a CUDA device, a ROCm build, compute capability other than
    9.0 (the kernel uses sm_90a's ``wgmma``), or ``cuda-bindings`` missing.
    Nothing is built here: each configuration is built at its first use
    (``serving_unavailable``), and one that cannot be built, loaded or
    launched is warned about once and scored by the Triton kernel from then on
    (on the same schedule; ``ops.serving.describe`` builds the decode one at
    start-up so that a failure shows in the plugin's start-up line).
    """
    device = torch.device(device)
    if device.type != "cuda" or torch.version.hip is not None:
        return "not an NVIDIA CUDA device"
    cap = torch.cuda.get_device_capability(device)
    if cap != (9, 0):
        return f"compute capability {cap[0]}.{cap[1]}, the kernel is built for 9.0 (Hopper)"
    return nvrtc.bindings_missing()


_SERVING_FAILED: dict[tuple, str | None] = {}


def _kernel(device: torch.device, next_n: int, heads: int, out_dtype: torch.dtype, lens_2d: bool,
            stages: int = DEFAULT_STAGES, min_ctas: int | None = None, probe: int = 0,
            split_sign: int = DEFAULT_SPLIT_SIGN, headsum: int = DEFAULT_HEADSUM, pipeline: int = DEFAULT_PIPELINE,
            wgs: int = DEFAULT_WGS, mma_rows: int | None = None):
    """The loaded kernel of one build configuration on ``device`` and its dynamic shared memory in bytes
    (``build`` and ``nvrtc.get_function`` cache both): what ``launch`` runs and ``serving_unavailable`` probes.

    Raises:
        ValueError / RuntimeError: as ``build`` and ``nvrtc.get_function``.
    """
    if mma_rows is None:
        mma_rows = default_mma_rows(next_n, heads)
    cubin, _ = build(next_n, heads, _OUT_KINDS[out_dtype], lens_2d, stages, min_ctas, "sm_90a", probe, split_sign,
                     headsum, pipeline, wgs, mma_rows)
    smem = smem_bytes(next_n, heads, stages, headsum, wgs)
    return nvrtc.get_function(device, cubin, "fp4_paged_logits_sm90", smem), smem


def _device_index(device: torch.device) -> int:
    """CUDA ordinal of ``device`` (the current device for a bare ``"cuda"``)."""
    return device.index if device.index is not None else torch.cuda.current_device()


def serving_unavailable(device: torch.device | str, next_n: int, heads: int, out_dtype: torch.dtype,
                        lens_2d: bool) -> str | None:
    """Why the scorer build that ``launch`` would use for this call cannot run (``None``: it is built and loaded).

    ``unavailable_reason`` builds nothing; this builds and loads exactly the
    configuration of the call (SGLang's lengths are 2-D, GLM-5.x has 32 heads,
    verify has ``next_n`` > 1), with ``launch``'s default options (NVRTC's
    result is cached, so the launch then reuses it), once per device and
    configuration. A failure is remembered and warned about once, and
    ``paged_logits`` scores that configuration with the Triton kernel instead.

    Args:
        device: the CUDA device of the call.
        next_n, heads: rows per request and index heads of the call.
        out_dtype: the logits dtype (fp32, bf16 or fp16).
        lens_2d: ``context_lens`` is ``[B, next_n]`` (or SGLang's per-row ``[rows, 1]``).
    """
    device = torch.device(device)
    index = _device_index(device)
    key = (index, next_n, heads, out_dtype, bool(lens_2d))
    if key in _SERVING_FAILED:
        return _SERVING_FAILED[key]
    try:
        _kernel(torch.device("cuda", index), next_n, heads, out_dtype, bool(lens_2d))
    except (RuntimeError, ValueError) as e:
        return record_serving_failure(device, next_n, heads, out_dtype, lens_2d, e)
    _SERVING_FAILED[key] = None
    return None


def record_serving_failure(device: torch.device | str, next_n: int, heads: int, out_dtype: torch.dtype,
                           lens_2d: bool, error: Exception) -> str:
    """Remember that this configuration cannot run (its build, load or launch raised ``error``), warn once.

    Returns:
        The reason (what ``serving_unavailable`` returns for it from now on).
    """
    index = _device_index(torch.device(device))
    key = (index, next_n, heads, out_dtype, bool(lens_2d))
    if not _SERVING_FAILED.get(key):
        why = (f"the Hopper kernel for next_n {next_n}, {heads} heads, {out_dtype} logits, "
               f"{'[B, next_n]' if lens_2d else '[B]'} lengths could not be built, loaded or launched ({error})")
        _SERVING_FAILED[key] = why
        warnings.warn(f"sglang-fp4-indexer: {why}; scoring it with the Triton kernels", stacklevel=3)
    return _SERVING_FAILED[key]


def available(device: torch.device | str) -> bool:
    """Whether the sm90 scorer can run on ``device`` (see ``unavailable_reason``)."""
    return unavailable_reason(device) is None


def query_tile_problem(next_n: int, heads: int) -> str | None:
    """Why one tile cannot hold ``next_n`` rows of ``heads`` index queries (``None``: it can).

    The kernel keeps a request's ``next_n x heads x 128`` e4m3 query bytes in
    ``MAX_Q_BYTES`` (32 KB) of shared memory: at 64 heads next_n <= 4, at 32 heads <= 8.
    """
    if next_n * heads * 128 > MAX_Q_BYTES:
        return (f"{next_n} x {heads} heads of index queries exceed the Hopper kernel's "
                f"{MAX_Q_BYTES // 1024} KB of shared memory for them")
    return None


def supports(q: torch.Tensor, cache: torch.Tensor, next_n: int, heads: int) -> str | None:
    """Why these inputs need the Triton scorer instead (``None``: the sm90 kernel takes them).

    It takes e4m3 index queries with 16-byte aligned rows and heads, a
    16-byte aligned cache (bulk copies), ``heads`` in ``HEADS``,
    ``next_n * heads * 128 <= MAX_Q_BYTES``, and the NVIDIA scale-plane layout
    (``pool.scale_row`` the identity: the kernel reads a token's scales at its row).
    """
    if not scale_row_is_identity(PAGE_SIZE):
        return "pool.scale_row is not the identity (the kernel reads scales at the token's row)"
    if q.dtype != torch.float8_e4m3fn:
        return "index queries are not float8_e4m3fn"
    if heads not in HEADS:
        return f"{heads} heads"
    if query_tile_problem(next_n, heads):
        return query_tile_problem(next_n, heads)
    if q.data_ptr() % 16 or q.stride(0) % 16 or q.stride(1) % 16:
        return "index query rows are not 16-byte aligned"
    if cache.data_ptr() % 16:
        return "the cache is not 16-byte aligned"
    return None


def wg_smem_bytes(next_n: int, heads: int, stages: int = DEFAULT_STAGES, headsum: int = DEFAULT_HEADSUM) -> int:
    """Shared memory of one math warpgroup, in bytes (the kernel's WG_BYTES; it static_asserts that
    its layout fits): its queries, head-sum tiles
    (``headsum`` 1: tf32, 32 bytes per head; 2: bf16, 16), page ring, permuted weights
    (padded rows of ``heads / 4 + 4`` floats), per stage a 16-byte job slot and two 8-byte mbarriers,
    rounded up to the 1 KB swizzle atom."""
    per_wg = (next_n * heads * 128 + {0: 0, 1: 32, 2: 16}[headsum] * next_n * heads + stages * PAGE_SIZE * 68
              + next_n * 4 * (heads // 4 + 4) * 4 + 32 * stages)
    return -(-per_wg // 1024) * 1024


def smem_bytes(next_n: int, heads: int, stages: int = DEFAULT_STAGES, headsum: int = DEFAULT_HEADSUM,
               wgs: int = DEFAULT_WGS) -> int:
    """Dynamic shared memory of one CTA, in bytes: ``wgs`` x ``wg_smem_bytes`` plus 1 KB of slack to
    align the window to the swizzle atom."""
    return wgs * wg_smem_bytes(next_n, heads, stages, headsum) + 1024


def launch(q, weights, cache, block_table, context_lens, schedule, out, *, batch: int, next_n: int, heads: int,
           width: int, block_kv: int, stages: int = DEFAULT_STAGES, min_ctas: int | None = None,
           probe: int = 0, split_sign: int = DEFAULT_SPLIT_SIGN, headsum: int = DEFAULT_HEADSUM,
           pipeline: int = DEFAULT_PIPELINE, wgs: int = DEFAULT_WGS, mma_rows: int | None = None,
           clean_logits: bool = True) -> None:
    """Launch the sm90 scorer on torch's current stream (arguments already validated by ``paged_logits``).

    Shapes as ``ops.paged_logits.paged_logits``; ``block_kv`` a multiple of
    the page size (the schedule's tile); one math warpgroup per schedule
    entry, ``wgs`` of them per CTA (``threads(wgs)`` threads); ``mma_rows`` as ``build``.
    ``clean_logits=False`` skips writing ``-inf`` from each request's last page
    to ``width`` (the serving path: SGLang's top-k masks by length).

    Raises:
        ValueError: an unsupported build configuration (``build``).
        RuntimeError: the build, the load or the launch fails.
    """
    device = q.device
    fn, smem = _kernel(device, next_n, heads, out.dtype, context_lens.dim() == 2, stages, min_ctas, probe, split_sign,
                       headsum, pipeline, wgs, mma_rows)
    args = [
        ctypes.c_void_p(q.data_ptr()),
        ctypes.c_void_p(weights.data_ptr()),
        ctypes.c_void_p(cache.data_ptr()),
        ctypes.c_void_p(block_table.data_ptr()),
        ctypes.c_void_p(context_lens.data_ptr()),
        ctypes.c_void_p(schedule.data_ptr()),
        ctypes.c_void_p(out.data_ptr()),
        ctypes.c_int(batch),
        ctypes.c_int(cache.shape[0]),
        ctypes.c_int(block_table.shape[1]),
        ctypes.c_int(width),
        ctypes.c_longlong(q.stride(0)),
        ctypes.c_longlong(q.stride(1)),
        ctypes.c_longlong(weights.stride(0)),
        ctypes.c_longlong(block_table.stride(0)),
        ctypes.c_longlong(out.stride(0)),
        ctypes.c_int(block_kv),
        ctypes.c_int(schedule.shape[0] - 1),
        ctypes.c_int(int(bool(clean_logits))),
    ]
    num_ctas = schedule.shape[0] - 1
    nvrtc.launch(fn, device, -(-num_ctas // wgs), threads(wgs), smem, args)
