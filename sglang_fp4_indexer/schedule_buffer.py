"""Address-stable CTA-schedule buffers and their publish (docs/design.md, The CTA schedule).

A CUDA graph records the address of every tensor its kernels read. The paged
scorer reads its CTA schedule, so the schedule must live in one buffer whose
address never changes for the life of the graph, and be rewritten in place
(by the planner kernel, ``ops.schedule.plan_paged_schedule_into``) before
each replay or inside the graph itself. ``ScheduleBuffer`` owns those buffers:
one per ``(key, batch size)``, where ``key`` names the user (e.g. the attention
backend, the draft step or the stream), as SGLang keeps one metadata buffer per
captured batch size. The grid they are sized for is the scorer's own
(``ops.grid.default_num_ctas``).

Nothing here imports SGLang.
"""

from __future__ import annotations

from typing import Hashable

import torch

from .ops.grid import default_num_ctas
from .ops.schedule import check_block_kv, plan_paged_schedule_into

__all__ = ["ScheduleBuffer"]


class ScheduleBuffer:
    """Preallocated, address-stable CTA-schedule buffers, one per ``(key, batch size)``.

    Graph safety: ``get`` allocates a buffer the first time a ``(key,
    batch_size)`` is seen and returns that same tensor ever after; ``publish``
    runs the planner kernel into it in place (one launch, no host sync, no
    allocation once the buffer exists). So a CUDA graph that reads the buffer
    stays valid across replays, and ``publish`` may be called before each
    replay or captured inside the graph. Call ``get`` (or ``publish`` once)
    before capture so the buffer is allocated outside the graph's memory pool.

    Args:
        block_kv: keys per tile, a positive multiple of the page size (64).
        num_ctas: CTAs of the persistent grid (``None``: ``default_num_ctas(device)``).
        device: where the buffers live.

    Raises:
        ValueError: ``block_kv`` not a positive multiple of 64, or ``num_ctas`` < 1.
    """

    def __init__(self, block_kv: int, num_ctas: int | None = None, device: torch.device | str | None = None):
        self.block_kv = check_block_kv(block_kv)
        if device is None:
            device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        if num_ctas is None:
            num_ctas = default_num_ctas(self.device)
        if not isinstance(num_ctas, int) or isinstance(num_ctas, bool) or num_ctas < 1:
            raise ValueError(f"num_ctas: expected an int >= 1, got {num_ctas!r}")
        self.num_ctas = num_ctas
        self._buffers: dict[tuple[Hashable, int], torch.Tensor] = {}

    def get(self, key: Hashable, batch_size: int) -> torch.Tensor:
        """The buffer of ``(key, batch_size)``: int32 ``[num_ctas + 1, 2]``, allocated on first use.

        Raises:
            ValueError: ``batch_size`` is not an int >= 0.
        """
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 0:
            raise ValueError(f"batch_size: expected an int >= 0, got {batch_size!r}")
        buf = self._buffers.get((key, batch_size))
        if buf is None:
            buf = torch.zeros((self.num_ctas + 1, 2), dtype=torch.int32, device=self.device)
            self._buffers[(key, batch_size)] = buf
        return buf

    def publish(self, context_lens: torch.Tensor, key: Hashable = "default") -> torch.Tensor:
        """Plan the schedule of ``context_lens`` into the ``(key, B)`` buffer and return it.

        Always returns the same tensor (same storage) for the same ``key`` and
        batch size ``B = context_lens.shape[0]``.

        Args:
            context_lens: int32 ``[B]`` or ``[B, next_n]`` on this buffer's device.
            key: names the user of the buffer (backend, draft step, stream...).

        Returns:
            The int32 ``[num_ctas + 1, 2]`` schedule buffer, rewritten in place.

        Raises:
            TypeError / ValueError: as ``ops.schedule.plan_paged_schedule_into``;
                ``context_lens`` on another device than the buffers.
        """
        if not isinstance(context_lens, torch.Tensor):
            raise TypeError(f"context_lens: expected a torch.Tensor, got {type(context_lens).__name__}")
        if context_lens.device != self.device:
            raise ValueError(f"context_lens: expected device {self.device}, got {context_lens.device}")
        if context_lens.dim() not in (1, 2):
            raise ValueError(
                f"context_lens: expected [B] or [B, next_n], got shape {list(context_lens.shape)}"
            )
        out = self.get(key, context_lens.shape[0])
        return plan_paged_schedule_into(context_lens, self.block_kv, out)

    def __len__(self) -> int:
        """Number of buffers allocated so far."""
        return len(self._buffers)
