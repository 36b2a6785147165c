"""Decode context parallelism (DCP) of the FP4 index inside SGLang 0.5.23 (no numerics here).

The maths lives in ``sglang_fp4_indexer.dcp``; this module adapts SGLang's
objects to it. Under ``--dcp-size W > 1`` the gate's ``Decision.dcp_mode`` says
how a DSA pool holds the FP4 index:

- ``"replicated"`` (default): SGLang's own layout. The target pool's index
  cache spans the widened global slot space (``index_buf_size = (size + page)
  * W - page``) with 68-byte cells; the sizing hook charges 68 B and SGLang's
  ``_compute_cell_size`` multiplies by ``W`` as it does for its 132-byte cells.
  The indexer hooks run the single-GPU FP4 path unchanged.
- ``"sharded"`` (``--fp4-indexer-dcp-shard``): the target pool's index cache is
  ``ShardedFp4IndexKeyCache``, holding only this rank's slots (``s % W == rank``
  at ``s // W``). Stores go through ``dcp.store_index_k_sharded``; decode and
  verify through ``dcp.sharded_decode_topk`` on SGLang's DCP process group
  (``get_parallel().dcp_group``), whose merged top-k is handed back to
  SGLang's own masking and ``topk_transform`` as logits holding only the
  selected scores (``dcp.scatter_topk_logits``); prefill through
  ``dcp.stage_index_k``. The draft worker's pool stays replicated (SGLang runs
  the draft without DCP: its backend uses ``dcp_size = 1``).

Seams (read in SGLang 0.5.23): ``DSATokenToKVPool.__init__`` (the widened
``index_buf_size``), ``DefaultPoolConfigurator._compute_cell_size`` (indexer
cell ``* attn_dcp_size`` for the target), ``allocation_sizing`` (logical pages
of ``page_size * attn_dcp_size`` slots), ``layers/dcp/layout.py`` (the owner
rule), ``runtime_context.get_parallel()`` (``attn_dcp_size``,
``attn_dcp_rank``, ``dcp_group``).
"""

from __future__ import annotations

import contextlib
import contextvars

from .. import dcp as core
from .. import pool as fp4_pool
from .index_key_cache import Fp4IndexKeyCache

__all__ = [
    "ShardedFp4IndexKeyCache",
    "pool_mode",
    "scope",
    "create_index_key_cache",
    "is_sharded",
    "indexer_cell_size",
    "store",
    "paged_logits",
    "gather",
]

_mode: contextvars.ContextVar[str] = contextvars.ContextVar("fp4_index_dcp_mode", default="")


def _parallel():
    from sglang.srt.runtime_context import get_parallel

    return get_parallel()


def pool_mode(kvc, decision) -> str:
    """How the pool a ``KVCacheConfigurator`` builds holds the FP4 index: ``""`` (no DCP), ``"replicated"`` or ``"sharded"``.

    Sharded only for the target worker: SGLang runs the draft model without
    DCP (its DSA backend sets ``dcp_size = 1``) over the replicated widened slots.
    """
    mode = getattr(decision, "dcp_mode", "")
    if mode == core.SHARDED and getattr(kvc, "is_draft_worker", False):
        return core.REPLICATED
    return mode


@contextlib.contextmanager
def scope(mode: str):
    """While open, ``create_index_key_cache`` builds the index cache for ``mode``."""
    token = _mode.set(mode)
    try:
        yield
    finally:
        _mode.reset(token)


class ShardedFp4IndexKeyCache(Fp4IndexKeyCache):
    """The FP4 index-key cache of one DCP rank in the sharded mode: only the slots this rank owns.

    SGLang addresses the index with global (widened) slots; this cache holds
    global slot ``s`` (``s % W == rank``) at local slot ``s // W``
    (``sglang_fp4_indexer.dcp``), so its buffers are ``1 / W`` of the
    replicated ones. It also owns the preallocated exchange buffers of the
    sharded decode top-k and the prefill staging buffers.

    Attributes:
        dcp_size, dcp_rank: DCP width and this rank.
        global_buf_size: SGLang's widened ``index_buf_size`` this cache stands for.
        group: the ``torch.distributed`` process group of the DCP ranks
            (default: SGLang's ``get_parallel().dcp_group.device_group``, looked up on first use).
    """

    def __init__(self, pool, index_buf_size: int, dcp_size: int, dcp_rank: int, group=None):
        core.check_world(dcp_size, dcp_rank)
        if pool.page_size // pool.index_kpool != pool.index_page_size:
            raise RuntimeError(
                "sglang-fp4-indexer: the sharded FP4 index serves pools with one index page per row "
                f"(page_size {pool.page_size}, index page {pool.index_page_size}); this pool is replicated "
                "over DCP ranks and keeps the replicated FP4 index"
            )
        self.dcp_size = dcp_size
        self.dcp_rank = dcp_rank
        self.global_buf_size = index_buf_size
        self._group = group
        self._candidates: dict[int, list[core.CandidateBuffers]] = {}
        self._staging: core.StagingBuffers | None = None
        # SGLang's IndexKeyCache holds (buf + page + 1) // page pages of global slots; global page
        # W * P + t (t < W) is local page P, so this rank needs ceil(pages / W) pages, i.e. the
        # index_buf_size for which SGLang's formula gives that count.
        page = pool.page_size
        local_pages = -(-((index_buf_size + page + 1) // page) // dcp_size)
        super().__init__(pool, local_pages * page - page - 1)

    @property
    def group(self):
        """The DCP process group (SGLang's ``dcp_group.device_group`` unless set)."""
        if self._group is None:
            self._group = _parallel().dcp_group.device_group
        return self._group

    @group.setter
    def group(self, value) -> None:
        self._group = value

    def candidate_buffers(self, rows: int, topk: int, device) -> core.CandidateBuffers:
        """Exchange buffers holding ``rows`` query rows of ``topk`` candidates.

        Allocated on first need and reused; a larger batch gets new, larger
        buffers while the old ones stay alive, so CUDA graphs captured with them
        stay valid (SGLang captures its largest batch first, so this grows once).
        """
        have = self._candidates.setdefault(topk, [])
        if not have or have[-1].max_rows < rows:
            have.append(core.CandidateBuffers(max(rows, 1), topk, self.dcp_size, device))
        return have[-1]

    def staging_buffers(self, keys: int, requests: int, device) -> core.StagingBuffers:
        """Prefill staging buffers with room for ``keys`` keys of ``requests`` requests (grown, never shrunk).

        Prefill runs eagerly in SGLang 0.5.23 (its own FP8 gather allocates per
        call), so growing between calls is safe.
        """
        if self._staging is None:
            self._staging = core.StagingBuffers(max(keys, 1), max(requests, 1), self.dcp_size, device)
        else:
            self._staging.reserve(keys, requests)
        return self._staging

    def _local(self, loc):
        return core.owned_local_slots(loc.reshape(-1).long(), self.dcp_size, self.dcp_rank)

    def move(self, tgt_loc, src_loc) -> None:
        """Move tokens ``src_loc -> tgt_loc`` (global slots) that this rank owns, without a host sync.

        A pair whose two slots this rank owns is copied (payload and scales,
        ``pool.copy_slots(check=False)``); every other pair is skipped on the
        device (``dcp.local_store_slots`` gives -1 for a slot of another rank),
        as the replicated cache skips a slot outside the cache. A pair whose two
        slots have different owners would need a data exchange; SGLang moves
        index keys only in EAGLE tree verify (``--speculative-eagle-topk > 1``),
        and there the gate serves DCP with the replicated index, so the sharded
        cache never sees such a pair.
        """
        if tgt_loc.numel() == 0:
            return
        dst = core.local_store_slots(tgt_loc.reshape(-1).long(), self.dcp_size, self.dcp_rank)
        orig = core.local_store_slots(src_loc.reshape(-1).long(), self.dcp_size, self.dcp_rank)
        for buffer in self.buffer:
            if buffer.shape[0]:
                fp4_pool.copy_slots(self._kernel_view(buffer), dst, orig, self.page_size, check=False)

    def cpu_copy(self, indices):
        """SGLang's page offload of the global ``indices``: this rank's local pages of them."""
        return super().cpu_copy(self._local(indices))

    def load_cpu_copy(self, index_k_cpu, indices) -> None:
        """SGLang's page reload of the global ``indices`` into this rank's local pages."""
        super().load_cpu_copy(index_k_cpu, self._local(indices))


def create_index_key_cache(pool) -> Fp4IndexKeyCache:
    """The FP4 index cache for ``pool`` under the open ``scope``: sharded for ``"sharded"``, else SGLang's sizing."""
    if _mode.get() == core.SHARDED:
        parallel = _parallel()
        return ShardedFp4IndexKeyCache(
            pool, pool.index_buf_size, int(parallel.attn_dcp_size), int(parallel.attn_dcp_rank)
        )
    return Fp4IndexKeyCache(pool, pool.index_buf_size)


def is_sharded(pool) -> bool:
    """Whether ``pool``'s index cache is the sharded FP4 one."""
    return isinstance(getattr(pool, "index_key_cache", None), ShardedFp4IndexKeyCache)


def indexer_cell_size(fp4_bytes: int, kvc, decision, *, allocate_all_layers: bool) -> int:
    """Index bytes per local token that ``_compute_dsa_indexer_cell_size`` returns for an FP4 pool.

    SGLang multiplies the target's result by ``attn_dcp_size`` (its index is
    replicated over the widened slots). Replicated FP4: ``fp4_bytes`` as is.
    Sharded target: ``ceil(fp4_bytes / W)``, so that after SGLang's ``* W`` a
    local token is charged its own keys (rounded up to ``W`` bytes per token
    over all layers). The draft's share (``allocate_all_layers``) and the draft
    worker stay replicated.
    """
    if pool_mode(kvc, decision) != core.SHARDED or allocate_all_layers:
        return fp4_bytes
    dcp_size = int(_parallel().attn_dcp_size)
    return -(-fp4_bytes // dcp_size) if dcp_size > 1 else fp4_bytes


def store(cache: ShardedFp4IndexKeyCache, key, layer_buffer, out_cache_loc, page_size: int) -> None:
    """Write the keys this rank owns (``dcp.store_index_k_sharded``; no host sync)."""
    core.store_index_k_sharded(
        key, layer_buffer, out_cache_loc, cache.dcp_size, cache.dcp_rank, page_size=page_size, check_slots=False
    )


def paged_logits(cache: ShardedFp4IndexKeyCache, q, weights, layer_buffer, block_table, context_lens, *,
                 width: int, topk: int, page_size: int, block_kv: int):
    """Logits rows for SGLang's top-k from the sharded decode top-k (``dcp.sharded_decode_topk``).

    Returns fp32 ``[rows, width]`` holding the merged global top-k scores at
    their positions and ``-inf`` elsewhere (``dcp.scatter_topk_logits``): any
    exact top-k of it (SGLang's ``topk_transform``, after its own init/local
    masking) selects the sharded top-k.
    """
    rows = q.shape[0]
    buffers = cache.candidate_buffers(rows, topk, q.device)
    merged = core.sharded_decode_topk(
        q, weights, layer_buffer, block_table, context_lens, topk=topk, world_size=cache.dcp_size,
        rank=cache.dcp_rank, group=cache.group, buffers=buffers, page_size=page_size, check=False, block_kv=block_kv,
    )
    return core.scatter_topk_logits(merged.positions, merged.scores, width)


def gather(cache: ShardedFp4IndexKeyCache, layer_buffer, block_tables, seq_lens, seq_lens_cpu, *, page_size: int):
    """The batch's flat FP4 planes in global order from the sharded caches (``dcp.stage_index_k``)."""
    lens = [int(n) for n in seq_lens_cpu.reshape(-1).tolist()]
    buffers = cache.staging_buffers(sum(lens), len(lens), layer_buffer.device)
    return core.stage_index_k(
        layer_buffer, block_tables, seq_lens, lens, world_size=cache.dcp_size, rank=cache.dcp_rank,
        group=cache.group, buffers=buffers, page_size=page_size, check=False,
    )
