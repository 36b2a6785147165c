"""Decode context parallelism (DCP) for the FP4 index-key cache.

Under SGLang's decode context parallelism (``attn_dcp_size = W > 1``) a
request's MLA KV is spread over ``W`` ranks by the *owner rule*: global slot
``s`` lives on rank ``s % W`` at local slot ``s // W`` (SGLang 0.5.23,
``transform_index_page_table_dcp`` and ``layers/dcp/layout.py``). The
allocator pages by ``64 * W`` global slots (``allocation_sizing``:
``page_size * attn_dcp_size``), so a request's position ``j`` lands on rank
``j % W`` and each logical page of ``64 * W`` tokens is ``W`` consecutive
64-token index pages (global page ``W * P + t``, ``t < W``) whose owned slots
fill exactly one 64-token local page ``P`` on every rank.

Two modes:

- **replicated**: every rank keeps the whole FP4 index (68 B per token per
  layer) in SGLang's widened global slot space; the numerics are the
  single-GPU ones. ``bytes_per_token`` / ``dcp_capacity`` give the memory.
- **sharded**: rank ``r`` stores only the index keys of the slots it owns
  (``store_index_k_sharded``), 68 / W bytes per token per layer.

  * Decode / target verify (``sharded_decode_topk``): each rank scores its
    local keys with ``ops.paged_logits.paged_logits`` (a local block table and
    local lengths derived from the global ones), keeps its local top-k as
    (score, global position) pairs packed into one int64 each
    (``pack_candidates``), the ``W`` candidate sets are exchanged with one
    all-gather on the given process group, and every rank merges them into
    the same global top-k (``merge_candidates``). The total order is score
    descending, then position ascending, so the result equals the exact top-k
    of the unsharded logits with ties broken by position (lower wins), the
    order of ``reference.topk_reference``: any key of the global top-k is in
    its owner's local top-k under the same total order.
  * Prefill / extend (``stage_index_k``): each rank gathers its share of the
    batch's keys out of its local paged cache (``ops.gather.gather_index_k``:
    payload rows and scale rows at ``pool.scale_row``), the shares are
    all-gathered and de-interleaved to global order into flat planes, which
    ``ops.ragged_logits.ragged_logits`` scores (``sharded_ragged_logits``).
    The staged planes equal the single-process ``gather_index_k`` byte for byte.

The candidate buffers (``CandidateBuffers``) and the staging buffers
(``StagingBuffers``) are allocated once, sized by a batch bound, and reused
(address-stable: safe under CUDA-graph capture and replay for decode).

Modules, one job each: ``layout`` (the owner rule and per-rank page math), ``memory`` (the modes, bytes per
token and capacity), ``store`` (the sharded store), ``decode`` (local top-k, candidate exchange, merge) and
``prefill`` (staging and the ragged scorer). The public names are re-exported here.

Nothing here imports SGLang. Every scale-plane access goes through
``pool.scale_row`` inside the ops this package calls (``store_index_k`` on
write, ``gather_index_k`` on read); this package never indexes a plane itself.
"""

from __future__ import annotations

# The package's names are its modules' __all__ (one list each, in the module that defines them).
from . import layout, memory, store, decode, prefill
from .layout import *  # noqa: F401,F403
from .memory import *  # noqa: F401,F403
from .store import *  # noqa: F401,F403
from .decode import *  # noqa: F401,F403
from .prefill import *  # noqa: F401,F403

__all__ = [
    *layout.__all__,
    *memory.__all__,
    *store.__all__,
    *decode.__all__,
    *prefill.__all__,
]
