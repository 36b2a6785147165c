"""Timing: CUDA graphs of many calls on the GPU, wall clock under the CPU interpreter; copy bandwidth; L2 rotation.

GPU method: warm up on a side stream (so Triton
compilation and lazy initialisation stay out of the numbers and out of the
capture), estimate one call's time eagerly, capture ``calls`` calls (20 to
``MAX_CALLS``, enough for a replay of ~``TARGET_GRAPH_S``) into one CUDA
graph, replay it once more to warm it, then time ``replays`` replays with CUDA
events; the time per call is the median replay time over ``calls``.

L2 rotation: H200's L2 is 50-60 MB. When one call's working set (its cache plus
its logits) is under ``ROTATION_FACTOR`` x L2, the caller gives ``sets``
distinct copies of the inputs and outputs and the graph cycles through them
(call ``j`` uses set ``j % sets``), so that by the time a set comes round
again, ``ROTATION_FACTOR`` x L2 of other data has passed through the cache and
each call reads from HBM. Without it an FP4 cache, half the size of an FP8 one,
would be flattered most.

Host time (``time_host``, CUDA only): the same call made eagerly, as a server
makes it outside CUDA graphs: ``HOST_WARMUP`` calls, then ``HOST_CALLS`` back to
back with no synchronisation between them; the host's wall time to issue them,
per call (the device catches up afterwards). That is the Python and launch cost
a call adds to an eager step, beside its device time.

CPU: ``time.perf_counter`` around single calls, median of a few. Under
``TRITON_INTERPRET=1`` that measures the interpreter; every report labels such
times with ``CPU_TIMING_NOTE``.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

__all__ = [
    "CPU_TIMING_NOTE",
    "ROTATION_FACTOR",
    "MAX_SETS",
    "MIN_CALLS",
    "MAX_CALLS",
    "TARGET_GRAPH_S",
    "Timing",
    "TimedRun",
    "l2_cache_bytes",
    "rotation_sets",
    "copy_bandwidth",
    "MMA_SIZE",
    "fp8_mma_rate",
    "time_calls",
    "HOST_WARMUP",
    "HOST_CALLS",
    "time_host",
]

#: Label of every time measured on the CPU.
CPU_TIMING_NOTE = "CPU interpreter, not a speed figure"
#: Rotate inputs when one call's working set is under this many times the L2 size.
ROTATION_FACTOR = 4
#: Most distinct input/output sets rotated through (tiny cases stay near L2 size).
MAX_SETS = 512
#: Fewest and most calls captured in one CUDA graph.
MIN_CALLS = 20
MAX_CALLS = 512
#: Aim for a replay of about this long (calls are added up to MAX_CALLS).
TARGET_GRAPH_S = 0.02
#: Replays timed: enough for about this much total, between the two bounds.
TARGET_TOTAL_S = 0.25
MIN_REPLAYS = 5
MAX_REPLAYS = 20
#: Wall-clock repeats per call on the CPU.
CPU_REPEATS = 3
#: Eager calls before the host-time measurement, and calls measured back to back.
HOST_WARMUP = 20
HOST_CALLS = 500
#: Host-time repeats (the median is reported).
HOST_REPEATS = 3


@dataclass
class Timing:
    """One op's measured time.

    Attributes:
        seconds: median time per call.
        samples: per-call time of each replay (GPU) or each call (CPU), seconds.
        calls_per_graph: calls captured in the graph (1 on the CPU).
        method: ``"cuda-graph"`` or ``"wall-clock"``.
        sets: distinct input/output sets rotated through.
    """

    seconds: float
    samples: list[float]
    calls_per_graph: int
    method: str
    sets: int

    @property
    def spread(self) -> float:
        """``(max - min) / median`` of the samples: how noisy the figure is."""
        return (max(self.samples) - min(self.samples)) / self.seconds if self.seconds > 0 else float("nan")

    def to_dict(self) -> dict:
        """JSON-ready fields (seconds as floats)."""
        return {
            "seconds": self.seconds,
            "samples": list(self.samples),
            "calls_per_graph": self.calls_per_graph,
            "method": self.method,
            "sets": self.sets,
            "spread": self.spread,
        }


@dataclass
class TimedRun:
    """A ``Timing`` and the last output each set's calls returned (what the checks read).

    The CUDA graph is kept alive (``graph``) so outputs allocated inside it stay
    valid until the caller drops this object.
    """

    timing: Timing
    outputs: dict[int, Any]
    graph: Any = field(default=None, repr=False)


def l2_cache_bytes(device: torch.device) -> int | None:
    """L2 size of a CUDA device in bytes (``None`` on the CPU).

    Reads ``torch.cuda.get_device_properties(device).L2_cache_size``; if this
    torch lacks the field, assumes 60 MB (H200).
    """
    if device.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(device)
    size = getattr(props, "L2_cache_size", None)
    return int(size) if size else 60 * 1024 * 1024


def rotation_sets(case_bytes: int, l2_bytes: int | None, factor: int = ROTATION_FACTOR, max_sets: int = MAX_SETS) -> int:
    """Distinct input/output sets so that consecutive uses of one set are ``factor`` x L2 apart.

    ``1`` when there is no L2 to defeat (``l2_bytes`` is ``None``: the CPU) or the
    case alone is at least ``factor`` x L2; else ``ceil(factor * l2 / case_bytes)``,
    at most ``max_sets``.

    Raises:
        ValueError: ``case_bytes`` not positive or ``factor``/``max_sets`` < 1.
    """
    if case_bytes <= 0:
        raise ValueError(f"case_bytes: expected > 0, got {case_bytes}")
    if factor < 1 or max_sets < 1:
        raise ValueError(f"factor and max_sets: expected >= 1, got {factor}, {max_sets}")
    if l2_bytes is None or case_bytes >= factor * l2_bytes:
        return 1
    return min(max_sets, math.ceil(factor * l2_bytes / case_bytes))


def _events():
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def copy_bandwidth(device: torch.device, nbytes: int | None = None, repeats: int = 10) -> tuple[float, list[float]]:
    """Measured copy bandwidth in bytes/s: bytes read + bytes written over the median copy time.

    On CUDA: a ``nbytes`` (default 1 GiB) device-to-device ``copy_``, 3 warm-ups,
    then ``repeats`` copies each timed with CUDA events. On the CPU: a 64 MiB
    ``copy_`` timed with the wall clock (a reference for the CPU figures only).

    Returns:
        ``(bandwidth, samples)``: bytes/s from the median, and every sample's bytes/s.

    Raises:
        ValueError: ``nbytes`` or ``repeats`` not positive.
    """
    if nbytes is None:
        nbytes = (1 << 30) if device.type == "cuda" else (64 << 20)
    if nbytes <= 0 or repeats < 1:
        raise ValueError(f"nbytes and repeats: expected > 0, got {nbytes}, {repeats}")
    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = _events()
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3)
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - t0)
    del src, dst
    moved = 2 * nbytes
    return moved / statistics.median(times), [moved / t for t in times]


#: The dense FP8 GEMM whose rate is the tensor-core ceiling: M = N = K, large enough to fill the chip.
MMA_SIZE = 8192


def fp8_mma_rate(device: torch.device, size: int = MMA_SIZE, repeats: int = 10) -> tuple[float | None, list[float]]:
    """Measured dense FP8 tensor-core rate in FLOP/s: a ``size`` x ``size`` x ``size`` e4m3 GEMM with bf16 output
    through ``torch._scaled_mm`` (what the FP8 MMA sustains on a large, compute-bound product), random operands
    (never zeros), 3 warm-ups, then ``repeats`` products each timed with CUDA events; ``2 * size**3`` FLOPs over
    the median.

    Returns:
        ``(rate, samples)``: FLOP/s from the median and every sample's; ``(None, [])`` where it cannot be measured
        (not CUDA, a GPU without FP8 tensor cores: compute capability under 8.9, or a torch without
        ``_scaled_mm``).

    Raises:
        ValueError: ``size`` or ``repeats`` not positive.
        RuntimeError: torch refuses the product on this GPU (its own message); the benchmark then runs without a
            tensor-core floor and records why.
    """
    if size < 1 or repeats < 1:
        raise ValueError(f"size and repeats: expected > 0, got {size}, {repeats}")
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 9) or not hasattr(torch, "_scaled_mm"):
        return None, []
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, device=device, generator=gen).to(torch.float8_e4m3fn)
    b = torch.randn(size, size, device=device, generator=gen).to(torch.float8_e4m3fn).t()  # column-major
    one = torch.ones((), device=device, dtype=torch.float32)

    def product():
        return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    for _ in range(3):
        product()
    times = []
    for _ in range(repeats):
        start, end = _events()
        start.record()
        product()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    del a, b
    flops = 2 * size ** 3
    return flops / statistics.median(times), [flops / t for t in times]


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


def time_calls(
    fn: Callable[[int], Any],
    device: torch.device,
    sets: int = 1,
    *,
    min_calls: int = MIN_CALLS,
    max_calls: int = MAX_CALLS,
    target_graph_s: float = TARGET_GRAPH_S,
) -> TimedRun:
    """Time ``fn(set_index)`` per call (module docstring: CUDA graph on the GPU, wall clock on the CPU).

    Args:
        fn: runs one call on input/output set ``set_index`` (``0 <= set_index < sets``)
            and returns its output (kept for the checks). On CUDA it must be
            capturable: no host synchronisation.
        device: where the call runs.
        sets: rotation sets (``rotation_sets``).
        min_calls, max_calls: bounds on the calls per graph; at least ``sets``
            calls are captured so every set is used.
        target_graph_s: aim for a replay of about this long.

    Returns:
        ``TimedRun``: the timing and, per set, the output of its last call in
        the graph (GPU: the values of the last replay).

    Raises:
        ValueError: ``sets`` or the call bounds not positive.
        RuntimeError: whatever ``fn`` or the CUDA graph capture raises.
    """
    if sets < 1 or min_calls < 1 or max_calls < min_calls:
        raise ValueError(f"sets, min_calls, max_calls: expected 1 <= sets, 1 <= min <= max, got {sets}, {min_calls}, {max_calls}")
    if device.type != "cuda":
        outputs: dict[int, Any] = {}
        for s in range(sets):
            outputs[s] = fn(s)  # warm-up (compiles or interprets once)
        samples = []
        for rep in range(CPU_REPEATS):
            s = rep % sets
            t0 = time.perf_counter()
            outputs[s] = fn(s)
            samples.append(time.perf_counter() - t0)
        return TimedRun(Timing(statistics.median(samples), samples, 1, "wall-clock", sets), outputs)

    current = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    side.wait_stream(current)
    with torch.cuda.stream(side):
        for s in range(min(sets, 3)):
            fn(s)
        start, end = _events()
        probe = min(max(sets, 3), 10)
        start.record()
        for j in range(probe):
            fn(j % sets)
        end.record()
    current.wait_stream(side)
    torch.cuda.synchronize(device)
    estimate = max(start.elapsed_time(end) * 1e-3 / probe, 1e-7)
    calls = _clamp(math.ceil(target_graph_s / estimate), min_calls, max_calls)
    calls = min(max(calls, sets), max(max_calls, sets))

    graph = torch.cuda.CUDAGraph()
    outputs = {}
    with torch.cuda.graph(graph):
        for j in range(calls):
            outputs[j % sets] = fn(j % sets)
    graph.replay()
    torch.cuda.synchronize(device)
    replays = _clamp(math.ceil(TARGET_TOTAL_S / (calls * estimate)), MIN_REPLAYS, MAX_REPLAYS)
    samples = []
    for _ in range(replays):
        start, end = _events()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e-3 / calls)
    return TimedRun(Timing(statistics.median(samples), samples, calls, "cuda-graph", sets), outputs, graph)


def time_host(fn: Callable[[int], Any], device: torch.device, sets: int = 1, *, warmup: int = HOST_WARMUP,
              calls: int = HOST_CALLS, repeats: int = HOST_REPEATS) -> Timing:
    """Host wall time per eager call of ``fn(set_index)`` on a CUDA device (module docstring).

    ``warmup`` calls, a synchronisation, then ``repeats`` times: ``calls`` calls
    back to back (cycling through the ``sets``), timed with ``time.perf_counter``
    from the first call's start to the last call's return, then one
    synchronisation (not timed). A call whose device time exceeds its host time
    fills the launch queue and is then timed at its device time: the figure is
    the host's cost per call only where it is the larger of the two.

    Returns:
        ``Timing`` with ``method="host-eager"``: the median over the repeats of seconds per call.

    Raises:
        ValueError: ``device`` is not CUDA, or a count below 1.
    """
    if device.type != "cuda":
        raise ValueError(f"device: host time is measured on a CUDA device, got {device}")
    if min(sets, calls, repeats) < 1 or warmup < 0:
        raise ValueError(f"sets, calls, repeats: expected >= 1 (warmup >= 0), got {sets}, {calls}, {repeats}, {warmup}")
    for j in range(warmup):
        fn(j % sets)
    torch.cuda.synchronize(device)
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for j in range(calls):
            fn(j % sets)
        samples.append((time.perf_counter() - t0) / calls)
        torch.cuda.synchronize(device)
    return Timing(statistics.median(samples), samples, calls, "host-eager", sets)
