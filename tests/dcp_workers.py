"""Worker processes of tests/test_dcp.py: real ``torch.distributed`` (gloo) ranks on the CPU.

Each scenario runs in ``W`` processes started by ``torch.multiprocessing.spawn``
(``TRITON_INTERPRET=1`` in each). Every rank builds the same global case from
a seed, stores its share of the keys with ``dcp.store_index_k_sharded``, and
checks the sharded paths against single-process oracles computed in the same
process on the unsharded cache:

- decode / verify: ``dcp.sharded_decode_topk`` == ``reference.topk_reference``
  of the unsharded ``paged_logits`` (and of ``paged_logits_reference``), its
  scores == the reference logits at those positions, identical on every rank;
- prefill: ``dcp.stage_index_k`` planes == ``ops.gather.gather_index_k`` of the
  unsharded cache byte for byte (and == ``format.quantize_index_k`` of the keys);
  ``dcp.sharded_ragged_logits`` == ``reference.ragged_logits_reference``.

Exact cases use keys on the E2M1 grid with power-of-two group scales, small
integer e4m3 queries and power-of-two weights: every product and partial sum
is a multiple of 2**-5 below 2**19, so fp32 holds each logit exactly in any
summation order, kernel logits equal the reference bit for bit, and many keys
tie (drawn from a pool of 6 distinct keys) so the tie rule is exercised.

This module imports nothing from ``sglang_fp4_indexer.ops`` at import time:
the ``patched`` scenario replaces ``pool.scale_row`` by a non-identity row
permutation *before* the ops are imported (their Triton form of ``scale_row``
is built from ``pool.scale_row`` at import), so the kernels and the torch
oracles all use the permuted scale-plane layout.
"""

from __future__ import annotations

import datetime
import os


def scale_row(row, page_size: int = 64):
    """The ``patched`` scenario's ``pool.scale_row``: a non-identity scale-plane layout.

    The scales of page row ``r`` live at scale row ``page_size - 1 - r``. Named
    ``scale_row`` because Triton's interpreter re-reads a jit function's source
    and looks the function up by the name it was built under.
    """
    return page_size - 1 - row


def run(rank: int, world_size: int, init_file: str, scenario: str) -> None:
    """Entry point of one rank (``torch.multiprocessing.spawn`` target)."""
    os.environ["TRITON_INTERPRET"] = "1"
    if scenario == "patched":
        from sglang_fp4_indexer import pool

        pool.scale_row = scale_row
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size,
        timeout=datetime.timedelta(seconds=120),
    )
    try:
        if scenario == "patched":
            _check_layout_is_permuted(rank, world_size)
            _prefill(rank, world_size, seed=31, lens=[1, world_size - 1, 70, 200])
        elif scenario == "decode":
            _decode_exact(rank, world_size)
            _decode_random(rank, world_size)
        elif scenario == "prefill":
            _prefill(rank, world_size, seed=17, lens=[1, world_size - 1, 0, 130, 257])
        else:
            raise ValueError(f"scenario: unknown {scenario!r}")
        dist.barrier()
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------------------
# Case construction (the same on every rank: seeded)
# ---------------------------------------------------------------------------


def _exact_keys(n: int, g, pool_size: int = 6):
    """``n`` keys drawn from ``pool_size`` distinct keys on the E2M1 grid (exact under MXFP4)."""
    import torch

    from sglang_fp4_indexer.format import E2M1_MAGNITUDES

    mags = torch.tensor(E2M1_MAGNITUDES)
    codes = torch.randint(0, 8, (pool_size, 4, 32), generator=g)
    codes[:, :, 0] = 7  # each group reaches 6 * 2**e, so its scale is exactly 2**e
    signs = torch.where(torch.rand(pool_size, 4, 32, generator=g) < 0.5, -1.0, 1.0)
    exps = torch.randint(-2, 1, (pool_size, 4, 1), generator=g).float()
    distinct = (mags[codes] * signs * torch.exp2(exps)).reshape(pool_size, 128)
    return distinct[torch.randint(0, pool_size, (n,), generator=g)]


class _Case:
    """A global DCP case: block table, slots, keys, the unsharded cache and this rank's local cache."""

    def __init__(self, rank, world_size, lens, seed, exact):
        import torch

        from sglang_fp4_indexer import dcp
        from sglang_fp4_indexer.ops.quantize import store_index_k
        from sglang_fp4_indexer.pool import allocate_index_k_cache
        from sglang_fp4_indexer.reference import paged_slots

        g = torch.Generator().manual_seed(seed)
        self.lens = list(lens)
        self.table, global_pages = dcp.dcp_block_table(lens, world_size, spare_logical_pages=2, generator=g)
        self.slots = [paged_slots(self.table[b], n) for b, n in enumerate(lens)]
        total = sum(lens)
        if exact:
            self.keys = _exact_keys(total, g)
        else:
            self.keys = torch.randn(total, 128, generator=g) * torch.exp(torch.randn(total, 1, generator=g))
        flat_slots = torch.cat(self.slots) if self.slots else torch.zeros(0, dtype=torch.int64)
        self.flat_slots = flat_slots
        self.full = allocate_index_k_cache(global_pages)
        self.local = allocate_index_k_cache(global_pages // world_size)
        # Store in two chunks (a prefill and later tokens), both through the ops.
        half = total // 2
        for lo, hi in ((0, half), (half, total)):
            if hi > lo:
                store_index_k(self.keys[lo:hi], self.full, flat_slots[lo:hi])
                dcp.store_index_k_sharded(self.keys[lo:hi], self.local, flat_slots[lo:hi], world_size, rank)


def _queries(rows, heads, g, exact):
    import torch

    if exact:
        q = torch.randint(-4, 5, (rows, heads, 128), generator=g).float().to(torch.float8_e4m3fn)
        w = torch.exp2(torch.randint(-2, 1, (rows, heads), generator=g).float())
    else:
        q = (torch.randn(rows, heads, 128, generator=g) * 2).to(torch.float8_e4m3fn)
        w = torch.rand(rows, heads, generator=g) * heads**-0.5
    return q, w


def _same_on_every_rank(t, world_size):
    import torch
    import torch.distributed as dist

    parts = [torch.empty_like(t) for _ in range(world_size)]
    dist.all_gather(parts, t.contiguous())
    for r, p in enumerate(parts):
        assert torch.equal(p, parts[0]), f"rank {r}'s merged top-k differs from rank 0's"


# ---------------------------------------------------------------------------
# Scenarios
# ---------------------------------------------------------------------------


def _check_written_share(case, rank, world_size):
    """This rank's local cache holds exactly its owned keys, scales at ``pool.scale_row`` (write side)."""
    import torch

    from sglang_fp4_indexer import dcp
    from sglang_fp4_indexer.format import quantize_index_k
    from sglang_fp4_indexer.pool import read_index_k

    owned = dcp.owner_rank(case.flat_slots, world_size) == rank
    local = dcp.local_slot(case.flat_slots[owned], world_size)
    payload, scales = read_index_k(case.local, local)
    want_p, want_s = quantize_index_k(case.keys[owned])
    assert torch.equal(payload, want_p), "local payload rows differ from the owned keys"
    assert torch.equal(scales, want_s), "local scale rows (read through pool.scale_row) differ from the owned keys"
    return owned


def _decode_exact(rank, world_size):
    import torch

    from sglang_fp4_indexer import dcp
    from sglang_fp4_indexer.ops.paged_logits import paged_logits
    from sglang_fp4_indexer.reference import paged_logits_reference, topk_reference

    heads = 16
    # lengths < W, a request whose keys all live on rank 0 (length 1), uneven lengths over page edges.
    lens = [1, world_size - 1, 5, 64 * world_size + 3, 300]
    case = _Case(rank, world_size, lens, seed=5, exact=True)
    _check_written_share(case, rank, world_size)
    g = torch.Generator().manual_seed(6)
    table = case.table
    lens_t = torch.tensor(lens, dtype=torch.int32)
    forms = [
        ("decode [B]", 1, lens_t),
        ("verify [B], next_n 2", 2, lens_t),
        ("verify [B, next_n], zero-length rows", 3, torch.tensor(
            [[0, 1, 1], [0, 0, world_size - 1], [3, 4, 5], [64 * world_size + 1, 64 * world_size + 2, 64 * world_size + 3], [298, 299, 300]],
            dtype=torch.int32)),
    ]
    for topk in (4, 16, 64):
        buffers = dcp.CandidateBuffers(16, topk, world_size)
        for name, next_n, ctx in forms:
            rows = len(lens) * next_n
            q, w = _queries(rows, heads, g, exact=True)
            got = dcp.sharded_decode_topk(
                q, w, case.local, table, ctx, topk=topk, world_size=world_size, rank=rank, buffers=buffers,
                block_kv=64,
            )
            ref = paged_logits_reference(q, w, case.full, table, ctx)
            unsharded = paged_logits(q, w, case.full, table, ctx, block_kv=64)
            assert torch.equal(unsharded, ref), f"{name}: unsharded kernel logits are not exact"
            want = topk_reference(unsharded, topk)
            assert torch.equal(got.positions, want), f"{name}, topk {topk}: sharded top-k != single-process top-k"
            assert torch.equal(topk_reference(ref, topk), want)
            sel = want.clamp_min(0).long()
            want_scores = torch.where(want >= 0, ref.gather(1, sel), torch.full_like(ref[:, :1], float("-inf")))
            assert torch.equal(got.scores, want_scores), f"{name}: merged scores != reference logits"
            scattered = dcp.scatter_topk_logits(got.positions, got.scores, ref.shape[1])
            assert torch.equal(topk_reference(scattered, topk), want), f"{name}: scattered logits reselect differently"
            _same_on_every_rank(got.positions, world_size)
    # Ties really occur (keys drawn from 6 distinct ones): the tie rule was exercised.
    row = ref[-1, :300]
    assert row.unique().numel() < 300


def _decode_random(rank, world_size):
    import torch

    from sglang_fp4_indexer import dcp
    from sglang_fp4_indexer.ops.paged_logits import paged_logits
    from sglang_fp4_indexer.reference import paged_logits_reference, topk_reference

    lens = [2, 150, 333]
    case = _Case(rank, world_size, lens, seed=9, exact=False)
    g = torch.Generator().manual_seed(10)
    q, w = _queries(len(lens), 32, g, exact=False)
    ctx = torch.tensor(lens, dtype=torch.int32)
    buffers = dcp.CandidateBuffers(len(lens), 32, world_size)
    got = dcp.sharded_decode_topk(q, w, case.local, case.table, ctx, topk=32, world_size=world_size, rank=rank, buffers=buffers)
    unsharded = paged_logits(q, w, case.full, case.table, ctx)
    assert torch.equal(got.positions, topk_reference(unsharded, 32)), "random keys: sharded top-k != single-process"
    ref = paged_logits_reference(q, w, case.full, case.table, ctx)
    sel = got.positions.clamp_min(0).long()
    ok = got.positions >= 0
    # Same tolerance as tests/test_paged_logits.py: exact products, fp32 sums of at most 32 + 4 + H + 2 terms.
    err = (got.scores.double() - ref.gather(1, sel).double()).abs()
    assert bool(ok.all()) == (min(lens) >= 32) and bool(ok.any())
    assert torch.all((err <= 2e-5 * _abs_bound(q, w, case, ctx).gather(1, sel).double())[ok]), "scores off the reference"
    _same_on_every_rank(got.positions, world_size)


def _abs_bound(q, w, case, ctx):
    """``sum_h |w| sum_d |q k|`` per (row, column): the fp32 summation error bound's scale."""
    import torch

    from sglang_fp4_indexer.format import dequantize_index_k
    from sglang_fp4_indexer.pool import read_index_k

    width = case.table.shape[1] * 64
    out = torch.zeros(q.shape[0], width, dtype=torch.float32)
    for r, n in enumerate(ctx.tolist()):
        k = dequantize_index_k(*read_index_k(case.full, case.slots[r][:n])).abs().double()
        out[r, :n] = ((k @ q[r].double().abs().t()) @ w[r].double().abs()).float()
    return out


def _prefill(rank, world_size, seed, lens):
    import torch

    from sglang_fp4_indexer import dcp
    from sglang_fp4_indexer.format import quantize_index_k
    from sglang_fp4_indexer.ops.gather import gather_index_k
    from sglang_fp4_indexer.reference import ragged_logits_reference

    case = _Case(rank, world_size, lens, seed=seed, exact=True)
    _check_written_share(case, rank, world_size)
    seq = torch.tensor(lens, dtype=torch.int32)
    total = sum(lens)
    buffers = dcp.StagingBuffers(total, len(lens), world_size)
    payload, scales = dcp.stage_index_k(
        case.local, case.table, seq, lens, world_size=world_size, rank=rank, buffers=buffers
    )
    want_p, want_s = gather_index_k(case.full, case.table, seq, total, max(lens))
    assert torch.equal(payload, want_p), "staged payload plane != single-process gather"
    assert torch.equal(scales, want_s), "staged scale plane != single-process gather"
    exact_p, exact_s = quantize_index_k(case.keys)
    assert torch.equal(payload, exact_p) and torch.equal(scales, exact_s), "staged planes != the quantized keys"
    # Ragged scoring of the staged planes: each request's extend tokens see a causal window of its keys.
    g = torch.Generator().manual_seed(seed + 1)
    ks, ke = [], []
    start = 0
    for n in lens:
        for t in range(min(n, 3)):
            ks.append(start)
            ke.append(start + n - t)
        start += n
    ks_t = torch.tensor(ks, dtype=torch.int32)
    ke_t = torch.tensor(ke, dtype=torch.int32)
    q, w = _queries(len(ks), 16, g, exact=True)
    logits = dcp.sharded_ragged_logits(
        q, w, case.local, case.table, seq, lens, ks_t, ke_t, world_size=world_size, rank=rank, buffers=buffers
    )
    ref = ragged_logits_reference(q, w, exact_p, exact_s, ks_t, ke_t)
    assert torch.equal(logits, ref), "sharded ragged logits != reference"


def _check_layout_is_permuted(rank, world_size):
    """The patched layout really moves scale rows: a plain-row read of the local cache gets other bytes."""
    import torch

    from sglang_fp4_indexer import pool
    from sglang_fp4_indexer.ops import _common

    assert pool.scale_row is scale_row and _common.scale_row_jit.fn.__code__ is scale_row.__code__
    case = _Case(rank, world_size, [40, 90], seed=3, exact=True)
    owned = _check_written_share(case, rank, world_size)
    from sglang_fp4_indexer import dcp
    from sglang_fp4_indexer.format import quantize_index_k

    local = dcp.local_slot(case.flat_slots[owned], world_size)
    page, row = local // 64, local % 64
    plain = pool.scale_plane(case.local)[page, row]  # the bug this test guards against
    assert not torch.equal(plain, quantize_index_k(case.keys[owned])[1]), "the permuted layout is not exercised"
