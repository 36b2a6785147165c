"""The Hopper scorer with every build option it was measured with: the experiments' builder.

A copy of the product's ``sglang_fp4_indexer/ops/sm90.py`` as of git tag
``sm90-experiments-2026-12`` (commit 1e88a43), building ``cuda/paged_logits_sm90_variants.cu``
(the kernel with all its variants: SPLIT_SIGN, HEADSUM, PIPELINE, WGS, MIN_CTAS, STAGES,
PROBE and its timeline) through the product's ``ops.nvrtc``. The product kernel is this one
at ``PRODUCTION`` (``experiments/sm90_equivalence.py`` checks that); the probes in this folder
build the others. Not shipped with the package.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from sglang_fp4_indexer.ops import nvrtc, sm90
from sglang_fp4_indexer.ops.sm90 import (HEADS, MAX_MMA_N, MAX_SMEM_BYTES, MMA_REL, MMA_ROWS_DEFAULTS,
                                         PRODUCER_REGS, query_tile_problem)
from sglang_fp4_indexer.pool import PAGE_SIZE

#: The kernel's CUDA C++ source.
SOURCE = Path(__file__).with_name("cuda") / "paged_logits_sm90_variants.cu"
#: Pages in flight per CTA (the ring depth).
DEFAULT_STAGES = 4
#: With ``wgs`` 1 only: CTAs per SM the register budget is set for (``__launch_bounds__``:
#: 96 registers); H = 128 gets 2. Four resident CTAs measured fastest (docs/perf-notes.md, "The warp-specialised CTA").
DEFAULT_MIN_CTAS = 4


def default_min_ctas(heads: int) -> int:
    """CTAs per SM the kernel for ``heads`` is built for (its accumulators grow with H)."""
    return 2 if heads >= 128 else DEFAULT_MIN_CTAS


#: Sign handling of the decode (build option SPLIT_SIGN; docs/perf-notes.md, "The format's decode on Hopper"):
#: 3, the signs by PRMT sign-replicate (7 ALU operations per payload word against 9).
DEFAULT_SPLIT_SIGN = 3
#: Head sum of the epilogue (build option HEADSUM): 0 fp32 FFMA, 1 tf32 wgmma, 2 bf16 wgmma
#: (docs/perf-notes.md, "The head sum"): 2, 3-4 % faster than 0 at long context; its rounding
#: (``HEADSUM_REL[2]``) moves the top-k recall by at most 3.4e-4 (experiments/headsum_recall.py).
DEFAULT_HEADSUM = 2
#: Software pipeline of the math loop (build option PIPELINE; docs/perf-notes.md, "What was tried and not kept").
DEFAULT_PIPELINE = 0
#: Math warpgroups per CTA (build option WGS): 1 with one producer warp, several CTAs per SM;
#: 2-4 warp-specialised with a producer warpgroup and setmaxnreg, one CTA per SM (docs/perf-notes.md,
#: "The warp-specialised CTA").
DEFAULT_WGS = 4
#: Relative rounding per term of each head sum (build option HEADSUM): 0 fp32 FFMA (none beyond fp32),
#: 1 tf32 (relu(S) truncated, weights rounded: 2**-10 + 2**-11), 2 bf16 (relu(S) rounded, bf16's unit
#: roundoff, and the weights as hi + lo: 2**-8 + 2**-16).
HEADSUM_REL = {0: 0.0, 1: 2.0**-10 + 2.0**-11, 2: 2.0**-8 + 2.0**-16}
#: PROBE 64 (timeline) record layout: per math warp, its first TIMELINE_JOBS jobs x TIMELINE_STAMPS u32
#: (experiments/sm90_probe.py reads them).
TIMELINE_JOBS, TIMELINE_STAMPS = 32, 8

_OUT_KINDS = sm90.OUT_KINDS


def default_mma_rows(next_n: int, heads: int) -> int:
    """Rows of a request's next_n scored by one wgmma (``MMA_ROWS_DEFAULTS``, else 1)."""
    return MMA_ROWS_DEFAULTS.get((next_n, heads), 1)


def threads(wgs: int) -> int:
    """Threads of one CTA: ``wgs`` math warpgroups and a producer warp (``wgs`` 1) or warpgroup (one warp
    per math warpgroup; setmaxnreg works on whole warpgroups)."""
    return 128 * wgs + (32 if wgs == 1 else 128)


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
            split_sign: int, headsum: int, pipeline: int, wgs: int, mma_rows: int, text: str | None = None) -> str:
    body = SOURCE.read_text() if text is None else text
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
          mma_rows: int | None = None, text: str | None = None) -> tuple[bytes, str]:
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
        probe: measurement builds (experiments/sm90_probe.py), bit flags: 1 loads only, 2 no page copies, 4 no wgmma,
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
                  mma_rows, text)
    return nvrtc.compile_cubin(src, "paged_logits_sm90_variants.cu", arch, verbose=True)


def _kernel(device: torch.device, next_n: int, heads: int, out_dtype: torch.dtype, lens_2d: bool,
            stages: int = DEFAULT_STAGES, min_ctas: int | None = None, probe: int = 0,
            split_sign: int = DEFAULT_SPLIT_SIGN, headsum: int = DEFAULT_HEADSUM, pipeline: int = DEFAULT_PIPELINE,
            wgs: int = DEFAULT_WGS, mma_rows: int | None = None, text: str | None = None):
    """The loaded kernel of one build configuration on ``device`` and its dynamic shared memory in bytes
    (``build`` and ``nvrtc.get_function`` cache both): what ``launch`` runs and ``serving_unavailable`` probes.

    Raises:
        ValueError / RuntimeError: as ``build`` and ``nvrtc.get_function``.
    """
    if mma_rows is None:
        mma_rows = default_mma_rows(next_n, heads)
    cubin, _ = build(next_n, heads, _OUT_KINDS[out_dtype], lens_2d, stages, min_ctas, "sm_90a", probe, split_sign,
                     headsum, pipeline, wgs, mma_rows, text)
    smem = smem_bytes(next_n, heads, stages, headsum, wgs)
    return nvrtc.get_function(device, cubin, "fp4_paged_logits_sm90", smem), smem


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
           clean_logits: bool = True, text: str | None = None) -> None:
    """Launch the sm90 scorer on torch's current stream (arguments already validated by ``paged_logits``).

    Shapes as ``ops.paged_logits.paged_logits``; ``block_kv`` a multiple of
    the page size (the schedule's tile); one math warpgroup per schedule
    entry, ``wgs`` of them per CTA (``threads(wgs)`` threads); ``mma_rows`` as ``build``.
    ``clean_logits=False`` skips writing ``-inf`` from each request's last page
    to ``width`` (the serving path: SGLang's top-k masks by length). ``text``: build this
    CUDA source instead of ``SOURCE`` (experiments/sm90_source_ab.py's variants of it).

    Raises:
        ValueError: an unsupported build configuration (``build``).
        RuntimeError: the build, the load or the launch fails.
    """
    device = q.device
    fn, smem = _kernel(device, next_n, heads, out.dtype, context_lens.dim() == 2, stages, min_ctas, probe, split_sign,
                       headsum, pipeline, wgs, mma_rows, text)
    args = sm90._kernel_args(q, weights, cache, block_table, context_lens, schedule, out, batch, width, block_kv,
                             clean_logits)
    num_ctas = schedule.shape[0] - 1
    nvrtc.launch(fn, device, -(-num_ctas // wgs), threads(wgs), smem, args)


#: The build options of the product kernel (``sglang_fp4_indexer/ops/sm90.py``): ``source(next_n, heads,
#: out_kind, lens_2d, **PRODUCTION, mma_rows=default_mma_rows(next_n, heads))`` is what it compiled at
#: commit 1e88a43 (min_ctas 1: ``build``'s default at WGS > 1).
PRODUCTION = dict(stages=DEFAULT_STAGES, min_ctas=1, probe=0, split_sign=DEFAULT_SPLIT_SIGN, headsum=DEFAULT_HEADSUM,
                  pipeline=DEFAULT_PIPELINE, wgs=DEFAULT_WGS)


def source(next_n: int, heads: int, out_kind: int = 0, lens_2d: bool = False, *, stages: int = DEFAULT_STAGES,
           min_ctas: int = 1, probe: int = 0, split_sign: int = DEFAULT_SPLIT_SIGN, headsum: int = DEFAULT_HEADSUM,
           pipeline: int = DEFAULT_PIPELINE, wgs: int = DEFAULT_WGS, mma_rows: int | None = None) -> str:
    """The program text NVRTC compiles for these build options (the defines, then the kernel with its
    wgmma wrappers), as ``build`` makes it."""
    if mma_rows is None:
        mma_rows = default_mma_rows(next_n, heads)
    return _source(next_n, heads, out_kind, lens_2d, stages, min_ctas, probe, split_sign, headsum, pipeline, wgs,
                   mma_rows)
