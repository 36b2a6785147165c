"""The persistent grid of the paged scorer per device: how many CTA-schedule entries a call is split into
(docs/design.md, "The CTA schedule").

The schedule's tile is ``paged_logits.default_block_kv``; its grid is ``default_num_ctas``: four entries per SM
on Hopper (one per math warpgroup of the wgmma kernel), two CTAs per SM for the Triton scorers, a small fixed
count on the CPU. The planner (``schedule``) and the scorer plan with it; the core's address-stable buffers
(``schedule_buffer.ScheduleBuffer``) default to it.
"""

from __future__ import annotations

import functools

import torch

__all__ = ["CPU_NUM_CTAS", "CTAS_PER_SM", "SM90_CTAS_PER_SM", "default_num_ctas"]

#: CTAs of the persistent grid on a CPU device (the Triton interpreter): small,
#: so interpreter runs stay fast while still splitting work over several CTAs.
CPU_NUM_CTAS = 4


#: Persistent-grid CTAs per SM for the Triton paged scorers (measured on H200, docs/perf-notes.md).
CTAS_PER_SM = 2
#: Schedule entries per SM for the Hopper wgmma kernel: one per math warpgroup, four per SM (one CTA of four
#: math warpgroups; docs/perf-notes.md, "The warp-specialised CTA").
SM90_CTAS_PER_SM = 4


def default_num_ctas(device: torch.device | str | None = None, impl: str | None = None) -> int:
    """Schedule entries (CTAs of the persistent grid) on ``device``: entries per SM x its SM count on CUDA,
    ``CPU_NUM_CTAS`` otherwise. On Hopper one entry is one math warpgroup of the wgmma kernel, four per
    CTA, so the grid there is the SM count.

    ``SM90_CTAS_PER_SM`` (4) for the Hopper wgmma kernel, ``CTAS_PER_SM`` (2)
    for the Triton scorers: two CTAs per SM measured 1.6x faster than one for
    the Triton scorers on H200, and four (one per math warpgroup) fastest for
    the wgmma kernel (docs/perf-notes.md, "The warp-specialised CTA").

    Args:
        device: a torch device (``None``: the current CUDA device when CUDA is
            available, else the CPU).
        impl: the ``paged_logits`` formulation the schedule is for: ``None`` or
            ``"auto"``, the device's default (wgmma where ``ops.sm90.available``);
            ``"wgmma"``; any other name, a Triton scorer. Resolved once per device
            (this runs on every serving step).

    Returns:
        int >= 1.
    """
    if device is None:
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(device)
    if device.type != "cuda":
        return CPU_NUM_CTAS
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _cuda_num_ctas(index, "wgmma" if impl == "wgmma" else None if impl in (None, "auto") else "triton")


@functools.lru_cache(maxsize=None)
def _cuda_num_ctas(index: int, kind: str | None) -> int:
    from . import sm90

    device = torch.device("cuda", index)
    wgmma = kind == "wgmma" or (kind is None and sm90.available(device))
    return (SM90_CTAS_PER_SM if wgmma else CTAS_PER_SM) * torch.cuda.get_device_properties(device).multi_processor_count
