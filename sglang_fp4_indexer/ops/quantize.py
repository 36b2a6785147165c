"""Quantize index keys to MXFP4 and store them into a layer's paged FP4 cache.

``store_index_k`` runs a CUDA kernel on NVIDIA GPUs (``cuda/store_index_k.cu``,
built by NVRTC) and this Triton kernel elsewhere (the CPU interpreter, ROCm).
The Triton kernel: each program takes ``BLOCK_T`` tokens x 128 elements, computes the four UE8M0 group scales and the 128 E2M1 codes, and
writes the 64 payload bytes and 4 scale bytes of every token to its slot
(docs/design.md, The index-key format). Bit-exact with ``format.quantize_index_k`` on finite
input.

Method (exact integer arithmetic on the fp32 bit patterns; no ``log2``, no
float scaling, so neither rounding nor denormal flushing can change a code):

* ``a = bits(|x|)``. For non-negative floats the integer order of the bit
  patterns is the float order, subnormals included, so the group ``amax`` is an
  integer max.
* Scale: ``amax = 1.m * 2**E`` needs ``e = E - 2`` when ``1.m <= 1.5`` and
  ``e = E - 1`` otherwise (smallest ``e`` with ``amax <= 6 * 2**e``), i.e.
  UE8M0 code ``= biased_exp(amax) - 2 + (mantissa(amax) > mantissa(1.5))``,
  clamped to ``[1, 254]`` (zero and subnormal groups get code 1, ``e = -126``).
* Elements: rounding ``x / 2**e`` to the nearest E2M1 magnitude is comparing
  ``a`` with the seven midpoints times ``2**e``; those thresholds are built as
  fp32 bit patterns (subnormal ones included, all exact), and a value exactly on
  a midpoint goes to the even mantissa, as in ``format.py``.
"""

from __future__ import annotations

import functools
import struct
import types
from pathlib import Path

import torch
import triton
import triton.language as tl

from .. import format as fmt
from ..pool import PAGE_SIZE, check_cache, page_bytes, scale_row
from ._common import scale_row_is_identity

__all__ = ["StoreLauncher", "store_launcher", "store_index_k", "DEFAULT_BLOCK_T", "INF_SATURATES_TO"]

#: Tokens per program of the store kernel (x 128 elements).
DEFAULT_BLOCK_T = 32
#: What a +Inf element is stored as: ``1.5 * 2**127`` = E2M1 6 at scale
#: ``2**125``, the largest magnitude whose decode is finite in fp32 (-Inf likewise
#: with the sign).
INF_SATURATES_TO = 1.5 * 2.0**127

_K_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_SLOT_DTYPES = (torch.int32, torch.int64)

# Layout constants, from format.py (the kernel reads them as compile-time globals).
_HEAD_DIM = tl.constexpr(fmt.INDEX_HEAD_DIM)
_GROUP = tl.constexpr(fmt.GROUP_SIZE)
_NUM_GROUPS = tl.constexpr(fmt.NUM_GROUPS)
_PAYLOAD_BYTES = tl.constexpr(fmt.PAYLOAD_BYTES)
_SCALE_BYTES = tl.constexpr(fmt.SCALE_BYTES)
_TOKEN_BYTES = tl.constexpr(fmt.TOKEN_BYTES)
_MIN_CODE = tl.constexpr(fmt.UE8M0_MIN_CODE)
_MAX_CODE = tl.constexpr(fmt.UE8M0_MAX_CODE)
_INF_BITS = tl.constexpr(0x7F800000)
_INF_SAT_BITS = tl.constexpr(0x7F400000)  # bits of INF_SATURATES_TO

# The kernel compares against format's E2M1 midpoints written as
# (fp32 mantissa field, power of two, tie goes up): midpoint = 1.mantissa * 2**p.
# The seven _threshold_bits calls in the kernel are this table, row by row (a tie
# that goes up compares with >=). Checked against format._MIDPOINTS / _TIE_GOES_UP
# at import, and bit for bit against format.py by tests/test_quantize_op.py.
_MIDPOINT_FIELDS = (
    (0x000000, -2, False),  # 0.25: 0   | 0.5
    (0x400000, -1, True),  # 0.75: 0.5 | 1
    (0x200000, 0, False),  # 1.25: 1   | 1.5
    (0x600000, 0, True),  # 1.75: 1.5 | 2
    (0x200000, 1, False),  # 2.5:  2   | 3
    (0x600000, 1, True),  # 3.5:  3   | 4
    (0x200000, 2, False),  # 5:    4   | 6
)
assert tuple((1 + m / 2**23) * 2.0**p for m, p, _ in _MIDPOINT_FIELDS) == fmt._MIDPOINTS
assert tuple(up for _, _, up in _MIDPOINT_FIELDS) == fmt._TIE_GOES_UP
assert struct.unpack("<I", struct.pack("<f", INF_SATURATES_TO))[0] == _INF_SAT_BITS.value

# pool.scale_row is plain arithmetic; compiled as a Triton function it is the one
# row mapping used by the kernel's scale-plane store, so changing pool.scale_row
# changes the kernel too (docs/design.md, The index-key format). Triton's interpreter wants
# triton.language among a jit function's globals, hence the copy with our globals
# (pool itself imports no Triton).
_scale_row = triton.jit(
    types.FunctionType(scale_row.__code__, {**scale_row.__globals__, "tl": tl}, "scale_row", scale_row.__defaults__)
)


@triton.jit
def _threshold_bits(code, P: tl.constexpr, MANT: tl.constexpr):
    """fp32 bit pattern of ``1.MANT * 2**P * 2**(code - 127)``, normal or subnormal, exact."""
    biased = code + P
    normal = (tl.maximum(biased, 0) << 23) | MANT
    # Subnormal: value / 2**-149 = (1.MANT * 2**23) >> (1 - biased). Exact: code >= 1
    # and P >= -2 give a shift of at most 2, and every MANT used has 21 low zero bits.
    subnormal = (0x800000 | MANT) >> tl.maximum(1 - biased, 0)
    return tl.where(biased >= 1, normal, subnormal)


@triton.jit
def _store_index_k_kernel(
    k_ptr,
    cache_ptr,
    slots_ptr,
    n_tokens,
    stride_k,
    num_slots,
    PAGE_SIZE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    K_IS_BF16: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)  # [T]
    in_batch = t < n_tokens
    slot = tl.load(slots_ptr + t, mask=in_batch, other=-1).to(tl.int64)
    # Slots < 0 are skipped; so are slots past the cache (the host check is
    # optional), hence nothing is ever written out of bounds.
    valid = in_batch & (slot >= 0) & (slot < num_slots)

    cols = tl.arange(0, _HEAD_DIM)
    x = tl.load(k_ptr + t[:, None] * stride_k + cols[None, :], mask=valid[:, None], other=0.0)
    if K_IS_BF16:
        # bf16 -> fp32 bits by a shift: exact, immune to any denormal flushing.
        bits = (x.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF) << 16
    else:
        bits = x.to(tl.float32).to(tl.int32, bitcast=True)
    bits = tl.reshape(bits, [BLOCK_T, _NUM_GROUPS, _GROUP])

    a = bits & 0x7FFFFFFF  # |x| as ordered integers
    a = tl.where(a > _INF_BITS, 0, a)  # NaN -> +0
    a = tl.where(a == _INF_BITS, _INF_SAT_BITS, a)  # +-Inf -> +-1.5 * 2**127
    negative = bits < 0

    amax = tl.max(a, axis=2)  # [T, 4]
    code = (amax >> 23) - 2 + ((amax & 0x7FFFFF) > 0x400000).to(tl.int32)
    code = tl.minimum(tl.maximum(code, _MIN_CODE), _MAX_CODE)  # UE8M0 code = e + 127

    c = code[:, :, None]
    q = (a > _threshold_bits(c, -2, 0x000000)).to(tl.int32)
    q += (a >= _threshold_bits(c, -1, 0x400000)).to(tl.int32)
    q += (a > _threshold_bits(c, 0, 0x200000)).to(tl.int32)
    q += (a >= _threshold_bits(c, 0, 0x600000)).to(tl.int32)
    q += (a > _threshold_bits(c, 1, 0x200000)).to(tl.int32)
    q += (a >= _threshold_bits(c, 1, 0x600000)).to(tl.int32)
    q += (a > _threshold_bits(c, 2, 0x200000)).to(tl.int32)
    q = q | tl.where(negative & (q > 0), 8, 0)  # sign kept; -0 stored as +0

    lo, hi = tl.split(tl.reshape(q, [BLOCK_T, _PAYLOAD_BYTES, 2]))  # elements 2i, 2i+1
    payload = (lo | (hi << 4)).to(tl.uint8)  # [T, 64]

    s = tl.where(valid, slot, 0)
    page = s // PAGE_SIZE
    row = s % PAGE_SIZE
    page_base = page * (PAGE_SIZE * _TOKEN_BYTES)
    pay_off = page_base + row * _PAYLOAD_BYTES
    tl.store(
        cache_ptr + pay_off[:, None] + tl.arange(0, _PAYLOAD_BYTES)[None, :],
        payload,
        mask=valid[:, None],
    )
    # Scale plane: row mapped through pool.scale_row (compiled from the same source).
    sc_off = page_base + PAGE_SIZE * _PAYLOAD_BYTES + _scale_row(row, PAGE_SIZE) * _SCALE_BYTES
    tl.store(
        cache_ptr + sc_off[:, None] + tl.arange(0, _SCALE_BYTES)[None, :],
        code.to(tl.uint8),
        mask=valid[:, None],
    )


_CUDA_SOURCE = Path(__file__).with_name("cuda") / "store_index_k.cu"
_K_KINDS = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}


#: Tokens per 8-lane group of the CUDA store kernel, loaded together: two halve the latency of each
#: wave against one, four are slower again (docs/perf-notes.md, "The store op and the planner").
CUDA_STORE_TOKENS_PER_GROUP = 2


@functools.lru_cache(maxsize=None)
def _store_spec(k_dtype: torch.dtype, slot_dtype: torch.dtype, page_size: int,
                tokens_per_group: int):
    """The ``ops.nvrtc.KernelSpec`` of the CUDA store kernel for these inputs (one object per configuration)."""
    from . import nvrtc

    defines = (("K_KIND", _K_KINDS[k_dtype]), ("SLOT64", int(slot_dtype == torch.int64)), ("PAGE_SIZE", page_size),
               ("TOKENS_PER_GROUP", tokens_per_group))
    return nvrtc.KernelSpec(_CUDA_SOURCE.read_text(), "store_index_k.cu", "store_index_k", defines, 0,
                            "the CUDA store kernel", "storing with Triton")


def _cuda_store(k: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor, page_size: int = PAGE_SIZE,
                tokens_per_group: int | None = None):
    """The NVRTC-built store kernel for these inputs, or None where the Triton kernel must run.

    It needs an NVIDIA device, ``cuda-bindings``, the NVIDIA scale-plane layout
    (``pool.scale_row`` the identity), 16-byte aligned key rows, an 8-byte
    aligned cache and an even ``page_size`` (its payload stores are 8 bytes).
    Built once per configuration and device (``ops.nvrtc.load``); a failed
    build is warned about once and remembered (then the Triton kernel runs).
    """
    if (not k.is_cuda or torch.version.hip is not None or page_size % 2 or k.data_ptr() % 16
            or (k.stride(0) * k.element_size()) % 16 or cache.data_ptr() % 8):
        return None
    tokens_per_group = CUDA_STORE_TOKENS_PER_GROUP if tokens_per_group is None else tokens_per_group
    from . import nvrtc

    if nvrtc.bindings_missing() or not scale_row_is_identity(page_size):
        return None
    device = k.device  # a CUDA tensor's device always carries its index
    fn = nvrtc.load(device, _store_spec(k.dtype, slots.dtype, page_size, tokens_per_group))
    return None if fn is None else (device, fn)


class StoreLauncher:
    """The store op of one configuration (device, key dtype, slot dtype, page size), resolved once:
    ``store(k, cache, slots)`` quantizes and writes, as ``store_index_k`` with ``check_slots=False``.

    Decided here, not per call: the CUDA kernel (``cuda/store_index_k.cu``, built
    and loaded by NVRTC) where it runs, else the Triton kernel (``reason`` says
    why); the CUDA kernel's packed argument block. A call checks only the
    alignment the CUDA kernel's vector accesses need (16-byte key rows, an 8-byte
    aligned cache; the Triton kernel stores misaligned ones) and launches once.
    The serving path holds one per key and slot dtype (``ops.serving.ServingKernels``).

    Args:
        device: where it stores.
        k_dtype: the index keys' dtype (bf16, fp16 or fp32).
        slot_dtype: the slots' dtype (int32 or int64).
        page_size: tokens per page.
        use_cuda: False keeps the Triton kernel (as ``store_index_k``).
        block_t: tokens per program of the Triton kernel (a power of two).

    Attributes:
        kernel: ``"cuda"`` or ``"triton"``.
        reason: why the Triton kernel stores (``None`` with the CUDA kernel).

    Raises:
        ValueError: an unsupported dtype, ``page_size`` or ``block_t``, naming it.
    """

    def __init__(self, device: torch.device | str, k_dtype: torch.dtype, slot_dtype: torch.dtype,
                 page_size: int = PAGE_SIZE, *, use_cuda: bool = True, block_t: int = DEFAULT_BLOCK_T):
        from . import nvrtc

        if k_dtype not in _K_DTYPES:
            raise ValueError(f"k_dtype: expected bfloat16, float16 or float32, got {k_dtype}")
        if slot_dtype not in _SLOT_DTYPES:
            raise ValueError(f"slot_dtype: expected int32 or int64, got {slot_dtype}")
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size <= 0:
            raise ValueError(f"page_size: expected a positive int, got {page_size!r}")
        if isinstance(block_t, bool) or not isinstance(block_t, int) or block_t <= 0 or block_t & (block_t - 1):
            raise ValueError(f"block_t: expected a power of two, got {block_t!r}")
        device = torch.device(device)
        self.page_size, self.block_t, self._is_bf16 = page_size, block_t, k_dtype == torch.bfloat16
        self._fn = None
        if not use_cuda:
            self.reason = "use_cuda=False"
        elif device.type != "cuda" or torch.version.hip is not None:
            self.reason = "not an NVIDIA CUDA device"
        elif page_size % 2:
            self.reason = f"an odd page size ({page_size})"
        elif not scale_row_is_identity(page_size):
            self.reason = "pool.scale_row is not the identity"
        else:
            self.reason = nvrtc.bindings_missing()
            if self.reason is None:
                spec = _store_spec(k_dtype, slot_dtype, page_size, CUDA_STORE_TOKENS_PER_GROUP)
                self._fn = nvrtc.load(device, spec)
                self.reason = None if self._fn is not None else nvrtc.failure(device, spec)
        self.kernel = "triton" if self._fn is None else "cuda"
        if self._fn is not None:
            self._index = nvrtc._index(device)
            self._args = nvrtc.ArgBlock("PPPqqq")
            self._element = k_dtype.itemsize

    def kernel_for(self, k: torch.Tensor, cache: torch.Tensor) -> str:
        """The kernel a call with these keys and cache takes: ``"cuda"`` where this launcher has the CUDA kernel
        and the key rows are 16-byte and the cache 8-byte aligned, else ``"triton"``."""
        if self._fn is None or (k.data_ptr() | k.stride(0) * self._element) & 15 or cache.data_ptr() & 7:
            return "triton"
        return "cuda"

    def __call__(self, k: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor) -> None:
        """Store ``k`` ``[N, 128]`` at ``slots`` ``[N]`` in ``cache`` (arguments as ``store_index_k`` validates
        them, of this launcher's dtypes and page size); slots < 0 or past the cache are skipped."""
        n = k.shape[0]
        if n == 0 or cache.shape[0] == 0:
            return
        slots_total = cache.shape[0] * self.page_size
        if self.kernel_for(k, cache) == "cuda":
            params = self._args.pack(k.data_ptr(), cache.data_ptr(), slots.data_ptr(), n, k.stride(0) * self._element,
                                     slots_total)
            self._fn.launch_packed(self._index, triton.cdiv(n, 32 * CUDA_STORE_TOKENS_PER_GROUP), 256, 0, params)
            return
        _store_index_k_kernel[(triton.cdiv(n, self.block_t),)](
            k, cache, slots, n, k.stride(0), slots_total, PAGE_SIZE=self.page_size, BLOCK_T=self.block_t,
            K_IS_BF16=self._is_bf16, num_warps=4,
        )


@functools.lru_cache(maxsize=None)
def store_launcher(device: torch.device, k_dtype: torch.dtype, slot_dtype: torch.dtype, page_size: int = PAGE_SIZE,
                   use_cuda: bool = True, block_t: int = DEFAULT_BLOCK_T) -> StoreLauncher:
    """The ``StoreLauncher`` of this configuration, made once per process (``store_index_k`` and the benchmark
    use it; ``device`` with its index on CUDA). Raises as ``StoreLauncher``."""
    return StoreLauncher(device, k_dtype, slot_dtype, page_size, use_cuda=use_cuda, block_t=block_t)


def _interpreted() -> bool:
    return not isinstance(_store_index_k_kernel, triton.runtime.JITFunction)


def _validate(k, cache, slots, page_size: int, check_slots: bool) -> None:
    if not isinstance(k, torch.Tensor):
        raise TypeError(f"k: expected a torch.Tensor, got {type(k).__name__}")
    if not isinstance(cache, torch.Tensor):
        raise TypeError(f"cache: expected a torch.Tensor, got {type(cache).__name__}")
    if not isinstance(slots, torch.Tensor):
        raise TypeError(f"slots: expected a torch.Tensor, got {type(slots).__name__}")
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size <= 0:
        raise ValueError(f"page_size: expected a positive int, got {page_size!r}")
    if k.dtype not in _K_DTYPES:
        raise ValueError(f"k: expected bfloat16, float16 or float32, got {k.dtype}")
    if k.dim() != 2 or k.shape[1] != fmt.INDEX_HEAD_DIM:
        raise ValueError(f"k: expected shape [N, {fmt.INDEX_HEAD_DIM}], got {list(k.shape)}")
    if k.shape[0] > 0 and k.stride(1) != 1:
        raise ValueError(f"k: expected the last dimension contiguous (stride 1), got strides {k.stride()}")
    if cache.dim() == 2 and cache.dtype == torch.uint8 and cache.shape[1] != page_bytes(page_size):
        raise ValueError(
            f"page_size: {page_size} needs a cache of width {page_bytes(page_size)} bytes "
            f"(page_size x {fmt.TOKEN_BYTES}), but cache has width {cache.shape[1]}"
        )
    check_cache(cache, page_size, name="cache")
    if slots.dtype not in _SLOT_DTYPES:
        raise ValueError(f"slots: expected int32 or int64, got {slots.dtype}")
    if slots.dim() != 1 or slots.shape[0] != k.shape[0]:
        raise ValueError(f"slots: expected shape [{k.shape[0]}] (one slot per row of k), got {list(slots.shape)}")
    if not slots.is_contiguous():
        raise ValueError("slots: expected a contiguous tensor")
    if cache.device != k.device:
        raise ValueError(f"cache: expected the device of k ({k.device}), got {cache.device}")
    if slots.device != k.device:
        raise ValueError(f"slots: expected the device of k ({k.device}), got {slots.device}")
    if check_slots and slots.numel():
        num_slots = cache.shape[0] * page_size
        top = int(slots.max())  # host read: not allowed under CUDA-graph capture
        if top >= num_slots:
            raise ValueError(
                f"slots: slot {top} is out of range; the cache holds {num_slots} slots "
                f"({cache.shape[0]} pages x {page_size})"
            )
    if k.device.type == "cpu" and not _interpreted():
        raise ValueError(
            "k: CPU tensors need the Triton interpreter (TRITON_INTERPRET=1 set before "
            "importing sglang_fp4_indexer.ops.quantize); otherwise use a GPU device"
        )


def store_index_k(
    k: torch.Tensor,
    cache: torch.Tensor,
    slots: torch.Tensor,
    page_size: int = PAGE_SIZE,
    *,
    check_slots: bool = True,
    block_t: int = DEFAULT_BLOCK_T,
    use_cuda: bool = True,
) -> None:
    """Quantize index keys to MXFP4 and write them into one layer's paged FP4 cache.

    Token ``i`` goes to slot ``s = slots[i]``: page ``s // page_size``, row
    ``s % page_size``; its 64 payload bytes land in the page's payload plane at
    that row and its 4 UE8M0 codes in the scale plane at ``pool.scale_row(row)``
    (docs/design.md, The index-key format). Rows with ``s < 0`` are skipped; no other byte of the
    cache is touched. The codes equal ``format.quantize_index_k(k)`` bit for bit
    for finite ``k`` (OCP MX v1.0 E2M1 + UE8M0 with the scale rounded up; exact
    integer method in the module docstring).

    Non-finite input (not checked: the serving path cannot afford a host sync):
    a NaN element is stored as ``+0`` and does not count towards its group's
    scale; ``+-Inf`` is stored as ``+-INF_SATURATES_TO`` (``1.5 * 2**127``, E2M1
    6 at scale ``2**125``, the largest magnitude that decodes finite in fp32).
    No stored scale code is ever 0 or 255, so no code decodes to NaN.

    Args:
        k: ``[N, 128]`` bfloat16, float16 or float32 index keys; the last
            dimension must be contiguous (any row stride).
        cache: uint8 ``[num_pages, page_size * 68]``, contiguous, same device as ``k``.
        slots: int32 or int64 ``[N]``, contiguous, same device as ``k``.
        page_size: tokens per page (64 in SGLang's DSA index cache).
        check_slots: if True (default), read ``slots.max()`` on the host and raise
            on a slot past the cache. Pass False on the serving path (CUDA-graph
            capture forbids the host read): out-of-range slots are then skipped by
            the kernel's mask, so nothing is written out of bounds either way.
        block_t: tokens per program of the Triton kernel (a power of two).
        use_cuda: on NVIDIA GPUs run the CUDA kernel (``cuda/store_index_k.cu``,
            built by NVRTC at first use; the same bytes; speed in docs/perf-notes.md);
            False, or where it cannot run (ROCm, no ``cuda-bindings``, ``k`` rows not
            16-byte or ``cache`` not 8-byte aligned, an odd ``page_size``), the Triton kernel.

    Returns:
        None; ``cache`` is written in place.

    Raises:
        TypeError: ``k``, ``cache`` or ``slots`` is not a tensor.
        ValueError: wrong dtype, shape or layout of ``k``, ``cache`` or ``slots``;
            ``cache`` width not ``page_size * 68``; tensors on different devices;
            CPU tensors without ``TRITON_INTERPRET=1``; a bad ``page_size`` or
            ``block_t``; with ``check_slots``, a slot ``>= num_pages * page_size``.
    """
    _validate(k, cache, slots, page_size, check_slots)
    store_launcher(k.device, k.dtype, slots.dtype, page_size, use_cuda, block_t)(k, cache, slots)
