"""The FP4 index-key cache in SGLang 0.5.23's hierarchical cache (HiCache) host pool (no numerics here).

Seam (docs/sglang-seams.md, "Hierarchical cache and PD disaggregation"):
``sglang.srt.mem_cache.pool_host.dsa.make_dsa_indexer_pool_decl`` (AROUND). SGLang
declares the host pool of a DSA pool's index keys there (the target's, and a
separate MTP/EAGLE draft's as ``PoolName.DRAFT_INDEXER``), sized per token by
``dsa_indexer_bytes_per_token_per_layer`` (132 bytes: the FP8 layout). For a
pool that holds ``Fp4IndexKeyCache`` the declaration's ``HostPoolStorageInfo``
says 68 bytes per token per layer instead, so ``DSAIndexerPoolHost`` allocates
one host page of ``64 x 68`` bytes per layer and its copies move one device
row (one 64-token FP4 page) per page. Everything else is SGLang's: the layers
it keeps (no host layer for a skip-top-k layer's empty buffer; one tail layer
per packed MTP draft pool), the layouts and the transfer kernels, which copy
whole pages as bytes.
"""

from __future__ import annotations

import msgspec
from sglang.srt.mem_cache.hicache_storage import PoolName
from sglang.srt.mem_cache.pool_host.host_pool_decl import HostPoolStorageInfo

from .kv_pool import fp4_active, is_fp4_pool
from .seams import passthrough_around

__all__ = ["host_bytes_per_token_per_layer", "make_dsa_indexer_pool_decl"]


def host_bytes_per_token_per_layer(pool) -> int:
    """Bytes per token and layer of the host copy of ``pool``'s FP4 index keys: one device row over its slots.

    A row of the FP4 cache (``Fp4IndexKeyCache.row_bytes``: ``pages_per_row x 64 x 68`` bytes) holds the
    keys of ``pool.page_size`` slots; SGLang's host pool copies one row per host page.

    Args:
        pool: a DSA KV pool whose ``index_key_cache`` is an ``Fp4IndexKeyCache``.

    Raises:
        ValueError: ``pool`` does not hold the FP4 cache, or its row does not split evenly over
            ``pool.page_size`` slots.
    """
    if not is_fp4_pool(pool):
        raise ValueError(f"pool: expected a DSA pool holding the FP4 index-key cache, got {type(pool).__name__}")
    row_bytes = pool.index_key_cache.row_bytes
    if row_bytes % pool.page_size:
        raise ValueError(f"pool: an FP4 index row of {row_bytes} bytes does not split over page_size="
                         f"{pool.page_size} slots")
    return row_bytes // pool.page_size


@passthrough_around(fp4_active)
def make_dsa_indexer_pool_decl(original, pool, *, name=PoolName.INDEXER):
    """AROUND hook of ``pool_host.dsa.make_dsa_indexer_pool_decl``: an FP4 pool's host pool holds 68-byte tokens.

    SGLang's declaration with only its ``storage_info`` replaced (same dtype, uint8); a pool without the
    FP4 cache keeps SGLang's declaration as it is.
    """
    decl = original(pool, name=name)
    if not is_fp4_pool(pool):
        return decl
    storage = HostPoolStorageInfo(bytes_per_token_per_layer=host_bytes_per_token_per_layer(pool),
                                  dtype=decl.storage_info.dtype)
    return msgspec.structs.replace(decl, storage_info=storage)
