"""Store, score and top-k inside SGLang 0.5.23's DSA ``Indexer`` (no numerics here).

Every hook passes SGLang's call through untouched (``*args, **kwargs``)
unless this process holds an FP4 index cache (``pool.fp4_active``, which
reads no SGLang internals). Then it checks the pool the forward runs on
(``get_token_to_kv_pool()``): when it holds the FP4 index-key cache
(``pool.Fp4IndexKeyCache``) the FP4 path runs, otherwise SGLang's own method
runs unchanged. The cache layout, not a flag, decides, so a store and a read
can never disagree about the format.

Seams (docs/sglang-seams.md), all on
``sglang.srt.layers.attention.dsa.dsa_indexer.Indexer``:

- ``_store_index_k_cache``: quantize and write with the store op's launcher
  (``ops.quantize.StoreLauncher``).
- ``_fused_k_prepare_and_store``: SGLang's fused norm+RoPE+FP8-store kernel
  would write FP8 bytes; with FP4 the same norm+RoPE kernel runs without the
  store (SGLang's own fallback branch), SGLang's ``rotate_activation`` rotates
  the key, and it goes through the store above.
- ``_fused_q_prepare_and_store`` and ``_maybe_rotate``: SGLang's fused indexer
  (``use_dsa_indexer_fusion``: interleaved indexer RoPE on CUDA, e.g. GLM-5.x)
  skips the Hadamard rotation of the index queries and keys, which MXFP4 needs
  (one scale per 32 elements). With FP4, ``_maybe_rotate`` always returns
  ``rotate_activation(x)`` (as without fusion), and ``_fused_q_prepare_and_store``
  runs SGLang's own non-kernel branch instead of its fused q kernel:
  ``_get_q_k_bf16`` (rotating through ``_maybe_rotate``), ``act_quant``, the
  store above, ``_scale_head_gates``. So every branch stores rotated keys and
  scores rotated queries: the fused q/k methods (eager, decode CUDA graph, the
  CUDA-graph prefill split op with its ``num_tokens`` slicing, the key-only
  path) and the branches through ``_get_q_k_bf16``.
- ``_get_topk_paged`` (decode, target verify, draft extend): logits from the
  paged scorer's launcher (``ops.paged_logits.paged_scorer``: the Hopper kernel's
  ``ops.sm90.Launcher`` or the Triton ``TritonLauncher``) on the paged FP4 cache
  with the CTA schedule SGLang published in the metadata (ours, see
  ``metadata.py``), then SGLang's own ``_mask_init_and_local_tokens`` and
  ``metadata.topk_transform``.

The launchers were resolved once, when the pool was built
(``kv_pool.serving_kernels``, ``ops.serving.ServingKernels``: which kernel,
its build, its argument layout); a hook looks its launcher up by configuration
and calls it with tensors only, one launch.
- ``_get_topk_ragged`` (prefill / extend): ``ops.gather.gather_index_k`` of the
  batch's keys, ``ops.ragged_logits.ragged_logits`` per row-chunk (SGLang's own
  logits byte budget decides the chunks), SGLang's masking and top-k transform.

Under decode context parallelism with the sharded FP4 index
(``--fp4-indexer-dcp-shard``, ``sglang_plugin/dcp_modes.py``) the store writes only
this rank's slots, the paged path's logits come from the sharded decode top-k
(local scores, one all-gather of candidates, exact merge) and the ragged path
stages the batch's keys from every rank instead of gathering them locally.
"""

from __future__ import annotations

import torch

from . import dcp_modes
from .kv_pool import fp4_active, is_fp4_pool, serving_kernels
from .seams import passthrough_around

__all__ = [
    "paged_scorer_inputs",
    "store_index_k_cache",
    "fused_k_prepare_and_store",
    "fused_q_prepare_and_store",
    "maybe_rotate",
    "get_topk_paged",
    "get_topk_ragged",
]


def _dsa_indexer_module():
    from sglang.srt.layers.attention.dsa import dsa_indexer

    return dsa_indexer


def _current_pool():
    from sglang.srt.model_executor.forward_context import get_token_to_kv_pool

    return get_token_to_kv_pool()


@passthrough_around(fp4_active)
def store_index_k_cache(original, self, forward_batch, layer_id, key, *, act_quant=None, out_cache_loc=None):
    """AROUND hook of ``Indexer._store_index_k_cache``: write ``key`` (bf16 ``[N, 128]``) into the FP4 cache.

    Same slot semantics as SGLang (``out_cache_loc`` defaults to the batch's),
    same layer-ownership checks; slots < 0 are skipped by the store op.
    """
    pool = _current_pool()
    if not is_fp4_pool(pool):
        return original(self, forward_batch, layer_id, key, act_quant=act_quant, out_cache_loc=out_cache_loc)
    if out_cache_loc is None:
        out_cache_loc = forward_batch.out_cache_loc
    if hasattr(pool, "invalidate_index_buffer_for_layer"):
        pool.invalidate_index_buffer_for_layer(layer_id)
    if hasattr(pool, "_is_layer_owned") and not pool._is_layer_owned(layer_id):
        return None
    cache = pool.get_index_k_with_scale_buffer(layer_id=layer_id)
    if dcp_modes.is_sharded(pool):  # DCP-sharded index: this rank writes the slots it owns
        dcp_modes.store(pool.index_key_cache, key, cache, out_cache_loc.contiguous(), pool.index_page_size)
        return None
    if key.dim() != 2 or key.shape[1] != 128 or key.stride(1) != 1:
        raise ValueError(f"key: expected [N, 128] with contiguous rows, got {list(key.shape)} strides {key.stride()}")
    store = serving_kernels(cache.device).store(key.dtype, out_cache_loc.dtype, pool.index_page_size)
    store(key, cache, out_cache_loc.contiguous())  # the launch (ops.quantize.StoreLauncher.__call__)
    return None


@passthrough_around(fp4_active)
def fused_k_prepare_and_store(
    original, self, key_raw, positions, forward_batch, layer_id, act_quant, out_cache_loc=None
):
    """AROUND hook of ``Indexer._fused_k_prepare_and_store``: SGLang's norm + RoPE kernel, its rotation, the FP4 store.

    ``key_raw`` (bf16 ``[N, 128]``, the key columns of ``wk_weights_proj``'s
    output) goes through SGLang's ``fused_k_indexer_norm_rope`` (LayerNorm,
    interleaved RoPE; the kernel of SGLang's own fallback branch), then
    SGLang's ``rotate_activation`` (the Hadamard rotation the fused kernels
    skip), then the hooked ``_store_index_k_cache`` (FP4 store). Returns None,
    as SGLang's method; raises what those calls raise.
    """
    if not is_fp4_pool(_current_pool()):
        return original(self, key_raw, positions, forward_batch, layer_id, act_quant, out_cache_loc=out_cache_loc)
    di = _dsa_indexer_module()
    key = di.fused_k_indexer_norm_rope(
        key_raw,
        self.k_norm.weight,
        self.k_norm.bias,
        self.k_norm.variance_epsilon,
        self._indexer_cos_sin_cache,
        positions,
    )
    key = di.rotate_activation(key)  # the FP4 cache holds rotated keys, as SGLang's unfused indexer stores them
    self._store_index_k_cache(
        forward_batch=forward_batch,
        layer_id=layer_id,
        key=key,
        act_quant=act_quant,
        out_cache_loc=out_cache_loc,
    )
    return None


@passthrough_around(fp4_active)
def fused_q_prepare_and_store(
    original, self, x, q_lora, positions, forward_batch, layer_id, act_quant, *, num_tokens=None,
    enable_dual_stream=True,
):
    """AROUND hook of ``Indexer._fused_q_prepare_and_store``: rotated index queries and keys for the FP4 cache.

    SGLang's method (used while ``use_dsa_indexer_fusion`` is on: interleaved
    indexer RoPE on CUDA) stores the key through ``_fused_k_prepare_and_store``
    and makes the FP8 query with ``fused_q_indexer_rope_first_quant``, whose
    Hadamard step is off. With the FP4 cache this runs SGLang's own branch for
    the same case instead (what its ``forward_cuda`` does when the fused
    kernels are not taken): ``_get_q_k_bf16`` (``wq_b``; ``wk_weights_proj``
    through ``_fused_k_weights``; LayerNorm; RoPE; the hooked ``_maybe_rotate``,
    i.e. SGLang's ``rotate_activation``, on query and key), ``act_quant`` of
    the query, the hooked ``_store_index_k_cache`` of the key, and
    ``_scale_head_gates`` for the head gate.

    Args (SGLang 0.5.23's): ``x`` hidden states ``[T, hidden]`` (bf16),
    ``q_lora`` ``[T, q_lora_rank]``, ``positions`` int ``[T]``, ``act_quant``
    SGLang's FP8 activation quantizer; ``num_tokens`` (CUDA-graph prefill split
    op) keeps the first ``num_tokens`` rows of queries, keys, gates and
    ``forward_batch.out_cache_loc``; ``enable_dual_stream`` is ignored (one stream).

    Returns:
        ``(q_fp8 float8_e4m3fn [T', H, 128], weights fp32 [T', H, 1])`` with
        ``T' = num_tokens`` or ``T``, as SGLang's method.

    Raises:
        What SGLang's calls and the FP4 store raise (e.g. ``ValueError`` for a
        key that is not ``[N, 128]``).
    """
    if not is_fp4_pool(_current_pool()):
        return original(self, x, q_lora, positions, forward_batch, layer_id, act_quant, num_tokens=num_tokens,
                        enable_dual_stream=enable_dual_stream)
    query, key, weights_raw = self._get_q_k_bf16(q_lora, x, positions, False, forward_batch=forward_batch)
    out_cache_loc = forward_batch.out_cache_loc
    if num_tokens is not None:
        query, key, weights_raw = query[:num_tokens], key[:num_tokens], weights_raw[:num_tokens]
        out_cache_loc = out_cache_loc[:num_tokens]
    self._store_index_k_cache(
        forward_batch=forward_batch, layer_id=layer_id, key=key, act_quant=act_quant, out_cache_loc=out_cache_loc
    )
    q_fp8, q_scale = act_quant(query, self.block_size, self.scale_fmt)
    return q_fp8, self._scale_head_gates(weights_raw, q_scale)


@passthrough_around(fp4_active)
def maybe_rotate(original, self, x):
    """AROUND hook of ``Indexer._maybe_rotate``: with the FP4 cache, always SGLang's ``rotate_activation(x)``.

    SGLang's method returns ``x`` unrotated while its fused indexer is on
    (so the keys its fallback branches store match the fused kernels'); the
    FP4 cache needs every branch rotated. Without fusion SGLang's method
    rotates too, so this changes nothing there.

    Args:
        x: bf16 ``[..., 128]`` index queries or keys.

    Returns:
        ``rotate_activation(x)``: same shape and dtype.

    Raises:
        AssertionError: (SGLang's) the last dimension is not a power of two.
    """
    if not is_fp4_pool(_current_pool()):
        return original(self, x)
    return _dsa_indexer_module().rotate_activation(x)


def paged_scorer_inputs(block_tables, seqlens_2d, schedule, rows: int, max_next_n: int):
    """Pick the paged scorer's ``(block_table, context_lens, schedule)`` from SGLang's metadata.

    SGLang hands the paged-MQA path either per-row lengths ``[rows, 1]`` with a
    per-row (repeat-interleaved) page table, or, for target verify (SGLang's
    own form on SM100; the plugin's everywhere else, ``metadata.py``),
    ``[B, next_n]`` lengths whose page table rows repeat ``next_n`` times: then
    the scorer gets one page-table row per request and scores its ``next_n``
    rows in one tile (each key read once per request).
    The published schedule was planned on exactly ``seqlens_2d``, so it is kept
    when the scorer gets that same tensor and dropped (the scorer plans its own)
    otherwise.

    Args:
        block_tables: int ``[>= rows, max_pages]`` page table, one row per query row.
        seqlens_2d: int32 ``[rows, 1]`` or ``[B, next_n]`` (``B * next_n == rows``), or None.
        schedule: the published CTA schedule for ``seqlens_2d``, or None.
        rows: query rows of this call.
        max_next_n: most rows per request the scorer takes in one tile.

    Returns:
        ``(block_table int32 [B', max_pages] with contiguous rows (in the request form a
        row-strided view of ``block_tables``), context_lens int32 contiguous, schedule or None)``.

    Raises:
        ValueError: the page table has fewer rows than the call, or the lengths
            describe another number of rows.
    """
    if block_tables.shape[0] < rows:
        raise ValueError(f"block_tables: {block_tables.shape[0]} rows for {rows} query rows")
    if seqlens_2d is None:
        raise ValueError("seqlens_2d: expected the paged-MQA context lengths, got None")
    if seqlens_2d.numel() != rows:
        raise ValueError(f"seqlens_2d: describes {seqlens_2d.numel()} rows, the call has {rows}")
    table = block_tables[:rows].to(torch.int32)
    if seqlens_2d.dim() == 2 and seqlens_2d.shape[1] > 1:
        next_n = seqlens_2d.shape[1]
        if next_n <= max_next_n:
            # Every request's first row, a row-strided view (the scorers take a row stride): no copy per layer.
            return table[::next_n], seqlens_2d.to(torch.int32).contiguous(), schedule
        # Too many rows per request for one tile: score row by row, own schedule.
        return table.contiguous(), seqlens_2d.reshape(rows, 1).to(torch.int32).contiguous(), None
    return table.contiguous(), seqlens_2d.reshape(rows, 1).to(torch.int32).contiguous(), schedule


@passthrough_around(fp4_active)
def get_topk_paged(original, self, forward_batch, layer_id, q_fp8, weights, metadata):
    """AROUND hook of ``Indexer._get_topk_paged``: FP4 paged logits, then SGLang's masking and top-k.

    Mirrors SGLang 0.5.23's method: lengths are ``get_seqlens_expanded()``
    for target verify and draft extend, ``get_seqlens_int32()`` otherwise; the
    call scores ``sum(get_dsa_extend_len_cpu())`` rows; padding rows of ``q``
    get ``-1`` indices.
    """
    pool = _current_pool()
    if not is_fp4_pool(pool):
        return original(self, forward_batch, layer_id, q_fp8, weights, metadata)
    page_size = pool.index_page_size
    mode = forward_batch.forward_mode
    block_tables = metadata.get_page_table_64()
    width = block_tables.shape[1] * page_size
    cache = self._get_index_k_read_buffer(pool, layer_id)
    if mode.is_target_verify() or mode.is_draft_extend_v2():
        seqlens_32 = metadata.get_seqlens_expanded()
    else:
        seqlens_32 = metadata.get_seqlens_int32()
    rows = int(sum(metadata.get_dsa_extend_len_cpu()))
    if rows == 0:
        logits = torch.empty((0, width), dtype=torch.float32, device=q_fp8.device)
    else:
        seqlens_2d = getattr(metadata, "paged_mqa_ctx_lens_2d", None)
        schedule = getattr(metadata, "paged_mqa_schedule_metadata", None)
        if seqlens_2d is None:
            seqlens_2d, schedule = seqlens_32.reshape(-1, 1), None
        kernels = serving_kernels(cache.device)  # resolved when the pool was built
        table, lens, schedule = paged_scorer_inputs(block_tables, seqlens_2d, schedule, rows, kernels.max_next_n)
        q, w = q_fp8[:rows], weights.reshape(weights.shape[0], -1)[:rows].float()
        if dcp_modes.is_sharded(pool):  # DCP-sharded index: local scores, candidate exchange, merged top-k
            logits = dcp_modes.paged_logits(
                pool.index_key_cache, q, w, cache, table, lens, width=width, topk=self.index_topk,
                page_size=page_size, block_kv=kernels.block_kv,
            )
        else:
            if schedule is None:
                schedule = kernels.plan(lens)
            # As SGLang calls DeepGEMM: clean_logits=False (its top-k masks by length, so no -inf tail to width).
            logits = torch.empty((rows, width), dtype=torch.float32, device=q.device)
            kernels.paged(q.shape[1], lens.shape[1])(q, w, cache, table, lens, schedule, logits)  # the launch
    self._mask_init_and_local_tokens(logits, seqlens_32)
    topk_result = metadata.topk_transform(logits, self.index_topk)
    if rows < q_fp8.shape[0]:
        padding = torch.full(
            (q_fp8.shape[0] - rows, topk_result.shape[1]), -1, dtype=topk_result.dtype, device=topk_result.device
        )
        topk_result = torch.cat([topk_result, padding], dim=0)
    return topk_result


def _rows_per_chunk(self, rows: int, cols: int, device) -> int:
    """Query rows per logits chunk under SGLang's MQA-logits byte budget (all rows when no chunking is needed)."""
    di = _dsa_indexer_module()
    need_chunk, budget = di.mqa_logits_should_chunk(
        num_rows=rows,
        num_cols=cols,
        get_budget_bytes=lambda: self._get_mqa_logits_budget_bytes(device.index),
        rocm=False,
    )
    if not need_chunk:
        return rows
    row_bytes = max(cols * self._MQA_LOGITS_BYTES_PER_ELEM, 1)
    return max(1, min(rows, int(budget // row_bytes)))


@passthrough_around(fp4_active)
def get_topk_ragged(
    original, self, enable_dual_stream, forward_batch, layer_id, q_fp8, weights, metadata, topk_result=None
):
    """AROUND hook of ``Indexer._get_topk_ragged``: FP4 gather + ragged logits, SGLang's masking and top-k.

    Same inputs, chunking rule and top-k calls as SGLang 0.5.23's method;
    ``topk_result`` (a preallocated ``[tokens, index_topk]`` buffer) is filled
    in place when given.
    """
    pool = _current_pool()
    if not is_fp4_pool(pool):
        return original(
            self, enable_dual_stream, forward_batch, layer_id, q_fp8, weights, metadata, topk_result=topk_result
        )
    from ..ops.gather import gather_index_k
    from ..ops.ragged_logits import ragged_logits

    if not forward_batch.forward_mode.is_extend_without_speculative():
        raise ValueError(f"forward_mode: the ragged indexer path takes extend batches, got {forward_batch.forward_mode}")
    weights = weights.reshape(weights.shape[0], -1).float()
    block_tables = metadata.get_logical_page_table()
    token_nums = q_fp8.shape[0]
    device = q_fp8.device
    if topk_result is None:
        topk_result = torch.full((token_nums, self.index_topk), -1, device=device, dtype=torch.int32)
    if len(block_tables) == 0:
        return topk_result

    ks, ke = metadata.get_indexer_kvcache_range()
    lens_cpu = metadata.get_indexer_seq_len_cpu()
    total = int(torch.sum(lens_cpu).item())
    longest = int(torch.max(lens_cpu).item())
    if dcp_modes.is_sharded(pool):  # DCP-sharded index: stage the batch's keys from every rank
        payload, scales = dcp_modes.gather(
            pool.index_key_cache, self._get_index_k_read_buffer(pool, layer_id),
            block_tables.to(torch.int32).contiguous(), metadata.get_indexer_seq_len().contiguous(), lens_cpu,
            page_size=pool.index_page_size,
        )
    else:
        payload, scales = gather_index_k(
            self._get_index_k_read_buffer(pool, layer_id),
            block_tables.to(torch.int32).contiguous(),
            metadata.get_indexer_seq_len().contiguous(),
            total,
            longest,
            page_size=pool.index_page_size,
            check=False,
        )
    seq_lens_expanded = metadata.get_seqlens_expanded()
    rows = ks.shape[0]
    ks32, ke32 = ks.to(torch.int32).contiguous(), ke.to(torch.int32).contiguous()
    step = _rows_per_chunk(self, rows, total, device)

    if step >= rows:
        logits = ragged_logits(
            q_fp8[:rows], weights[:rows], payload, scales, ks32, ke32, clean_logits=False, check=False
        )
        self._mask_init_and_local_tokens(logits, seq_lens_expanded, ks)
        topk_result[:rows] = metadata.topk_transform(logits, self.index_topk, ks=ks)
        return topk_result

    global_offset = metadata.attn_metadata.topk_indices_offset
    token_to_batch_idx = metadata.get_token_to_batch_idx()
    ones = torch.ones(rows, dtype=torch.int32, device=device) if global_offset is None else None
    for start in range(0, rows, step):
        end = min(start + step, rows)
        logits = ragged_logits(
            q_fp8[start:end], weights[start:end], payload, scales, ks32[start:end], ke32[start:end],
            clean_logits=False, check=False,
        )
        lengths = seq_lens_expanded[start:end]
        self._mask_init_and_local_tokens(logits, lengths, ks[start:end])
        if global_offset is not None:  # RAGGED top-k: offsets into the flat keys
            chunk = metadata.topk_transform(
                logits, self.index_topk, ks=ks[start:end], ke_offset=lengths,
                topk_indices_offset_override=global_offset[start:end],
            )
        else:  # PAGED top-k: each token a length-1 sequence of its request
            chunk = metadata.topk_transform(
                logits, self.index_topk, ks=ks[start:end], cu_seqlens_q=ones[start:end], ke_offset=lengths,
                batch_idx_list=token_to_batch_idx[start:end],
            )
        topk_result[start:end] = chunk
    return topk_result
