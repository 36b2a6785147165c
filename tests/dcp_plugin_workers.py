"""Worker processes of tests/test_plugin_dcp.py: the hooked SGLang ``Indexer`` on W sharded FP4 pools (gloo).

Each rank publishes SGLang's runtime context as DCP rank ``rank`` of ``W``
(``published_topology``), builds the real ``DSATokenToKVPool`` through the
hooked ``_build_dsa_kv_pool`` with ``--enable-fp4-indexer
--fp4-indexer-dcp-shard`` (a ``ShardedFp4IndexKeyCache``), stores every key
through the hooked ``_store_index_k_cache`` with global slots, and runs the
hooked ``_get_topk_paged`` (decode, target verify, init/local masks) and
``_get_topk_ragged`` (prefill) with real ``DSAMetadata`` / ``DSAIndexerMetadata``
and SGLang's torch top-k (helpers of tests/test_plugin_indexer.py). Oracles:
the core ops on one unsharded cache holding every key (``store_index_k``,
``paged_logits``, ``gather_index_k``) and ``reference.topk_reference`` /
``reference.ragged_logits_reference``.

Keys are exact (E2M1 grid, ``dcp_workers._exact_keys``) so logits are exact
and compared with ``torch.equal``; ties are frequent. SGLang's top-k over the
logits the sharded path hands it (only the merged top-k finite) selects the
merged set, which must equal the exact top-k set of the unsharded logits.
"""

from __future__ import annotations

import datetime
import os


def run(rank: int, world_size: int, init_file: str) -> None:
    """Entry point of one rank (``torch.multiprocessing.spawn`` target)."""
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ["SGLANG_PLUGINS"] = "fp4_indexer"
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=300))
    try:
        _run(rank, world_size)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _sets(idx):
    return [sorted(int(x) for x in row if x >= 0) for row in idx]


def _run(rank, world):
    import torch
    import torch.distributed as dist
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool
    from sglang.srt.server_args import prepare_server_args

    from dcp_workers import _exact_keys
    from plugin_support import DSV32, H200, load, published, stand_in_kvc
    from sglang_fp4_indexer import dcp
    from sglang_fp4_indexer.ops.gather import gather_index_k
    from sglang_fp4_indexer.ops.paged_logits import paged_logits
    from sglang_fp4_indexer.ops.quantize import store_index_k
    from sglang_fp4_indexer.pool import allocate_index_k_cache
    from sglang_fp4_indexer.reference import expand_context_lens, paged_slots, ragged_logits_reference, topk_reference
    from sglang_fp4_indexer.sglang_plugin import dcp_modes
    from sglang_fp4_indexer.sglang_plugin import facts
    from test_plugin_indexer import TOPK, _batch, _forward, _indexer, _metadata

    load()
    facts.device_facts = lambda *a, **k: H200
    heads = 32
    with published(page_size=64, dcp_size=world, tp_size=world, ranks={"world_rank": rank}):
        sa = prepare_server_args(["--model-path", "dummy", "--enable-fp4-indexer", "--fp4-indexer-dcp-shard"])
        pool = KVCacheConfigurator._build_dsa_kv_pool(
            stand_in_kvc(DSV32, sa, num_layers=1), max_total_num_tokens=15 * 64, max_running_requests=8,
            dsa_pool_class=DSATokenToKVPool,
        )
        assert dcp_modes.is_sharded(pool)
        pool.index_key_cache.group = dist.group.WORLD  # stands for SGLang's dcp_group.device_group

        lens = [1, 3, 150, 300]  # a request entirely on rank 0, one shorter than W... uneven lengths
        g = torch.Generator().manual_seed(42)
        table, global_pages = dcp.dcp_block_table(lens, world, generator=g)
        full = allocate_index_k_cache(global_pages)
        slots = torch.cat([paged_slots(table[b], n) for b, n in enumerate(lens)])
        keys = _exact_keys(len(slots), g).to(torch.bfloat16)
        ix = _indexer(heads)
        ix.index_topk = TOPK
        with _forward(pool):
            ix._store_index_k_cache(_batch("EXTEND", out_cache_loc=slots), 0, keys, out_cache_loc=slots)
        store_index_k(keys, full, slots)

        def queries(rows, seed):
            gq = torch.Generator().manual_seed(seed)
            q = torch.randint(-4, 5, (rows, heads, 128), generator=gq).float().to(torch.float8_e4m3fn)
            w = torch.exp2(torch.randint(-2, 1, (rows, heads, 1), generator=gq).float())
            return q, w

        def same_on_every_rank(t):
            parts = [torch.empty_like(t) for _ in range(world)]
            dist.all_gather(parts, t.contiguous())
            assert all(torch.equal(p, parts[0]) for p in parts), "ranks disagree"

        # Decode: ctx [B, 1], page table [B, pages].
        ctx = torch.tensor(lens, dtype=torch.int32)
        md = _metadata(cache_seqlens=ctx, seqlens_expanded=ctx, table=table, extend_lens=[1] * len(lens),
                       ctx2d=ctx.view(-1, 1))
        q, w = queries(len(lens), 1)
        with _forward(pool):
            idx = ix._get_topk_paged(_batch("DECODE"), 0, q, w, md)
        unsharded = paged_logits(q, w[:, :, 0], full, table, ctx)
        want = topk_reference(unsharded, TOPK)
        assert _sets(idx) == _sets(want), "decode: sharded top-k set != unsharded"
        fin = torch.isfinite(md.seen[0])
        assert torch.equal(md.seen[0][fin], unsharded[fin]) and int(fin.sum()) == int((want >= 0).sum())
        same_on_every_rank(idx)

        # Target verify next_n 2, SGLang's per-row form (page table repeat-interleaved, ctx [rows, 1]).
        next_n = 2
        per_row = expand_context_lens(ctx.clamp_min(next_n), next_n).to(torch.int32).reshape(-1)
        per_row = torch.minimum(per_row, torch.repeat_interleave(ctx, next_n))
        table_rows = torch.repeat_interleave(table, next_n, dim=0)
        md = _metadata(cache_seqlens=ctx, seqlens_expanded=per_row, table=table_rows,
                       extend_lens=[next_n] * len(lens), ctx2d=per_row.view(-1, 1))
        q, w = queries(len(lens) * next_n, 2)
        with _forward(pool):
            idx = ix._get_topk_paged(_batch("TARGET_VERIFY"), 0, q, w, md)
        unsharded = paged_logits(q, w[:, :, 0], full, table_rows, per_row.view(-1, 1))
        assert _sets(idx) == _sets(topk_reference(unsharded, TOPK)), "verify: sharded top-k set != unsharded"
        same_on_every_rank(idx)

        # Init / local tokens forced in by SGLang's own masking (random keys: no ties at the boundary).
        ix.num_init_tokens, ix.num_local_tokens = 2, 3
        gr = torch.Generator().manual_seed(7)
        rnd = (torch.randn(len(slots), 128, generator=gr) * 3).to(torch.bfloat16)
        with _forward(pool):
            ix._store_index_k_cache(_batch("EXTEND", out_cache_loc=slots), 0, rnd, out_cache_loc=slots)
        store_index_k(rnd, full, slots)
        md = _metadata(cache_seqlens=ctx, seqlens_expanded=ctx, table=table, extend_lens=[1] * len(lens),
                       ctx2d=ctx.view(-1, 1))
        q = (torch.randn(len(lens), heads, 128, generator=gr) * 2).to(torch.float8_e4m3fn)
        w = torch.rand(len(lens), heads, 1, generator=gr)
        with _forward(pool):
            idx = ix._get_topk_paged(_batch("DECODE"), 0, q, w, md)
        ref = paged_logits(q, w[:, :, 0], full, table, ctx)
        ix._mask_init_and_local_tokens(ref, ctx)
        assert _sets(idx) == _sets(topk_reference(ref, TOPK, lengths=ctx)), "masked decode: sharded top-k set != unsharded"
        ix.num_init_tokens = ix.num_local_tokens = 0
        with _forward(pool):  # back to the exact keys for the prefill
            ix._store_index_k_cache(_batch("EXTEND", out_cache_loc=slots), 0, keys, out_cache_loc=slots)
        store_index_k(keys, full, slots)

        # Prefill: the last 3 tokens of each request extend its cached prefix; ks/ke over the flat keys.
        extend = [min(3, n) for n in lens]
        starts = [sum(lens[:b]) for b in range(len(lens))]
        ks = torch.tensor([starts[b] for b in range(len(lens)) for _ in range(extend[b])], dtype=torch.int32)
        pos = torch.tensor([lens[b] - extend[b] + i for b in range(len(lens)) for i in range(extend[b])], dtype=torch.int32)
        ke = ks + pos + 1
        seq = torch.tensor(lens, dtype=torch.int32)
        md = _metadata(cache_seqlens=seq, seqlens_expanded=(pos + 1).to(torch.int32), table=table,
                       extend_lens=extend, ks=ks, ke=ke, indexer_seq_lens=seq,
                       token_to_batch_idx=torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(extend)))
        q, w = queries(int(ks.shape[0]), 3)
        with _forward(pool):
            idx = ix._get_topk_ragged(False, _batch("EXTEND"), 0, q, w, md)
        payload, scales = gather_index_k(full, table, seq, sum(lens), max(lens))
        ref = ragged_logits_reference(q, w[:, :, 0], payload, scales, ks, ke)
        fin = torch.isfinite(ref)
        assert torch.equal(md.seen[0][fin], ref[fin]), "prefill: sharded ragged logits != reference"
        local = torch.full_like(ref, float("-inf"))  # the torch top-k returns window-local positions
        for t in range(ref.shape[0]):
            lo, hi = int(ks[t]), int(ke[t])
            local[t, : hi - lo] = ref[t, lo:hi]
        want = topk_reference(local, TOPK)
        chosen = [sorted(ref[t, int(ks[t]) + torch.tensor(r, dtype=torch.long)].tolist()) for t, r in enumerate(_sets(idx))]
        best = [sorted(ref[t, int(ks[t]) + torch.tensor(r, dtype=torch.long)].tolist()) for t, r in enumerate(_sets(want))]
        assert chosen == best, "prefill: top-k scores differ"  # positions may differ among ties (SGLang's top-k)
        same_on_every_rank(idx)
