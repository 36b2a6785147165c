"""The Hopper (sm_90a) paged scorer: CUDA C++ built at first use by NVRTC.

``paged_logits(impl="wgmma")`` (the default on compute capability 9.0) runs
``cuda/paged_logits_sm90.cu``: decoded FP4 index keys as the register A
operand of FP8 ``wgmma``, the index queries as its shared-memory B operand,
pages copied by the bulk-copy engine into an mbarrier ring by a producer warp.
One CTA per SM holds ``WGS`` (4) math warpgroups, each with its own schedule
entry, ring and producer warp, the producers' registers moved to the math
warpgroups by ``setmaxnreg`` (docs/perf-notes.md, "The warp-specialised CTA";
why CUDA C++ and not Triton: "Why CUDA C++ through NVRTC").

What varies between calls is a ``Config`` (next_n, heads, logits dtype,
lengths form, rows per wgmma), derived from the call by ``Config.of_call``;
everything else is fixed here. Each configuration is compiled once with NVRTC
from ``cuda-bindings`` (an SGLang dependency; ``pip install
'sglang-fp4-indexer[cuda]'`` otherwise) through ``ops.nvrtc``, loaded into the
current device's context and launched on torch's current stream, so it is
captured by CUDA graphs like any torch kernel. The kernel variants that were
measured and not kept live in the repository's ``experiments/`` folder. Nothing
here imports SGLang.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import torch

from ..pool import PAGE_SIZE
from . import nvrtc
from ._common import MAX_NEXT_N, scale_row_is_identity

__all__ = ["Config", "Launcher", "available", "unavailable_reason", "supports", "configuration_problem",
           "query_tile_problem", "serving_unavailable", "record_serving_failure", "launcher", "launch", "rel_bound",
           "logit_error_bound", "logit_error_floor", "keyfold_table", "MAX_Q_BYTES", "ARG_FORMAT"]

#: The kernel's CUDA C++ source.
SOURCE = Path(__file__).with_name("cuda") / "paged_logits_sm90.cu"
#: Pages in flight per math warpgroup (the ring depth; 3, 4 and 6 measured within 1 %).
STAGES = 4
#: Math warpgroups per CTA; with the producer warpgroup one CTA fills an SM.
WGS = 4
#: Threads of one CTA: ``WGS`` math warpgroups and one producer warpgroup (one warp per math
#: warpgroup; setmaxnreg works on whole warpgroups).
THREADS = 128 * WGS + 128
#: Registers per thread of the CTA at launch (``__launch_bounds__(THREADS, 1)``: 65536 / THREADS,
#: rounded down to 8).
LAUNCH_REGS = 65536 // THREADS // 8 * 8
#: Register budget of the producer warpgroup (setmaxnreg.dec; the smallest allowed).
PRODUCER_REGS = 24
#: Registers per math thread after setmaxnreg.inc: what the producer warpgroup gives up, shared among
#: the math warpgroups. setmaxnreg only moves registers within the CTA's launch allocation, so
#: ``128 * PRODUCER_REGS + 128 * WGS * MATH_REGS <= THREADS * LAUNCH_REGS`` (else the increase never completes).
MATH_REGS = min(240, (THREADS * LAUNCH_REGS - 128 * PRODUCER_REGS) // (128 * WGS) // 8 * 8)

#: Heads the kernel is built for (wgmma N = heads x rows per wgmma).
HEADS = (16, 32, 64, 128)
#: Largest next_n x heads x 128 bytes of index queries kept in shared memory.
MAX_Q_BYTES = 32 * 1024
#: Dynamic shared memory one CTA may use on Hopper (227 KB).
MAX_SMEM_BYTES = 227 * 1024
#: Logits dtype -> the kernel's OUT_KIND.
OUT_KINDS = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
#: next_n rows per wgmma by (next_n, heads); 1 where absent. Measured on H200 (docs/perf-notes.md,
#: "One wgmma across next_n rows"): at H 32 one N = 128 wgmma per page is 1-5 % faster than one per
#: row; at H 64 it is 1-3 % slower, so rows keep their own wgmma there.
MMA_ROWS_DEFAULTS: dict[tuple[int, int], int] = {(2, 32): 2, (4, 32): 4}
#: Widest wgmma N (rows per wgmma x heads) whose accumulators fit a math thread's ``MATH_REGS``
#: (N = 256 does not build).
MAX_MMA_N = 128

#: Relative error of a head score ``s_h`` from the score wgmma's accumulation in f16 (``.f16.e4m3.e4m3``),
#: relative to ``sum_d |q_hd k_d|``: what Hopper's FP8 MMA loses inside a step, narrower than fp32
#: (DeepGEMM's notes; 1e-3, measured in docs/perf-notes.md, "The head sum"), plus one rounding to f16
#: per k32 step, four per head score, taken as faithful (below one unit in the last place, 2**-10
#: relative: round-to-nearest and truncation alike, the hardware's rounding is not documented):
#: ``1e-3 + gamma_4``, ``gamma_4 = 4 u / (1 - 4 u)``, ``u = 2**-10``.
MMA_REL = 1e-3 + 4 * 2.0**-10 / (1 - 4 * 2.0**-10)
#: Relative rounding per term of the head sum, an f16 wgmma with fp32 accumulation, relative to
#: ``sum_h |w_h| relu(s_h)``: relu(S) enters exact (the f16 accumulator as it stands); the weights enter as
#: hi + lo f16 after a power of two per row (2**-22); the heads' additions (at most 128) are taken at
#: 2**-22 each, as coarse as the FP8 MMA's accumulation (2**-15), and the hi and lo sums' one fp32
#: addition (2**-24).
HEADSUM_REL = 2.0**-15 + 2.0**-21
#: Lowest decode exponent field ``A = s_g - s_max + 3`` with its own LUT row (``keyfold_table``); a group
#: further below its key's largest is zero.
KEYFOLD_LOW = -6
#: Groups with ``A`` at or below this are not exact: their e4m3 subnormals are rounded to nearest.
KEYFOLD_EXACT_LOW = -2


def query_tile_problem(next_n: int, heads: int) -> str | None:
    """Why one tile cannot hold ``next_n`` rows of ``heads`` index queries (``None``: it can).

    The kernel keeps a request's ``next_n x heads x 128`` e4m3 query bytes in
    ``MAX_Q_BYTES`` (32 KB) of shared memory: at 64 heads next_n <= 4, at 32 heads <= 8.
    """
    if next_n * heads * 128 > MAX_Q_BYTES:
        return (f"{next_n} x {heads} heads of index queries exceed the Hopper kernel's "
                f"{MAX_Q_BYTES // 1024} KB of shared memory for them")
    return None


def layout(next_n: int, heads: int) -> dict[str, int]:
    """Shared memory of one math warpgroup, in bytes: the one source of the kernel's layout.

    Passed to the kernel as defines (it ``static_assert``-s what the hardware
    needs of it). Regions in order: the queries (``next_n`` x ``Q_BYTES``, the
    128-byte swizzle's 1024-byte atoms from offset 0), the head-sum B tiles
    (``next_n`` x ``HS_BYTES``: bf16, ``heads / 16`` tiles of 256 bytes), the
    page ring (``STAGES`` pages of ``PAGE_SIZE * 68`` bytes), the permuted
    weights (``next_n`` x 4 rows of ``W_STRIDE`` = ``heads / 4 + 4`` floats),
    ``STAGES`` 16-byte job slots and ``2 * STAGES`` 8-byte mbarriers;
    ``WG_BYTES`` is the end rounded up to the 1024-byte swizzle atom.

    Returns:
        ``{"Q_BYTES", "HS_BYTES", "W_STRIDE", "HS_OFF", "RING_OFF", "W_OFF", "INFO_OFF", "BAR_OFF", "WG_BYTES"}``
        (``W_STRIDE`` in floats, the rest in bytes).
    """
    q_bytes, hs_bytes, w_stride = heads * 128, heads * 16, heads // 4 + 4
    hs_off = next_n * q_bytes
    ring_off = hs_off + next_n * hs_bytes
    w_off = ring_off + STAGES * PAGE_SIZE * 68
    info_off = w_off + next_n * 4 * w_stride * 4
    bar_off = info_off + 16 * STAGES
    wg_bytes = -(-(bar_off + 16 * STAGES) // 1024) * 1024
    return {"Q_BYTES": q_bytes, "HS_BYTES": hs_bytes, "W_STRIDE": w_stride, "HS_OFF": hs_off, "RING_OFF": ring_off,
            "W_OFF": w_off, "INFO_OFF": info_off, "BAR_OFF": bar_off, "WG_BYTES": wg_bytes}


@dataclasses.dataclass(frozen=True)
class Config:
    """One build of the kernel: what varies between serving calls.

    Attributes:
        next_n: query rows per request, >= 1 with ``next_n * heads * 128 <= MAX_Q_BYTES``.
        heads: index heads, one of ``HEADS``.
        out_kind: logits dtype, 0 fp32, 1 bf16, 2 fp16 (``OUT_KINDS``).
        lens_2d: ``context_lens`` given per row (``[B, next_n]``) rather than per request (``[B]``).
        mma_rows: next_n rows scored by one wgmma (a divisor of ``next_n``, ``mma_rows * heads <=
            MAX_MMA_N``): the page is decoded once and its key fragments multiply the rows' queries
            in one instruction chain; serving uses ``MMA_ROWS_DEFAULTS`` (``of_call``).

    Raises:
        ValueError: an unsupported value, naming the field.
    """

    next_n: int
    heads: int
    out_kind: int = 0
    lens_2d: bool = False
    mma_rows: int = 1

    def __post_init__(self):
        if self.heads not in HEADS:
            raise ValueError(f"heads: expected one of {HEADS}, got {self.heads!r}")
        if isinstance(self.next_n, bool) or not isinstance(self.next_n, int) or self.next_n < 1:
            raise ValueError(f"next_n: expected an int >= 1, got {self.next_n!r}")
        if query_tile_problem(self.next_n, self.heads):
            raise ValueError(f"next_n: {query_tile_problem(self.next_n, self.heads)}")
        if self.out_kind not in (0, 1, 2) or isinstance(self.out_kind, bool):
            raise ValueError(f"out_kind: expected 0, 1 or 2, got {self.out_kind!r}")
        if not isinstance(self.lens_2d, bool):
            raise ValueError(f"lens_2d: expected a bool, got {self.lens_2d!r}")
        m = self.mma_rows
        if isinstance(m, bool) or not isinstance(m, int) or m < 1 or self.next_n % m or m * self.heads > MAX_MMA_N:
            raise ValueError(f"mma_rows: expected a divisor of next_n {self.next_n} with mma_rows x {self.heads} "
                             f"heads <= {MAX_MMA_N}, got {m!r}")

    @classmethod
    def of_call(cls, next_n: int, heads: int, out_dtype: torch.dtype, lens_2d: bool) -> Config:
        """The configuration serving builds for a call: its next_n, heads, logits dtype (fp32, bf16 or
        fp16) and lengths form, with ``MMA_ROWS_DEFAULTS`` rows per wgmma.

        Raises:
            ValueError: an unsupported value, naming it.
        """
        if cls is not Config:
            raise TypeError("of_call: call it on Config")
        return _of_call(next_n, heads, out_dtype, bool(lens_2d))

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory of one CTA, in bytes: ``WGS`` x ``WG_BYTES`` plus 1 KB of slack to align the
        window to the swizzle atom."""
        return WGS * layout(self.next_n, self.heads)["WG_BYTES"] + 1024

    def defines(self) -> tuple[tuple[str, int], ...]:
        """The ``#define`` lines the kernel is compiled with: this configuration, the fixed constants and
        ``layout``."""
        return (("NEXT_N", self.next_n), ("HEADS", self.heads), ("OUT_KIND", self.out_kind),
                ("LENS_2D", int(self.lens_2d)), ("MMA_ROWS", self.mma_rows), ("STAGES", STAGES), ("WGS", WGS),
                ("PRODUCER_REGS", PRODUCER_REGS), ("MATH_REGS", MATH_REGS), ("THREADS", THREADS),
                *layout(self.next_n, self.heads).items())

    def describe(self) -> str:
        """How warnings name this build, e.g. ``"the Hopper kernel for next_n 1, 64 heads, torch.float32 logits,
        [B, next_n] lengths"``."""
        dtype = {v: k for k, v in OUT_KINDS.items()}[self.out_kind]
        return (f"the Hopper kernel for next_n {self.next_n}, {self.heads} heads, {dtype} logits, "
                f"{'[B, next_n]' if self.lens_2d else '[B]'} lengths")


@functools.lru_cache(maxsize=None)
def _of_call(next_n: int, heads: int, out_dtype: torch.dtype, lens_2d: bool) -> Config:
    """``Config.of_call``, one object per call configuration (serving asks on every call)."""
    if out_dtype not in OUT_KINDS:
        raise ValueError(f"out_dtype: expected float32, bfloat16 or float16, got {out_dtype}")
    return Config(next_n, heads, OUT_KINDS[out_dtype], lens_2d, MMA_ROWS_DEFAULTS.get((next_n, heads), 1))


def served_configs():
    """Every ``Config`` serving can ask for (``Config.of_call`` over next_n 1 .. ``MAX_NEXT_N``
    within ``MAX_Q_BYTES``, ``HEADS``, the three logits dtypes and both lengths forms)."""
    for heads in HEADS:
        for next_n in range(1, MAX_NEXT_N + 1):
            if query_tile_problem(next_n, heads) is None:
                for dtype in OUT_KINDS:
                    for lens_2d in (False, True):
                        yield Config.of_call(next_n, heads, dtype, lens_2d)


def keyfold_table() -> list[tuple[int, int]]:
    """The decode's LUT rows for the low exponent fields ``A = KEYFOLD_LOW .. 0`` and a row of zeros (what the
    kernel's ``KEYFOLD_TABLE`` holds): row ``A - KEYFOLD_LOW`` is ``(lo, hi)``, the little-endian words of the
    bytes ``e4m3(E2M1(x) x 2**(A - 6))`` for the magnitude codes ``x = 0 .. 3`` and ``4 .. 7``, rounded to
    nearest (ties to even) by torch's ``float8_e4m3fn`` cast; below ``2**-6`` they are e4m3 subnormals
    (docs/format.md, "How the scorers read it").

    Returns:
        ``1 - KEYFOLD_LOW + 1`` pairs of ints (8).
    """
    from ..format import E2M1_MAGNITUDES

    rows = []
    for a in range(KEYFOLD_LOW, 1):
        mags = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float64) * 2.0 ** (a - 6)
        b = bytes(mags.to(torch.float32).to(torch.float8_e4m3fn).view(torch.uint8).tolist())
        rows.append((int.from_bytes(b[:4], "little"), int.from_bytes(b[4:], "little")))
    return rows + [(0, 0)]


def _wgmma_wrapper(n: int) -> str:
    """C++ for ``wgmma_f8(acc, a, desc, accumulate)`` (``acc (+)= A B``: m64 n``n`` k32, ``n`` = rows per wgmma x
    heads, e4m3 x e4m3 -> f16, ``n / 4`` registers of f16x2, A in registers), ``wgmma_f16_n8`` (the head sum:
    m64n8k16 f16 -> fp32) and ``KEYFOLD_TABLE``, the rows of ``keyfold_table`` (a global constant array: copying
    it into shared memory at the kernel's start measured 0.3 µs faster at 1 x 4K than building the rows from
    immediates)."""
    n_acc = n // 4
    d = ", ".join(f"%{i}" for i in range(n_acc))
    a = ", ".join(f"%{n_acc + i}" for i in range(4))
    outs = ", ".join(f'"+r"(d[{i}])' for i in range(n_acc))
    ins = '"r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc)'
    table = ", ".join(f"{{0x{lo:08X}u, 0x{hi:08X}u}}" for lo, hi in keyfold_table())
    return (
        "// The decode's low-exponent LUT rows (sm90.keyfold_table), copied into shared memory at the start.\n"
        f"static __device__ const uint2 KEYFOLD_TABLE[8] = {{{table}}};\n"
        "__device__ __forceinline__ void wgmma_f8(u32* d, const u32* a, u64 desc, bool accumulate) {\n"
        '    asm volatile("{\\n.reg .pred p;\\n"\n'
        f'        "setp.ne.b32 p, %{n_acc + 5}, 0;\\n"\n'
        f'        "wgmma.mma_async.sync.aligned.m64n{n}k32.f16.e4m3.e4m3 {{{d}}}, {{{a}}}, %{n_acc + 4}, p, 1, 1;\\n"\n'
        '        "}\\n"\n'
        f"        : {outs}\n"
        f'        : {ins}, "r"(static_cast<u32>(accumulate)));\n'
        "}\n"
        "__device__ __forceinline__ void wgmma_f16_n8(float* d, const u32* a, u64 desc, bool accumulate) {\n"
        '    asm volatile("{\\n.reg .pred p;\\n"\n'
        '        "setp.ne.b32 p, %9, 0;\\n"\n'
        '        "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1, 0;\\n"\n'
        '        "}\\n"\n'
        '        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])\n'
        '        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(static_cast<u32>(accumulate)));\n'
        "}\n"
    )


_MARKER = 'extern "C" __global__'


@functools.lru_cache(maxsize=None)
def _source_text(n: int) -> str:
    """``SOURCE`` with the wgmma wrappers for N = ``n`` inserted before the kernel (read once per N)."""
    head, tail = SOURCE.read_text().split(_MARKER, 1)
    return head + _wgmma_wrapper(n) + _MARKER + tail


@functools.lru_cache(maxsize=None)
def _spec(config: Config) -> nvrtc.KernelSpec:
    """The ``nvrtc.KernelSpec`` of ``config`` (one object per configuration: serving looks it up per call)."""
    return nvrtc.KernelSpec(_source_text(config.mma_rows * config.heads), "paged_logits_sm90.cu",
                            "fp4_paged_logits_sm90", config.defines(), config.smem_bytes, config.describe(),
                            "scoring it with the Triton kernels")


def build(config: Config, arch: str = "sm_90a", *, verbose: bool | None = None) -> tuple[bytes, str]:
    """Compile the scorer for ``config`` with NVRTC (``ops.nvrtc.compile_cubin``, built once per configuration).

    Works without a GPU (NVRTC is a library), which is how the CPU tests check
    that the kernel builds, without spills.

    Args:
        config: the build.
        arch: NVRTC target.
        verbose: build with ptxas ``-v`` (its log reports registers and spills); ``None``: as
            ``SGLANG_FP4_INDEXER_PTXAS_VERBOSE`` says.

    Returns:
        ``(cubin bytes, ptxas log)``.

    Raises:
        RuntimeError: NVRTC is missing or the compile fails (its log in the message).
    """
    spec = _spec(config)
    return nvrtc.compile_cubin(spec.source, spec.name, arch, spec.defines, verbose=verbose)


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


def available(device: torch.device | str) -> bool:
    """Whether the sm90 scorer can run on ``device`` (see ``unavailable_reason``)."""
    return unavailable_reason(device) is None


def serving_unavailable(device: torch.device | str, config: Config) -> str | None:
    """Why ``config`` cannot run on ``device`` (``None``: it is built and loaded).

    ``unavailable_reason`` builds nothing; this builds and loads exactly the
    configuration of the call (SGLang's lengths are 2-D, GLM-5.x has 32 heads,
    verify has ``next_n`` > 1) once per device and configuration
    (``ops.nvrtc.load``; ``launch`` reuses it). A failure is remembered and
    warned about once, and ``paged_logits`` scores that configuration with the
    Triton kernel instead.
    """
    spec = _spec(config)
    if nvrtc.load(device, spec) is None:
        return nvrtc.failure(device, spec)
    return None


def record_serving_failure(device: torch.device | str, config: Config, error: Exception) -> str:
    """Remember that ``config`` cannot run on ``device`` (its build, load or launch raised ``error``), warn once.

    Returns:
        The reason (what ``serving_unavailable`` returns for it from now on).
    """
    return nvrtc.record_failure(device, _spec(config), error)


def supports(q: torch.Tensor, cache: torch.Tensor, next_n: int, heads: int) -> str | None:
    """Why these inputs need the Triton scorer instead (``None``: the sm90 kernel takes them).

    It takes e4m3 index queries with 16-byte aligned rows and heads, a
    16-byte aligned cache (bulk copies), ``heads`` in ``HEADS``,
    ``next_n * heads * 128 <= MAX_Q_BYTES``, and the NVIDIA scale-plane layout
    (``pool.scale_row`` the identity: the kernel reads a token's scales at its row).
    """
    why = configuration_problem(q.dtype, next_n, heads)
    if why is not None:
        return why
    if q.data_ptr() % 16 or q.stride(0) % 16 or q.stride(1) % 16:
        return "index query rows are not 16-byte aligned"
    if cache.data_ptr() % 16:
        return "the cache is not 16-byte aligned"
    return None


def configuration_problem(q_dtype: torch.dtype, next_n: int, heads: int) -> str | None:
    """Why the sm90 kernel has no build for index queries of ``q_dtype`` with ``next_n`` rows of ``heads`` heads
    (``None``: it has); what ``supports`` checks besides the tensors' alignment."""
    if not scale_row_is_identity(PAGE_SIZE):
        return "pool.scale_row is not the identity (the kernel reads scales at the token's row)"
    if q_dtype != torch.float8_e4m3fn:
        return "index queries are not float8_e4m3fn"
    if heads not in HEADS:
        return f"{heads} heads"
    return query_tile_problem(next_n, heads)


def rel_bound() -> float:
    """The kernel's relative logit error bound as one factor of the term bound ``sum_h |w_h| sum_d |q_hd k_d|``
    of each key (what the benchmark's check allows, with ``logit_error_floor`` added): ``MMA_REL + HEADSUM_REL
    (1 + MMA_REL)`` (the head sum's rounding is relative to ``sum_h |w_h| relu(s_h)``, which the term bound
    exceeds, so this is looser than ``logit_error_bound``)."""
    return MMA_REL + HEADSUM_REL * (1 + MMA_REL)


def logit_error_bound(term, relu_term, floor=0.0):
    """The kernel's error bound per logit (what the Hopper GPU tests assert).

    Args:
        term: ``sum_h |w_h| sum_d |q_hd k_d|`` per (row, key) (a tensor or a float).
        relu_term: ``sum_h |w_h| relu(s_h)`` per (row, key), same shape, ``s_h`` the exact head score.
        floor: ``logit_error_floor`` per (row, key) (same shape, or 0 where no group of the key is more than
            ``2**5`` below its largest and no score is near f16's subnormal range).

    Returns:
        ``E + HEADSUM_REL * (relu_term + E)`` with ``E = MMA_REL * term + floor``: each head score off by at
        most ``MMA_REL * sum_d |q k|`` (the FP8 MMA and its f16 accumulator) plus what the decode's rounding
        of low groups and the f16 subnormals add, then the head sum's relative ``HEADSUM_REL``.
    """
    e = MMA_REL * term + floor
    return e + HEADSUM_REL * (relu_term + e)


def logit_error_floor(q, weights, keys, scales):
    """What the kernel's roundings can add to a logit beyond ``MMA_REL`` of its term bound, per key of one row
    (fp64, from the inputs alone; the ``floor`` of ``logit_error_bound``). The sum of:

    * the decode of groups more than ``2**5`` below their key's largest (``A = s_g - s_max + 3 <=
      KEYFOLD_EXACT_LOW - 1``): each element rounded to the ``2**-9`` grid of the folded key, at most
      ``2**(s_max - 134)``, so ``2**(s_max - 134) sum_h |w_h| sum_(d in those groups) |q_hd|``;
    * the f16 accumulator below ``2**-14`` (subnormal: one unit ``2**-24``, four roundings) in the folded
      units ``2**(124 - s_max)``: ``2**(s_max - 146) sum_h |w_h|``;
    * the weights' lo part when it is an f16 subnormal (at most ``2**-25`` after the row's scale, which puts
      its largest ``|w|`` at ``2**14`` or more): ``2**-39 max(max_h |w_h|, 2**-115) sum_h sum_d |q_hd k_d|``.

    Args:
        q: ``[H, 128]`` index queries of the row (any float dtype; only magnitudes are used).
        weights: ``[H]``.
        keys: ``[N, 128]`` the dequantized keys (``format.dequantize_index_k``).
        scales: uint8 ``[N, 4]`` their UE8M0 group scales.

    Returns:
        fp64 ``[N]``.

    Raises:
        ValueError: shapes that do not match.
    """
    if q.dim() != 2 or q.shape[1] != 128 or weights.shape != (q.shape[0],):
        raise ValueError(f"q, weights: expected [H, 128] and [H], got {tuple(q.shape)} and {tuple(weights.shape)}")
    if keys.dim() != 2 or keys.shape[1] != 128 or scales.shape != (keys.shape[0], 4):
        raise ValueError(f"keys, scales: expected [N, 128] and [N, 4], got {tuple(keys.shape)} and {tuple(scales.shape)}")
    qa, wa = q.to(torch.float64).abs(), weights.to(torch.float64).abs()
    ka = keys.to(torch.float64).abs()
    s = scales.to(torch.int64)
    s_max = s.max(dim=1, keepdim=True).values
    low = (s - s_max + 3 < KEYFOLD_EXACT_LOW).to(torch.float64).repeat_interleave(32, dim=1)  # [N, 128]
    qw = wa @ qa  # [128]: sum_h |w_h| |q_hd|
    decode = torch.ldexp(low @ qw, (s_max[:, 0] - 134).to(torch.float64))
    subnormal = torch.ldexp(torch.full_like(decode, float(wa.sum())), (s_max[:, 0] - 146).to(torch.float64))
    w_floor = 2.0**-39 * max(float(wa.max()) if wa.numel() else 0.0, 2.0**-115) * (ka @ qa.sum(dim=0))
    return decode + subnormal + w_floor


#: The kernel's parameters in order, as ``struct`` codes (``nvrtc.ArgBlock``): seven pointers (q, weights, cache,
#: block table, lengths, schedule, logits), four ints (batch, cache pages, max pages, width), five strides in
#: elements (q rows, q heads, weights rows, block-table rows, logits rows), three ints (block_kv, schedule
#: entries, clean_logits).
ARG_FORMAT = "PPPPPPPiiiiqqqqqiii"


def _arg_values(q, weights, cache, block_table, context_lens, schedule, out, block_kv: int, clean: int) -> tuple:
    """The kernel's argument values in ``ARG_FORMAT`` order (the one place that order is written)."""
    q_strides = q.stride()
    return (q.data_ptr(), weights.data_ptr(), cache.data_ptr(), block_table.data_ptr(), context_lens.data_ptr(),
            schedule.data_ptr(), out.data_ptr(), block_table.shape[0], cache.shape[0], block_table.shape[1],
            out.shape[1], q_strides[0], q_strides[1], weights.stride(0), block_table.stride(0), out.stride(0),
            block_kv, schedule.shape[0] - 1, clean)


class Launcher:
    """The Hopper scorer of one ``Config`` built and loaded on one CUDA device: call it with tensors only.

    Made by ``ops.paged_logits.paged_scorer`` (which decides, once per configuration, that this kernel serves
    it); holds the loaded kernel, its grid rule, shared memory and a packed argument block (``nvrtc.ArgBlock``),
    so a call reads the tensors' pointers, sizes and strides, packs them and launches on torch's current
    stream: one launch, nothing else decided.

    Args:
        config: the build.
        index: the CUDA device ordinal it is loaded on.
        fn: the loaded kernel (``nvrtc.load``): anything with ``launch_packed(index, grid, block, smem,
            params)``.
        block_kv: keys per schedule tile (a multiple of ``PAGE_SIZE``).
        clean_logits: write ``-inf`` from each request's last page to the width (``paged_logits``).
        fallback: the Triton launcher of the same configuration (same schedule and ``block_kv``), which scores
            calls whose index queries or cache are not 16-byte aligned and, after a failed launch (warned
            once), every call; ``None``: those raise instead.

    Attributes:
        kernel: ``"wgmma"``.
        reason: ``None`` (it serves), or why it stopped (a failed launch).
        block_kv, clean_logits: as given.
    """

    kernel = "wgmma"

    def __init__(self, config: Config, index: int, fn, *, block_kv: int, clean_logits: bool, fallback=None):
        self.config, self.index, self.fn, self.fallback = config, index, fn, fallback
        self.block_kv, self.clean_logits, self.clean = block_kv, bool(clean_logits), int(bool(clean_logits))
        self.spec = _spec(config)
        self.smem = self.spec.smem
        self.args = nvrtc.ArgBlock(ARG_FORMAT)
        self.reason: str | None = None

    def __call__(self, q, weights, cache, block_table, context_lens, schedule, out):
        """Score into ``out`` and return it.

        Arguments as ``ops.paged_logits.paged_logits`` validates them, of this launcher's configuration
        (``q`` ``[B * next_n, heads, 128]`` e4m3, ``context_lens`` ``[B, next_n]`` or ``[B]`` as configured,
        ``out`` ``[rows, width]`` of its logits dtype, ``schedule`` planned with its ``block_kv``, at least
        one row); nothing is checked but the alignment the bulk copies need.

        Raises:
            RuntimeError: the launch failed and there is no fallback.
            ValueError: misaligned index queries or cache and no fallback.
        """
        if self.reason is not None:
            return self.fallback(q, weights, cache, block_table, context_lens, schedule, out)
        values = _arg_values(q, weights, cache, block_table, context_lens, schedule, out, self.block_kv, self.clean)
        if (values[0] | values[2] | values[11] | values[12]) & 15:  # q, cache, q's row and head strides
            if self.fallback is None:
                raise ValueError("q, cache: the Hopper kernel needs 16-byte aligned index query rows and cache")
            return self.fallback(q, weights, cache, block_table, context_lens, schedule, out)
        try:
            self.fn.launch_packed(self.index, -(-values[17] // WGS), THREADS, self.smem, self.args.pack(*values))
        except RuntimeError as e:
            self.reason = nvrtc.record_failure(self.index, self.spec, e)
            if self.fallback is None:
                raise RuntimeError(self.reason) from e
            return self.fallback(q, weights, cache, block_table, context_lens, schedule, out)
        return out


def launcher(device: torch.device | str, config: Config, *, block_kv: int, clean_logits: bool,
             fallback=None) -> Launcher | str:
    """The ``Launcher`` of ``config`` on ``device`` (built and loaded here, once per device and configuration,
    by ``serving_unavailable``), or why it cannot run (a string: the build or load failed, warned once).

    Args as ``Launcher``.
    """
    why = serving_unavailable(device, config)
    if why is not None:
        return why
    spec = _spec(config)
    fn = nvrtc.load(device, spec)
    if fn is None:
        return nvrtc.failure(device, spec)
    return Launcher(config, nvrtc._index(device), fn, block_kv=block_kv, clean_logits=clean_logits,
                    fallback=fallback)


def launch(config: Config, q, weights, cache, block_table, context_lens, schedule, out, *, block_kv: int,
           clean_logits: bool = True) -> None:
    """Launch the sm90 scorer for ``config`` once on torch's current stream (``launcher`` for one call).

    Shapes as ``ops.paged_logits.paged_logits`` (batch ``block_table.shape[0]``,
    width ``out.shape[1]``); ``config`` that of the call (``Config.of_call``);
    ``block_kv`` a multiple of the page size (the schedule's tile); one math
    warpgroup per schedule entry, ``WGS`` of them per CTA. ``clean_logits=False``
    skips writing ``-inf`` from each request's last page to the width (the
    serving path: SGLang's top-k masks by length).

    Raises:
        RuntimeError: the build, the load or the launch fails.
        ValueError: misaligned index queries or cache.
    """
    got = launcher(q.device, config, block_kv=block_kv, clean_logits=clean_logits)
    if isinstance(got, str):
        raise RuntimeError(got)
    got(q, weights, cache, block_table, context_lens, schedule, out)


def _kernel_args(q, weights, cache, block_table, context_lens, schedule, out, batch: int, width: int, block_kv: int,
                 clean_logits: bool) -> list:
    """The kernel's arguments as ctypes values, in its parameter order (pointers, sizes, strides in elements):
    the experiments' form of ``_arg_values``, with ``batch`` and ``width`` given."""
    values = list(_arg_values(q, weights, cache, block_table, context_lens, schedule, out, block_kv,
                              int(bool(clean_logits))))
    values[7], values[10] = batch, width
    return nvrtc.ArgBlock(ARG_FORMAT).as_ctypes(values)
