"""``Fp4IndexKeyCache``: SGLang 0.5.23's ``IndexKeyCache`` holding the MXFP4 layout (no numerics here).

Built by the ``DSATokenToKVPool._create_index_key_cache`` hook (``kv_pool``), or in its DCP-sharded form
(``dcp_modes.ShardedFp4IndexKeyCache``); the page layout and the token move are the core's
(``sglang_fp4_indexer.pool``).
"""

from __future__ import annotations

from sglang.srt.mem_cache.index_key_cache import IndexKeyCache

from .. import pool as fp4_pool

__all__ = ["Fp4IndexKeyCache"]


class Fp4IndexKeyCache(IndexKeyCache):
    """SGLang's ``IndexKeyCache`` with the MXFP4 layout: one uint8 ``[rows, pages_per_row * 64 * 68]`` buffer per layer.

    Payload plane then scale plane per 64-token page (``sglang_fp4_indexer.pool``);
    the kernels see ``[rows * pages_per_row, 64 * 68]`` (``get_local_buffer``).
    Written by the plugin's ``Indexer._store_index_k_cache`` hook
    (``ops.quantize.store_index_k``), read by its ``_get_topk_paged`` and
    ``_get_topk_ragged`` hooks. SGLang's FP8 entry points into the cache
    (``store_quantized``, ``get_k_and_scale``) raise instead of writing or
    reading 132-byte rows. ``cpu_copy``, ``load_cpu_copy`` and
    ``state_buf_infos`` are SGLang's own: they move whole pages (rows of the
    buffer) and report per-page byte counts, so they are correct for any row
    width, 68-byte tokens included.
    """

    @property
    def pages_per_row(self) -> int:
        """64-token FP4 pages per buffer row: SGLang's ``page_size // index_kpool // index_page_size``.

        1 for a plain pool. Under ``--dcp-size W`` the MTP/EAGLE draft's pool is
        ``dcp_replicated`` with ``page_size = 64 * W`` (it pages the allocator's
        widened slot space) and a 64-token index page, so each row of the buffer
        holds ``W`` index pages, as in SGLang's ``IndexKeyCache``.
        """
        pool = self.pool
        return pool.page_size // pool.index_kpool // pool.index_page_size

    @property
    def row_bytes(self) -> int:
        """Bytes of one row of a layer's buffer: ``pages_per_row x 64 x 68`` (the keys of ``pool.page_size`` slots)."""
        return self.pages_per_row * fp4_pool.page_bytes(self.pool.index_page_size)

    def _buffer_shape(self, num_pages: int) -> tuple[int, int]:
        # SGLang's num_pages counts rows of pool.page_size slots; each holds pages_per_row FP4 pages.
        return (num_pages, self.row_bytes)

    def _kernel_view(self, buffer):
        # The kernels' view: one 64-token FP4 page per row, [rows * pages_per_row, 64 * 68] (no copy).
        return buffer.view(-1, fp4_pool.page_bytes(self.pool.index_page_size))

    @property
    def page_size(self) -> int:
        """Tokens per page of this cache (the pool's index page)."""
        return self.pool.index_page_size

    def move(self, tgt_loc, src_loc) -> None:
        """Move tokens ``src_loc -> tgt_loc`` in every layer (payload and scales), as SGLang's ``move`` does for FP8.

        No host sync (EAGLE with ``topk > 1`` moves every verify step): a pair
        with a slot outside the cache is skipped on the device
        (``pool.copy_slots(check=False)``).
        """
        if tgt_loc.numel() == 0:
            return
        for buffer in self.buffer:
            if buffer.shape[0] == 0:
                continue
            fp4_pool.copy_slots(self._kernel_view(buffer), tgt_loc, src_loc, self.page_size, check=False)

    def get_k_and_scale(self, *args, **kwargs):
        """Refused: SGLang's FP8 gather cannot read the FP4 layout (the plugin's ragged hook gathers FP4)."""
        raise RuntimeError(
            "sglang-fp4-indexer: SGLang's FP8 index-key gather was called on the FP4 index cache; "
            "this call path is not covered by the plugin's Indexer._get_topk_ragged hook"
        )

    def store_quantized(self, *args, **kwargs):
        """Refused: SGLang's FP8 writer would put 132-byte rows into the 68-byte layout."""
        raise RuntimeError(
            "sglang-fp4-indexer: SGLang's FP8 index-key writer was called on the FP4 index cache; "
            "this call path is not covered by the plugin's Indexer._store_index_k_cache hook"
        )
