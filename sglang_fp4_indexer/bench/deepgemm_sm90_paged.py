"""DeepGEMM's newer SM90 FP8 paged MQA-logits kernel behind this project's own launcher (a benchmark peer only).

The kernel is ``deep_gemm/impls/sm90_fp8_paged_mqa_logits.cuh`` as the vLLM 0.34.0 wheel ships it: the form
that takes next_n 4 natively by splitting a request's 4 query rows over a cluster of 2 CTAs (its template
parameter ``kNumKVMulticast``; next_n 1 and 2 run on clusters of 1). Its host launcher in vLLM is compiled into
a torch extension for another torch, so ``cuda/deepgemm_sm90_paged.cu`` is this project's launcher, written
from the header's template parameters and kernel signature: it builds the four TMA descriptors (queries, keys,
key scales, weights), checks every assumption of the kernel (that file's header comment lists them) and
launches with ``cudaLaunchKernelEx`` and a cluster dimension. This module compiles it with nvcc, one shared
library per (next_n, heads), into a cache folder (``build``), calls it through ctypes (``Launcher``), and
plans the schedule the kernel reads (``plan_schedule``: the arithmetic of DeepGEMM's SM90 metadata kernel,
per cluster, in torch).

The header is not in this repository: ``scripts/pack_deepgemm_multicast.sh`` packs its include tree from the
wheel into ``.peers/deepgemm-multicast.tar.xz`` and ``scripts/gpu_run.sh`` unpacks it on the GPU machine and
names the folder in ``$SGLANG_FP4_INDEXER_DEEPGEMM_SM90_INCLUDE`` (``INCLUDE_ENV``). Nothing the plugin serves
with imports this module; only ``bench.scorers`` does. Nothing here imports SGLang.

Layout the kernel reads (all on one CUDA device):

* ``q``: float8_e4m3fn ``[B * next_n, H, 128]`` (or ``[B, next_n, H, 128]``), contiguous;
* ``kv_cache``: uint8 ``[num_pages, 64 * 132]`` (or ``[num_pages, 64, 1, 132]``), SGLang's FP8 index
  layout: per page 64 x 128 e4m3 bytes, then 64 fp32 scales;
* ``weights``: float32 ``[B * next_n, H]``, rows contiguous, a row stride of a multiple of 4 floats;
* ``context_lens``: int32 ``[B, next_n]`` contiguous, each row's visible keys (the kernel and the schedule
  read the last row's: every row is scored over the last row's pages, columns past a row's own length hold
  scores the caller's top-k masks, as SGLang's does);
* ``block_table``: int32 ``[B, max_pages]``, rows contiguous;
* ``schedule``: int32 ``[num_clusters + 1, 2]`` from ``plan_schedule``;
* ``logits``: float32 ``[B * next_n, stride]``, ``stride`` a multiple of ``SPLIT_KV`` (256) and at least the
  longest context rounded up to it (``padded_logits``): the kernel writes whole 64-key blocks of every
  256-key split it visits, and nothing past the last row's blocks.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import torch

from ..pool import PAGE_SIZE

__all__ = [
    "INCLUDE_ENV", "BUILD_DIR_ENV", "CCBIN_ENV", "ARCHIVE", "KERNEL_HEADER", "SOURCE", "NEXT_N", "HEADS",
    "HEAD_DIM", "SPLIT_KV", "THREADS", "PAGE_BYTES", "ARG_VERSION", "ARG_NAMES", "INFO_NAMES",
    "kv_multicast", "smem_bytes", "config_problem", "find_nvcc", "header_problem", "reason_for",
    "unavailable_reason", "plan_schedule", "schedule_problem", "table_problem", "CallShape", "validate_call",
    "padded_logits", "build", "build_all", "Launcher", "launcher", "main",
]

#: Environment variable: the include folder holding ``KERNEL_HEADER`` (and the cute / cutlass headers it needs).
INCLUDE_ENV = "SGLANG_FP4_INDEXER_DEEPGEMM_SM90_INCLUDE"
#: Environment variable: where built libraries are cached (default ``~/.cache/sglang_fp4_indexer/deepgemm_sm90``).
BUILD_DIR_ENV = "SGLANG_FP4_INDEXER_DEEPGEMM_SM90_BUILD"
#: Environment variable: nvcc's host compiler (``-ccbin``); default ``/usr/bin/g++`` where it exists (on the
#: device image the default g++ builds modules that crash at import: scripts/build_deepgemm.sh).
CCBIN_ENV = "SGLANG_FP4_INDEXER_NVCC_CCBIN"
#: Where scripts/pack_deepgemm_multicast.sh writes the packed headers (named in the messages).
ARCHIVE = ".peers/deepgemm-multicast.tar.xz"
#: The kernel's header, relative to the include folder.
KERNEL_HEADER = "deep_gemm/impls/sm90_fp8_paged_mqa_logits.cuh"
#: A word the header must contain: the template parameter of the 2-CTA form (older headers lack it).
KERNEL_MARKER = "kNumKVMulticast"
#: The launcher's CUDA C++ source.
SOURCE = Path(__file__).with_name("cuda") / "deepgemm_sm90_paged.cu"

#: Query rows per request the SM90 kernel takes (vLLM's ``native_next_n_supported``: SM90 implements 1, 2, 4).
NEXT_N = (1, 2, 4)
#: Index heads built (DeepSeek-V3.2: 64, GLM-5.x: 32).
HEADS = (32, 64)
#: Key and query dimension.
HEAD_DIM = 128
#: Math warpgroups per CTA, each scoring one 64-key compute block per step.
MATH_WARPGROUPS = 4
#: Keys of one compute block (the kernel's fixed WGMMA M).
COMPUTE_BLOCK_KV = 64
#: Keys per schedule unit: one compute block per math warpgroup.
SPLIT_KV = COMPUTE_BLOCK_KV * MATH_WARPGROUPS
#: Pipeline stages of queries and of keys.
Q_STAGES, KV_STAGES = 3, 3
#: Threads of one CTA: one TMA warpgroup and the math warpgroups.
THREADS = 128 + 128 * MATH_WARPGROUPS
#: Bytes of one cache page in SGLang's FP8 index layout (64 x 128 e4m3, then 64 fp32 scales).
PAGE_BYTES = PAGE_SIZE * (HEAD_DIM + 4)
#: The argument layout version shared with the launcher (``kArgVersionValue``).
ARG_VERSION = 1
#: The launcher's arguments, one uint64 each, in its ``enum Arg`` order.
ARG_NAMES = (
    "version", "next_n", "heads", "batch", "q", "kv_cache", "num_pages", "page_stride_bytes", "weights",
    "weights_row_stride", "context_lens", "block_table", "block_table_stride", "block_table_cols", "schedule",
    "num_clusters", "logits", "logits_stride", "max_context", "stream", "smem_bytes",
)
#: The launcher's ``dgmc_info`` fields, in its ``enum Info`` order.
INFO_NAMES = (
    "next_n", "heads", "kv_multicast", "smem_bytes", "threads", "split_kv", "num_regs", "static_smem",
    "local_bytes", "max_active_clusters",
)
#: nvcc options of every build (besides -I, -D, -ccbin, -o and the runtime library's rpath): DeepGEMM's own
#: JIT options for the language, Hopper's arch-specific target (wgmma, setmaxnreg), the shared CUDA runtime
#: (the one torch has loaded, so both use the same runtime state).
NVCC_FLAGS = (
    "-std=c++20", "-O3", "-shared", "-Xcompiler", "-fPIC", "--expt-relaxed-constexpr", "--expt-extended-lambda",
    "-gencode", "arch=compute_90a,code=sm_90a", "-cudart", "shared", "-lineinfo",
)
#: Where ``find_nvcc`` looks last.
DEFAULT_NVCC = "/usr/local/cuda/bin/nvcc"
#: Seconds one nvcc run may take.
BUILD_TIMEOUT_S = 600


def _align(x: int, a: int) -> int:
    return -(-x // a) * a


def _check_int(name: str, value, allowed: tuple[int, ...]) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if value not in allowed:
        raise ValueError(f"{name}: {value} not supported by the SM90 kernel (expected one of {allowed})")
    return value


def kv_multicast(next_n: int) -> int:
    """CTAs per cluster for ``next_n`` query rows (vLLM's rule on SM90): 2 at next_n 4, else 1.

    Each CTA of a cluster scores ``next_n / kv_multicast`` rows of the same request over the same pages.

    Raises:
        TypeError / ValueError: ``next_n`` not one of ``NEXT_N``.
    """
    return 2 if _check_int("next_n", next_n, NEXT_N) == 4 else 1


def smem_bytes(next_n: int, heads: int) -> int:
    """Dynamic shared memory of one CTA, in bytes, as the header lays it out (its "Shared memory configs").

    The query pipe (``Q_STAGES`` x (rows x heads x 128 e4m3 bytes + the weights, padded to 1024), then 48 bytes
    of barriers padded to 1024), then one KV pipe per math warpgroup (``KV_STAGES`` x (64 x 128 e4m3 bytes +
    256 bytes of scales padded to 1024), then barriers padded to 1024); rows = ``next_n / kv_multicast``.
    The launcher computes the same from the same formulas and refuses a call where the two differ.

    Raises:
        TypeError / ValueError: ``next_n`` or ``heads`` not supported (``NEXT_N``, ``HEADS``).
    """
    rows = next_n // kv_multicast(next_n)
    _check_int("heads", heads, HEADS)
    swizzle = HEAD_DIM * 8
    q_pipe = (Q_STAGES * (rows * heads * HEAD_DIM + _align(rows * heads * 4, swizzle))
              + _align(Q_STAGES * 16, swizzle))
    kv_pipe = (KV_STAGES * (COMPUTE_BLOCK_KV * HEAD_DIM + _align(COMPUTE_BLOCK_KV * 4, swizzle))
               + _align(KV_STAGES * 16, swizzle))
    return q_pipe + MATH_WARPGROUPS * kv_pipe


def config_problem(next_n: int, heads: int, head_dim: int = HEAD_DIM) -> str | None:
    """Why the kernel cannot score a shape of ``next_n`` rows per request and ``heads`` index heads (``None``: it can).

    Never raises.
    """
    if next_n not in NEXT_N:
        return f"next_n {next_n}: the SM90 kernel takes next_n {', '.join(map(str, NEXT_N))}"
    if heads not in HEADS:
        return f"{heads} index heads: built for {' and '.join(map(str, HEADS))}"
    if head_dim != HEAD_DIM:
        return f"head dim {head_dim}: the kernel is built for {HEAD_DIM}"
    return None


def find_nvcc() -> str | None:
    """The nvcc to build with: ``$CUDA_HOME/bin/nvcc`` (or ``$CUDA_PATH``), else the one on ``PATH``, else
    ``/usr/local/cuda/bin/nvcc``; ``None`` when there is none. Never raises."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(var)
        if home and os.access(os.path.join(home, "bin", "nvcc"), os.X_OK):
            return os.path.join(home, "bin", "nvcc")
    found = shutil.which("nvcc")
    if found:
        return found
    return DEFAULT_NVCC if os.access(DEFAULT_NVCC, os.X_OK) else None


def header_problem(include_dir: str | os.PathLike | None) -> str | None:
    """Why ``include_dir`` does not hold the kernel's header (``None``: it does). Never raises."""
    if not include_dir:
        return (f"no DeepGEMM SM90 headers: ${INCLUDE_ENV} is not set (scripts/pack_deepgemm_multicast.sh packs "
                f"{ARCHIVE}; scripts/gpu_run.sh unpacks it and sets the variable)")
    header = Path(include_dir) / KERNEL_HEADER
    try:
        text = header.read_text(errors="replace")
    except OSError:
        return f"no {KERNEL_HEADER} under ${INCLUDE_ENV} = {include_dir}"
    if KERNEL_MARKER not in text:
        return f"{header} has no {KERNEL_MARKER}: an older DeepGEMM, not the 2-CTA next_n 4 form (vLLM 0.34.0's)"
    return None


def reason_for(device_type: str, capability: tuple[int, int] | None, include_dir: str | None,
               nvcc: str | None, gpu_name: str = "this GPU") -> str | None:
    """The one-line reason the peer cannot run, from the facts ``unavailable_reason`` gathers (``None``: it can).

    Args:
        device_type: ``torch.device.type`` of the benchmark's device.
        capability: its compute capability (CUDA only).
        include_dir: the value of ``$SGLANG_FP4_INDEXER_DEEPGEMM_SM90_INCLUDE`` (``None`` when unset).
        nvcc: ``find_nvcc()``.
        gpu_name: the GPU's name, for the message.

    Never raises. Checked in this order: a CUDA device, compute capability 9.0, the headers, nvcc.
    """
    if device_type != "cuda":
        return "needs a CUDA device (an SM90 GPU, nvcc and DeepGEMM's packed SM90 headers)"
    if tuple(capability or ()) != (9, 0):
        cc = f"sm_{capability[0]}{capability[1]}" if capability else "of unknown compute capability"
        return f"needs an SM90 (Hopper) GPU; {gpu_name} is {cc}"
    why = header_problem(include_dir)
    if why:
        return why
    if nvcc is None:
        return "nvcc not found (CUDA_HOME, PATH, /usr/local/cuda/bin): the launcher is compiled at first use"
    return None


def unavailable_reason(device: torch.device) -> str | None:
    """Why the peer cannot run on ``device`` (``reason_for`` of this process's facts), or ``None``.

    Reads the device's compute capability and name, ``$SGLANG_FP4_INDEXER_DEEPGEMM_SM90_INCLUDE`` and
    ``find_nvcc()``; builds nothing. Never raises.
    """
    device = torch.device(device)
    capability, name = None, "this GPU"
    if device.type == "cuda":
        try:
            capability = tuple(torch.cuda.get_device_capability(device))
            name = torch.cuda.get_device_name(device)
        except Exception as exc:  # no driver, a bad index: still one line
            return f"cannot read the CUDA device ({type(exc).__name__}: {exc})"
    return reason_for(device.type, capability, os.environ.get(INCLUDE_ENV) or None, find_nvcc(), name)


def _last_lens(context_lens: torch.Tensor) -> torch.Tensor:
    if context_lens.dtype.is_floating_point or context_lens.dtype == torch.bool:
        raise TypeError(f"context_lens: expected an integer tensor, got {context_lens.dtype}")
    if context_lens.dim() == 2:
        return context_lens[:, -1].to(torch.int64)
    if context_lens.dim() == 1:
        return context_lens.to(torch.int64)
    raise ValueError(f"context_lens: expected [B] or [B, next_n], got {list(context_lens.shape)}")


def plan_schedule(context_lens: torch.Tensor, num_clusters: int, split_kv: int = SPLIT_KV) -> torch.Tensor:
    """The schedule the kernel reads: each cluster's first (request, split), as DeepGEMM's SM90 metadata kernel.

    Request ``b`` has ``ceil(len_b / split_kv)`` splits (``len_b`` its last row's length); the ``total`` splits
    are dealt out in order, ``total // num_clusters`` per cluster and one more to each of the last
    ``total % num_clusters``. Row ``c`` is where cluster ``c`` starts, ``(b, split)``; row ``num_clusters`` is
    ``(B, 0)``; with no splits at all every row is ``(B, 0)``. The kernel runs cluster ``c`` from row ``c`` to row
    ``c + 1`` (``sched::SM90PagedMQALogitsScheduler``), so this must match it exactly (``schedule_problem``).

    Args:
        context_lens: int ``[B]`` or ``[B, next_n]`` (the last row's lengths count), on any device.
        num_clusters: clusters of the launch (``SM count // kv_multicast(next_n)``).
        split_kv: keys per split (``SPLIT_KV``).

    Returns:
        int32 ``[num_clusters + 1, 2]`` on ``context_lens``' device (no host synchronisation).

    Raises:
        TypeError: ``context_lens`` not an integer tensor, or a non-int argument.
        ValueError: ``context_lens`` not 1-D or 2-D or empty, ``num_clusters`` or ``split_kv`` below 1.
    """
    for name, value in (("num_clusters", num_clusters), ("split_kv", split_kv)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
        if value < 1:
            raise ValueError(f"{name}: expected >= 1, got {value}")
    lens = _last_lens(context_lens).clamp_min(0)
    batch = lens.shape[0]
    if batch == 0:
        raise ValueError("context_lens: no requests")
    dev = lens.device
    segs = (lens + split_kv - 1) // split_kv
    prefix = torch.cumsum(segs, 0)
    total = prefix[-1]
    c = torch.arange(num_clusters, device=dev, dtype=torch.int64)
    q, r = total // num_clusters, total % num_clusters
    pivot = num_clusters - r
    starts = c * q + (c - pivot).clamp_min(0)
    idx = torch.searchsorted(prefix, starts, right=True).clamp_max(batch - 1)  # first request whose prefix > start
    before = torch.where(idx > 0, prefix[(idx - 1).clamp_min(0)], torch.zeros_like(idx))
    offset = starts - before
    n = segs[idx]
    atom = torch.where(n > 0, offset // n.clamp_min(1), torch.zeros_like(n))
    split = torch.where(n > 0, offset % n.clamp_min(1), torch.zeros_like(n))
    out = torch.empty((num_clusters + 1, 2), dtype=torch.int64, device=dev)
    out[:num_clusters, 0] = idx + atom
    out[:num_clusters, 1] = split
    out[num_clusters, 0] = batch
    out[num_clusters, 1] = 0
    empty = torch.stack((torch.full_like(c, batch), torch.zeros_like(c)), 1)
    out[:num_clusters] = torch.where(total == 0, empty, out[:num_clusters])
    return out.to(torch.int32).contiguous()


def schedule_problem(schedule: torch.Tensor, context_lens: torch.Tensor, split_kv: int = SPLIT_KV,
                     max_keys: int | None = None) -> str | None:
    """Why ``schedule`` would not run every cluster of the kernel to its end over ``context_lens`` (``None``: it does).

    The kernel's scheduler steps a cluster from its row to the next row's ``(request, split)`` and stops only
    there, so a row past its request's splits, rows out of order or a wrong last row would run past the batch
    (a hang or stray reads) instead of failing. Checked on the host (one copy of each tensor): int32
    ``[C + 1, 2]``; the last row ``(B, 0)``; rows in nondecreasing (request, split) order; every other row
    either ``(B, 0)`` or a request below ``B`` and a split below its ``ceil(len / split_kv)``; no negative length
    (the kernel reads lengths as unsigned) and, where ``max_keys`` is given (the block table's
    ``max_pages * 64``), none above it (the kernel would read page numbers past the request's row).

    Never raises for a tensor argument (returns the reason).
    """
    if not isinstance(schedule, torch.Tensor) or schedule.dtype != torch.int32 or schedule.dim() != 2 \
            or schedule.shape[1] != 2 or schedule.shape[0] < 2:
        return "schedule: expected an int32 [num_clusters + 1, 2] tensor"
    try:
        all_lens = context_lens.to(torch.int64).cpu()
        lens = _last_lens(context_lens).cpu()
    except (TypeError, ValueError) as exc:
        return str(exc)
    if all_lens.numel() and int(all_lens.min()) < 0:
        return f"context_lens: a negative length ({int(all_lens.min())})"
    if max_keys is not None and all_lens.numel() and int(all_lens.max()) > max_keys:
        return f"context_lens: {int(all_lens.max())} keys, above the block table's {max_keys}"
    batch = lens.shape[0]
    segs = ((lens + split_kv - 1) // split_kv).tolist()
    rows = [tuple(r) for r in schedule.cpu().tolist()]
    if rows[-1] != (batch, 0):
        return f"schedule: last row {rows[-1]}, expected ({batch}, 0)"
    for c, (b, s) in enumerate(rows[:-1]):
        if (b, s) == (batch, 0):
            continue
        if not 0 <= b < batch or not 0 <= s < segs[b]:
            return f"schedule: row {c} is ({b}, {s}); request {b} has {segs[b] if 0 <= b < batch else 0} splits"
    for c in range(len(rows) - 1):
        if rows[c] > rows[c + 1]:
            return f"schedule: rows {c} and {c + 1} out of order ({rows[c]} > {rows[c + 1]})"
    return None


def table_problem(block_table: torch.Tensor, context_lens: torch.Tensor, num_pages: int) -> str | None:
    """Why the pages a call reads are not all in the cache (``None``: they are); one host copy of each tensor.

    The kernel reads row ``b``'s first ``ceil(len_b / 64)`` block-table entries (``len_b`` its last row's
    length) as page numbers; a page outside ``[0, num_pages)`` is read as zeros by TMA (no hang, wrong logits),
    so it is refused before the first launch instead.

    Never raises for tensor arguments (returns the reason).
    """
    try:
        lens = _last_lens(context_lens).cpu()
    except (TypeError, ValueError) as exc:
        return str(exc)
    table = block_table.to(torch.int64).cpu()
    if table.dim() != 2 or table.shape[0] != lens.shape[0]:
        return f"block_table: {list(block_table.shape)} for {lens.shape[0]} requests"
    pages = (lens.clamp_min(0) + PAGE_SIZE - 1) // PAGE_SIZE
    if table.shape[1] and int(pages.max()) > table.shape[1]:
        return f"context_lens: {int(pages.max())} pages, the block table has {table.shape[1]} per request"
    used = torch.arange(table.shape[1])[None, :] < pages[:, None]
    bad = used & ((table < 0) | (table >= num_pages))
    if bool(bad.any()):
        b, j = (int(v) for v in bad.nonzero()[0])
        return f"block_table[{b}, {j}] = {int(table[b, j])}, outside the cache's {num_pages} pages"
    return None


class CallShape(NamedTuple):
    """What ``validate_call`` read off a call's tensors.

    Attributes:
        batch: requests. next_n: query rows per request. heads: index heads. num_pages: cache pages.
        num_clusters: the schedule's clusters. logits_stride: the logits' row stride, in floats.
    """

    batch: int
    next_n: int
    heads: int
    num_pages: int
    num_clusters: int
    logits_stride: int


def _need(cond: bool, exc: type, message: str) -> None:
    if not cond:
        raise exc(message)


def validate_call(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
                  block_table: torch.Tensor, schedule: torch.Tensor, logits: torch.Tensor,
                  max_context: int) -> CallShape:
    """Check one call's tensors against the layout the kernel reads (module docstring); device-agnostic.

    Args:
        q: float8_e4m3fn ``[B * next_n, H, 128]`` or ``[B, next_n, H, 128]``, contiguous.
        kv_cache: uint8 ``[num_pages, 64 * 132]`` or ``[num_pages, 64, 1, 132]``, contiguous.
        weights: float32 ``[B * next_n, H]``, unit column stride, row stride a multiple of 4 floats.
        context_lens: int32 ``[B, next_n]``, contiguous.
        block_table: int32 ``[B, max_pages]``, unit column stride.
        schedule: int32 ``[num_clusters + 1, 2]``, contiguous (``plan_schedule``).
        logits: float32 ``[B * next_n, S]``, unit column stride, row stride a multiple of 256 and at least
            ``max_context`` rounded up to 256 (``padded_logits``).
        max_context: the longest row length, in keys (``int(context_lens.max())``), at most the block table's
            ``max_pages * 64``.

    Returns:
        ``CallShape``.

    Raises:
        TypeError: a wrong dtype, or a non-tensor / non-int argument.
        ValueError: a wrong shape, stride or size, an unsupported (next_n, heads) (``config_problem``), or
            tensors on different devices.
    """
    tensors = {"q": q, "kv_cache": kv_cache, "weights": weights, "context_lens": context_lens,
               "block_table": block_table, "schedule": schedule, "logits": logits}
    for name, t in tensors.items():
        _need(isinstance(t, torch.Tensor), TypeError, f"{name}: expected a tensor, got {type(t).__name__}")
    devices = {t.device for t in tensors.values()}
    _need(len(devices) == 1, ValueError, f"tensors on different devices: {sorted(map(str, devices))}")
    for name, t, dtype in (("q", q, torch.float8_e4m3fn), ("kv_cache", kv_cache, torch.uint8),
                           ("weights", weights, torch.float32), ("context_lens", context_lens, torch.int32),
                           ("block_table", block_table, torch.int32), ("schedule", schedule, torch.int32),
                           ("logits", logits, torch.float32)):
        _need(t.dtype == dtype, TypeError, f"{name}: expected {dtype}, got {t.dtype}")
    _need(not isinstance(max_context, bool) and isinstance(max_context, int), TypeError,
          f"max_context: expected an int, got {type(max_context).__name__}")

    _need(context_lens.dim() == 2 and context_lens.is_contiguous() and context_lens.numel() > 0, ValueError,
          f"context_lens: expected a contiguous int32 [B, next_n], got {list(context_lens.shape)}")
    batch, next_n = context_lens.shape
    if q.dim() == 4:
        _need(tuple(q.shape[:2]) == (batch, next_n), ValueError,
              f"q: [B, next_n, H, 128] of {list(q.shape)} does not match context_lens {list(context_lens.shape)}")
        heads, dim = q.shape[2], q.shape[3]
    else:
        _need(q.dim() == 3, ValueError, f"q: expected [B * next_n, H, 128] or [B, next_n, H, 128], got {list(q.shape)}")
        _need(q.shape[0] == batch * next_n, ValueError,
              f"q: {q.shape[0]} rows, expected batch {batch} x next_n {next_n} = {batch * next_n}")
        heads, dim = q.shape[1], q.shape[2]
    why = config_problem(next_n, heads, dim)
    _need(why is None, ValueError, f"q: {why}")
    _need(q.is_contiguous(), ValueError, "q: expected a contiguous tensor")
    rows = batch * next_n

    if kv_cache.dim() == 4:
        _need(tuple(kv_cache.shape[1:]) == (PAGE_SIZE, 1, HEAD_DIM + 4), ValueError,
              f"kv_cache: expected [num_pages, {PAGE_SIZE}, 1, {HEAD_DIM + 4}], got {list(kv_cache.shape)}")
    else:
        _need(kv_cache.dim() == 2 and kv_cache.shape[1] == PAGE_BYTES, ValueError,
              f"kv_cache: expected [num_pages, {PAGE_BYTES}] (SGLang's FP8 index pages), got {list(kv_cache.shape)}")
    _need(kv_cache.is_contiguous() and kv_cache.shape[0] >= 1, ValueError,
          "kv_cache: expected a contiguous tensor of at least one page")
    num_pages = kv_cache.shape[0]

    _need(tuple(weights.shape) == (rows, heads) and weights.stride(1) == 1 and weights.stride(0) % 4 == 0
          and weights.stride(0) >= heads, ValueError,
          f"weights: expected float32 [{rows}, {heads}] with unit column stride and a row stride of a multiple "
          f"of 4 floats, got {list(weights.shape)} strides {list(weights.stride())}")
    _need(block_table.dim() == 2 and block_table.shape[0] == batch and block_table.shape[1] >= 1
          and block_table.stride(1) == 1, ValueError,
          f"block_table: expected int32 [{batch}, max_pages] with unit column stride, got {list(block_table.shape)}")
    _need(schedule.dim() == 2 and schedule.shape[1] == 2 and schedule.shape[0] >= 2 and schedule.is_contiguous(),
          ValueError, f"schedule: expected a contiguous int32 [num_clusters + 1, 2], got {list(schedule.shape)}")
    capacity = block_table.shape[1] * PAGE_SIZE
    _need(1 <= max_context <= capacity, ValueError,
          f"max_context: {max_context} keys, expected 1 .. the block table's {capacity}")
    stride = logits.stride(0) if logits.dim() == 2 else 0
    _need(logits.dim() == 2 and logits.shape[0] == rows and logits.stride(1) == 1, ValueError,
          f"logits: expected float32 [{rows}, width] with unit column stride, got {list(logits.shape)}")
    _need(stride % SPLIT_KV == 0 and stride >= _align(max_context, SPLIT_KV), ValueError,
          f"logits: row stride {stride}, expected a multiple of {SPLIT_KV} of at least "
          f"{_align(max_context, SPLIT_KV)} (padded_logits)")
    return CallShape(batch, next_n, heads, num_pages, schedule.shape[0] - 1, stride)


def padded_logits(rows: int, width: int, device: torch.device | str, fill: float | None = None) -> torch.Tensor:
    """A logits buffer the kernel can write: float32 ``[rows, width]``, a view of rows padded to a multiple of 256.

    Args:
        rows: query rows (``B * next_n``). width: columns the caller reads (at least the longest context).
        device: where. fill: a value to fill the whole buffer with (``None``: uninitialised).

    Raises:
        ValueError: ``rows`` or ``width`` below 1.
    """
    if rows < 1 or width < 1:
        raise ValueError(f"rows, width: expected >= 1, got {rows}, {width}")
    buf = torch.empty((rows, _align(width, SPLIT_KV)), dtype=torch.float32, device=device)
    if fill is not None:
        buf.fill_(fill)
    return buf[:, :width]


# ---------------------------------------------------------------- build


def _build_dir() -> Path:
    return Path(os.environ.get(BUILD_DIR_ENV) or Path.home() / ".cache" / "sglang_fp4_indexer" / "deepgemm_sm90")


def _ccbin() -> str | None:
    env = os.environ.get(CCBIN_ENV)
    if env:
        return env
    return "/usr/bin/g++" if os.access("/usr/bin/g++", os.X_OK) else None


@functools.lru_cache(maxsize=None)
def _nvcc_version(nvcc: str) -> str:
    try:
        return subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unknown ({exc})"


def _tree_digest(include_dir: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in include_dir.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(include_dir)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _command(nvcc: str, include_dir: Path, next_n: int, heads: int, out: Path) -> list[str]:
    cmd = [nvcc, *NVCC_FLAGS, f"-I{include_dir}", f"-DDGMC_NEXT_N={next_n}", f"-DDGMC_HEADS={heads}"]
    ccbin = _ccbin()
    if ccbin:
        cmd += ["-ccbin", ccbin]
    # Where the toolkit's libcudart.so is, should torch not have loaded one already (it has: the library then
    # binds to torch's, same soname). nvcc may be a wrapper script, so CUDA_HOME and /usr/local/cuda count too.
    roots = [Path(nvcc).resolve().parent.parent] + [Path(v) for v in (os.environ.get("CUDA_HOME"),
                                                                      os.environ.get("CUDA_PATH")) if v]
    seen = set()
    for root in roots + [Path("/usr/local/cuda")]:
        for lib in (root / "lib64", root / "lib"):
            if lib not in seen and any(lib.glob("libcudart.so*")):
                seen.add(lib)
                cmd += ["-Xlinker", f"-rpath={lib}"]
    return cmd + ["-o", str(out), str(SOURCE)]


_build_lock = threading.Lock()


def build(next_n: int, heads: int, include_dir: str | os.PathLike | None = None, nvcc: str | None = None) -> Path:
    """Compile the launcher for (``next_n``, ``heads``) with nvcc, once; return the shared library's path.

    The library is cached under ``$SGLANG_FP4_INDEXER_DEEPGEMM_SM90_BUILD`` in a folder named by a hash of the
    source, the include tree, nvcc's version and the options, so a changed header or source builds anew; a
    build writes its log beside it and moves the library into place only when it succeeded.

    Args:
        next_n: query rows per request (``NEXT_N``). heads: index heads (``HEADS``).
        include_dir: the headers (default ``$SGLANG_FP4_INDEXER_DEEPGEMM_SM90_INCLUDE``).
        nvcc: the compiler (default ``find_nvcc()``).

    Raises:
        TypeError / ValueError: an unsupported ``next_n`` or ``heads``.
        FileNotFoundError: no headers or no nvcc (the message is ``header_problem`` / ``reason_for``'s).
        RuntimeError: nvcc failed or timed out (the message has its first error line and the log's path).
    """
    kv_multicast(next_n)
    _check_int("heads", heads, HEADS)
    include_dir = include_dir or os.environ.get(INCLUDE_ENV)
    why = header_problem(include_dir)
    if why:
        raise FileNotFoundError(why)
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise FileNotFoundError(reason_for("cuda", (9, 0), str(include_dir), None))
    include_dir = Path(include_dir).resolve()
    key = hashlib.sha256("\0".join([
        SOURCE.read_text(), _tree_digest(include_dir), _nvcc_version(nvcc), " ".join(NVCC_FLAGS), str(_ccbin()),
        str(ARG_VERSION),
    ]).encode()).hexdigest()[:16]
    folder = _build_dir() / key
    lib = folder / f"dgmc_n{next_n}_h{heads}.so"
    if lib.is_file():
        return lib
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{lib.name}.{os.getpid()}.{threading.get_ident()}"
    log = folder / f"build_n{next_n}_h{heads}.log"
    cmd = _command(nvcc, include_dir, next_n, heads, tmp)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"nvcc took over {BUILD_TIMEOUT_S} s building the next_n {next_n}, H {heads} launcher")
    log.write_text(" ".join(cmd) + "\n\n" + proc.stdout + proc.stderr)
    if proc.returncode != 0 or not tmp.is_file():
        lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if "error" in ln.lower()]
        first = lines[0].strip() if lines else f"exit status {proc.returncode}"
        raise RuntimeError(f"nvcc could not build the next_n {next_n}, H {heads} launcher: {first} (log: {log})")
    os.replace(tmp, lib)
    return lib


def build_all(configs=None, include_dir: str | None = None, nvcc: str | None = None,
              jobs: int | None = None) -> dict[tuple[int, int], Path | Exception]:
    """Build the launcher for every (next_n, heads) of ``configs`` (default: all of ``NEXT_N`` x ``HEADS``) in parallel.

    Returns:
        (next_n, heads) -> the library's path, or the exception its ``build`` raised (nothing is raised here).
    """
    configs = list(configs or [(n, h) for n in NEXT_N for h in HEADS])

    def one(cfg):
        try:
            return build(cfg[0], cfg[1], include_dir, nvcc)
        except Exception as exc:
            return exc

    with ThreadPoolExecutor(max_workers=jobs or min(len(configs), os.cpu_count() or 1)) as pool:
        return dict(zip(configs, pool.map(one, configs)))


# ---------------------------------------------------------------- launch


class Launcher:
    """One built launcher library (one (next_n, heads)), called through ctypes.

    Args:
        path: the library ``build`` returned.
        next_n, heads: what it was built for (checked against its ``dgmc_info`` at ``info``).

    Raises:
        OSError: the library does not load.
    """

    ERR_BYTES = 1024

    def __init__(self, path: str | os.PathLike, next_n: int, heads: int):
        self.path = Path(path)
        self.next_n, self.heads = next_n, heads
        self.kv_multicast = kv_multicast(next_n)
        self.smem_bytes = smem_bytes(next_n, heads)
        self._lib = ctypes.CDLL(str(self.path))
        for fn in (self._lib.dgmc_launch, self._lib.dgmc_info):
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        self._err = ctypes.create_string_buffer(self.ERR_BYTES)
        self._args = (ctypes.c_uint64 * len(ARG_NAMES))()

    def info(self) -> dict[str, int]:
        """The kernel's facts on the current CUDA device (``INFO_NAMES``: registers, shared memory, clusters that
        fit at once, ...), after the library's one-time set-up there (which loads the kernel: call it before a
        CUDA graph capture).

        Raises:
            RuntimeError: the set-up failed (not sm_90, the shared memory or a cluster does not fit, no driver),
                or the library was built for another (next_n, heads) or shared-memory layout.
        """
        out = (ctypes.c_uint64 * len(INFO_NAMES))()
        if self._lib.dgmc_info(out, len(INFO_NAMES), self._err, self.ERR_BYTES) != 0:
            raise RuntimeError(f"deepgemm-sm90 launcher: {self._err.value.decode(errors='replace')}")
        info = dict(zip(INFO_NAMES, (int(v) for v in out)))
        want = {"next_n": self.next_n, "heads": self.heads, "kv_multicast": self.kv_multicast,
                "smem_bytes": self.smem_bytes, "threads": THREADS, "split_kv": SPLIT_KV}
        bad = {k: (info[k], v) for k, v in want.items() if info[k] != v}
        if bad:
            raise RuntimeError(f"deepgemm-sm90 launcher {self.path.name}: (library, expected) differ: {bad}")
        return info

    def args(self, q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
             block_table: torch.Tensor, schedule: torch.Tensor, logits: torch.Tensor, max_context: int,
             stream: int) -> list[int]:
        """The launcher's argument values, in ``ARG_NAMES`` order, for tensors ``validate_call`` accepted.

        Pointers are the tensors' ``data_ptr()``; strides in elements (the page stride in bytes);
        ``max_context`` in keys; ``stream`` a ``cudaStream_t`` as an int. Never raises for such tensors.
        """
        batch = context_lens.shape[0]
        return [ARG_VERSION, self.next_n, self.heads, batch, q.data_ptr(), kv_cache.data_ptr(), kv_cache.shape[0],
                kv_cache.stride(0) * kv_cache.element_size(), weights.data_ptr(), weights.stride(0),
                context_lens.data_ptr(), block_table.data_ptr(), block_table.stride(0), block_table.shape[1],
                schedule.data_ptr(), schedule.shape[0] - 1, logits.data_ptr(), logits.stride(0), max_context,
                stream, self.smem_bytes]

    def __call__(self, q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
                 block_table: torch.Tensor, schedule: torch.Tensor, logits: torch.Tensor, max_context: int,
                 validate: bool = True) -> torch.Tensor:
        """Score on torch's current stream of the tensors' device (capturable: no host synchronisation).

        Args:
            q, kv_cache, weights, context_lens, block_table, schedule, logits, max_context: as ``validate_call``
                (all on one CUDA device; ``schedule`` from ``plan_schedule`` for ``kv_multicast(next_n)``).
            validate: run ``validate_call`` first (the library checks sizes and alignment again either way;
                ``False`` where the caller validated the same tensors once).

        Returns:
            ``logits``, written at each row's columns below the last row of its request's length rounded up to 64.

        Raises:
            TypeError / ValueError: as ``validate_call``, or tensors not on a CUDA device, or built for another
                (next_n, heads).
            RuntimeError: the launcher refused the call or the launch failed (its message).
        """
        if validate:
            shape = validate_call(q, kv_cache, weights, context_lens, block_table, schedule, logits, max_context)
            _need(q.device.type == "cuda", ValueError, f"tensors on {q.device}: expected a CUDA device")
            _need((shape.next_n, shape.heads) == (self.next_n, self.heads), ValueError,
                  f"a next_n {shape.next_n}, H {shape.heads} call for the next_n {self.next_n}, H {self.heads} "
                  "launcher")
        stream = torch.cuda.current_stream(q.device).cuda_stream
        self._args[:] = self.args(q, kv_cache, weights, context_lens, block_table, schedule, logits, max_context,
                                  stream)
        with torch.cuda.device(q.device):
            rc = self._lib.dgmc_launch(self._args, len(ARG_NAMES), self._err, self.ERR_BYTES)
        if rc != 0:
            raise RuntimeError(f"deepgemm-sm90 launcher: {self._err.value.decode(errors='replace')}")
        return logits


_launchers: dict[tuple[int, int, int], Launcher] = {}
_failures: dict[tuple[int, int, int], Exception] = {}


def launcher(device: torch.device, next_n: int, heads: int) -> Launcher:
    """The launcher for (``next_n``, ``heads``) on ``device``: built (``build``) and set up once per device.

    A failure is remembered for the process: a later call raises the same exception again at once (no second
    nvcc run per benchmark shape).

    Raises:
        as ``build``, ``Launcher`` and ``Launcher.info``.
    """
    device = torch.device(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (index, next_n, heads)
    if key in _failures:
        raise _failures[key]
    if key not in _launchers:
        try:
            with _build_lock:
                lib = build(next_n, heads)
            fn = Launcher(lib, next_n, heads)
            with torch.cuda.device(index):
                fn.info()
        except Exception as exc:
            _failures[key] = exc
            raise
        _launchers[key] = fn
    return _launchers[key]


def main(argv: list[str] | None = None) -> int:
    """``python -m sglang_fp4_indexer.bench.deepgemm_sm90_paged build``: build every (next_n, heads) now.

    Prints one line per configuration (the library, or why not) and returns 0 when all built, else 1 (2 on a
    usage error). scripts/gpu_run.sh runs it in the background before the benchmark.
    """
    argv = sys.argv[1:] if argv is None else argv
    if argv != ["build"]:
        print("usage: python -m sglang_fp4_indexer.bench.deepgemm_sm90_paged build", file=sys.stderr)
        return 2
    results = build_all()
    for (n, h), res in sorted(results.items()):
        print(f"next_n {n}, H {h}: " + (str(res) if isinstance(res, Path) else f"FAILED: {type(res).__name__}: {res}"))
    return 0 if all(isinstance(r, Path) for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
