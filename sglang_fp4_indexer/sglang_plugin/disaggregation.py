"""The FP4 index-key cache under SGLang 0.5.23's PD disaggregation: both servers must hold the same format.

What moves needs nothing from the plugin: SGLang's ``setup_state_kv_args``
(``disaggregation/utils.py``) describes a DSA pool's index buffers to the
transfer engine through ``get_state_buf_infos()`` (the draft pool's appended),
which ``IndexKeyCache.state_buf_infos`` fills from the buffers themselves: an
FP4 pool reports its 68-byte rows (``64 x 68`` bytes per page and layer).

What the plugin adds is the agreement. A prefill server registers with its
bootstrap server, and a decode server reads that record the first time it
meets the prefill (``CommonKVManager.try_ensure_parallel_info``), where SGLang
refuses a different ``kv_cache_dtype`` in one line naming both sides' values.
Seam: ``sglang.srt.disaggregation.common.conn.CommonKVManager.__init__``
(AROUND). In a process holding the FP4 cache, the ``kv_cache_dtype_str`` of
the ``KVArgs`` it is given names the index-key format as well
(``published_kv_cache_dtype``) before SGLang copies it into the manager and the
prefill registers it, so a pair where only one server holds FP4 index keys (in
either direction, and whether or not the other server has the plugin) stops at
that check, before any page is transferred. A server without FP4 publishes
SGLang's own value.
"""

from __future__ import annotations

from .kv_pool import fp4_active
from .seams import passthrough_around

__all__ = ["INDEX_KEYS_NOTE", "published_kv_cache_dtype", "kv_manager_init"]

#: What a server holding the FP4 index-key cache appends to the KV cache dtype it publishes to its PD peer.
INDEX_KEYS_NOTE = " with MXFP4 index keys (--enable-fp4-indexer)"


def published_kv_cache_dtype(kv_cache_dtype: str) -> str:
    """The KV cache dtype a PD server holding FP4 index keys publishes: SGLang's value with ``INDEX_KEYS_NOTE``.

    Args:
        kv_cache_dtype: SGLang's ``KVArgs.kv_cache_dtype_str`` (e.g. ``"auto"``, ``"fp8_e4m3"``); returned
            unchanged when it already carries the note.

    Raises:
        TypeError: ``kv_cache_dtype`` is not a string.
    """
    if not isinstance(kv_cache_dtype, str):
        raise TypeError(f"kv_cache_dtype: expected a str, got {type(kv_cache_dtype).__name__}")
    return kv_cache_dtype if kv_cache_dtype.endswith(INDEX_KEYS_NOTE) else kv_cache_dtype + INDEX_KEYS_NOTE


@passthrough_around(fp4_active)
def kv_manager_init(original, self, args, disaggregation_mode, server_args, is_mla_backend=False):
    """AROUND hook of ``CommonKVManager.__init__``: a server holding the FP4 cache publishes its index-key format.

    Sets ``args.kv_cache_dtype_str`` to ``published_kv_cache_dtype`` of it, then runs SGLang's constructor
    (which copies it, registers it with the bootstrap server on a prefill server, and compares it with the
    prefill's on a decode server).
    """
    args.kv_cache_dtype_str = published_kv_cache_dtype(args.kv_cache_dtype_str)
    return original(self, args, disaggregation_mode, server_args, is_mla_backend)
