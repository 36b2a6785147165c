"""Benchmark inputs: random paged FP4 caches, index queries, weights and block tables, built on the device.

Keys are random bytes written straight into the cache (building real keys
through the fp64 reference quantizer would take minutes at 64 x 128 K keys):
payload bytes uniform over 0..255 (all 16 E2M1 codes, both signs), UE8M0
scale codes uniform over ``SCALE_CODES`` (a spread of 7 binades, as real keys
have: every key's group scales lie within ``2**7`` of each other, so the
scorer's folded-scale path and the FP8 copy of the keys are exact). These are
valid MXFP4 keys; never zeros (zeros hide unwritten outputs and can
run faster than real data).

Rotation sets (``timing.rotation_sets``) are byte copies of the first cache:
distinct memory, identical keys, so one reference serves every set's check.
Pages are handed out in a seeded random order (a shuffled block table, as a
real pool's would be).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..format import INDEX_HEAD_DIM
from ..pool import PAGE_SIZE, allocate_index_k_cache, payload_plane, scale_plane
from .floor import logits_width, table_width
from .shapes import ScorerShape

__all__ = ["SCALE_CODES", "ScorerInputs", "build_scorer_inputs", "checked_requests", "random_index_k_cache"]

#: UE8M0 scale codes of the random keys (inclusive): 2**-3 .. 2**4.
SCALE_CODES = (124, 131)


@dataclass
class ScorerInputs:
    """One scorer shape's inputs on the device.

    Attributes:
        shape: the geometry.
        q: float8_e4m3fn ``[rows, H, 128]`` index queries.
        weights: fp32 ``[rows, H]`` head weights.
        context_lens: int32 ``[B]`` (all ``shape.context``).
        block_table: int32 ``[B, max_pages]``, a permutation of the cache's pages.
        caches: FP4 caches ``[num_pages, page_size * 68]``, one per rotation set,
            identical content.
        width: logits columns (``floor.logits_width``: ``shape.width``, else ``max_pages * page_size``).
    """

    shape: ScorerShape
    q: torch.Tensor
    weights: torch.Tensor
    context_lens: torch.Tensor
    block_table: torch.Tensor
    caches: list[torch.Tensor] = field(repr=False)
    width: int

    @property
    def device(self) -> torch.device:
        return self.q.device

    @property
    def num_pages(self) -> int:
        return self.caches[0].shape[0]


def random_index_k_cache(num_pages: int, device: torch.device, generator: torch.Generator, page_size: int = PAGE_SIZE) -> torch.Tensor:
    """A filled FP4 cache of random valid keys (module docstring), on ``device``.

    Raises:
        ValueError: as ``pool.allocate_index_k_cache``.
    """
    cache = allocate_index_k_cache(num_pages, page_size, device=device)
    payload = payload_plane(cache, page_size)
    scales = scale_plane(cache, page_size)
    payload.copy_(torch.randint(0, 256, payload.shape, generator=generator, device=device, dtype=torch.uint8))
    lo, hi = SCALE_CODES
    scales.copy_(torch.randint(lo, hi + 1, scales.shape, generator=generator, device=device, dtype=torch.uint8))
    return cache


def build_scorer_inputs(shape: ScorerShape, device: torch.device, sets: int = 1, seed: int = 0) -> ScorerInputs:
    """Random inputs of ``shape`` on ``device`` with ``sets`` copies of the cache.

    Queries: ``2 * N(0, 1)`` rounded to e4m3; weights: ``U(0, 1) * H**-0.5``.

    Raises:
        ValueError: ``sets < 1``.
    """
    if sets < 1:
        raise ValueError(f"sets: expected >= 1, got {sets}")
    g = torch.Generator(device=device).manual_seed(seed)
    width = logits_width(shape)
    max_pages = table_width(shape) // PAGE_SIZE
    num_pages = shape.batch * max_pages
    first = random_index_k_cache(num_pages, device, g)
    caches = [first] + [first.clone() for _ in range(sets - 1)]
    perm = torch.randperm(num_pages, generator=g, device=device)
    block_table = perm.view(shape.batch, max_pages).to(torch.int32).contiguous()
    q = (torch.randn(shape.rows, shape.heads, INDEX_HEAD_DIM, generator=g, device=device) * 2).to(torch.float8_e4m3fn)
    weights = torch.rand(shape.rows, shape.heads, generator=g, device=device) * shape.heads**-0.5
    context_lens = torch.full((shape.batch,), shape.context, dtype=torch.int32, device=device)
    return ScorerInputs(shape, q, weights, context_lens, block_table, caches, width)


def checked_requests(shape: ScorerShape) -> list[int]:
    """Requests whose rows the correctness checks compare with the reference: the first and the last."""
    return sorted({0, shape.batch - 1})
