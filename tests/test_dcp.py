"""DCP for the FP4 index-key cache (sglang_fp4_indexer/dcp/).

Single-process tests of the owner rule, page math, capacity and candidate
packing, and real multi-process tests (``torch.distributed`` with gloo, W = 2
and 4 ranks, kernels under ``TRITON_INTERPRET=1``) of the sharded decode top-k
and the prefill staging: the checks live in ``tests/dcp_workers.py``.
"""

from __future__ import annotations

import os
from fractions import Fraction

import pytest
import torch
import torch.multiprocessing as mp

import dcp_workers
from sglang_fp4_indexer import dcp
from sglang_fp4_indexer.pool import DEEPSEEK_V32_FP8_MLA_KV_BYTES
from sglang_fp4_indexer.reference import paged_slots, topk_reference

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


# ---------------------------------------------------------------------------
# Owner rule and page math
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("world_size", [1, 2, 4, 8])
def test_owner_rule_and_local_tables(world_size):
    """Every position j of a request lives on rank j % W at local key j // W, read through local_block_table."""
    lens = [1, world_size - 1 if world_size > 1 else 0, 64 * world_size + 5, 700]
    g = torch.Generator().manual_seed(world_size)
    table, global_pages = dcp.dcp_block_table(lens, world_size, spare_logical_pages=3, generator=g)
    dcp.check_block_table_layout(table, torch.tensor(lens), world_size)
    local_table = dcp.local_block_table(table, world_size)
    assert local_table.dtype == torch.int32 and local_table.shape[1] == -(-table.shape[1] // world_size)
    for b, n in enumerate(lens):
        slots = paged_slots(table[b], n)
        owner = dcp.owner_rank(slots, world_size)
        j = torch.arange(n)
        assert torch.equal(owner, j % world_size)
        local = dcp.local_slot(slots, world_size)
        assert n == 0 or int(local.max()) < global_pages // world_size * 64
        for r in range(world_size):
            count = int(dcp.local_context_lens(torch.tensor([n]), world_size, r)[0, 0])
            assert count == int((owner == r).sum())
            # local key i of rank r is global position i * W + r, at local slot local_table row page/row
            mine = local[owner == r]
            assert torch.equal(paged_slots(local_table[b], count), mine)
            assert torch.equal(j[owner == r], torch.arange(count) * world_size + r)


def test_local_store_slots_and_num_slots():
    s = torch.tensor([0, 1, 2, 3, 7, -1, 12], dtype=torch.int64)
    assert dcp.local_store_slots(s, 4, 3).tolist() == [-1, -1, -1, 0, 1, -1, -1]
    assert dcp.local_store_slots(s, 4, 0).tolist() == [0, -1, -1, -1, -1, -1, 3]
    out = torch.empty_like(s)
    assert dcp.local_store_slots(s, 4, 0, out=out) is out
    assert [dcp.local_num_slots(10, 4, r) for r in range(4)] == [3, 3, 2, 2]
    assert dcp.local_num_slots(0, 3) == 0


def test_local_context_lens_forms():
    # [B] form with next_n 3: row i sees ctx - 3 + i + 1 keys (clamped at 0).
    got = dcp.local_context_lens(torch.tensor([1, 9], dtype=torch.int32), 2, 1, next_n=3)
    assert got.tolist() == [[0, 0, 0], [3, 4, 4]]
    got = dcp.local_context_lens(torch.tensor([[0, 1], [5, 8]], dtype=torch.int32), 4, 0, next_n=2)
    assert got.tolist() == [[0, 1], [2, 2]]


def test_layout_check_names_the_request():
    table, _ = dcp.dcp_block_table([200, 300], 2)
    table[1, 1] += 2
    with pytest.raises(ValueError, match="request 1"):
        dcp.check_block_table_layout(table, torch.tensor([200, 300]), 2)
    with pytest.raises(ValueError, match="needs"):
        dcp.check_block_table_layout(table[:, :1], torch.tensor([200, 300]), 2)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: dcp.owner_rank(torch.tensor([1.0]), 2), "slots: expected int32 or int64"),
        (lambda: dcp.owner_rank([1], 2), "slots: expected a torch.Tensor"),
        (lambda: dcp.local_slot(torch.tensor([1]), 0), "world_size"),
        (lambda: dcp.local_store_slots(torch.tensor([1]), 2, 2), "rank"),
        (lambda: dcp.local_block_table(torch.zeros(3, dtype=torch.int32), 2), "block_table"),
        (lambda: dcp.local_context_lens(torch.tensor([1]), 2, 0, next_n=0), "next_n"),
        (lambda: dcp.bytes_per_token(8, index="fp6"), "index"),
        (lambda: dcp.bytes_per_token(8, mode="split"), "mode"),
        (lambda: dcp.CandidateBuffers(0, 8, 2), "max_rows"),
        (lambda: dcp.CandidateBuffers(4, 8, 2).views(5), "rows: 5"),
        (lambda: dcp.StagingBuffers(10, 0, 2), "max_requests"),
        (lambda: dcp.merge_candidates(torch.zeros(2, 3, 4, dtype=torch.int64), 9), "topk"),
        (lambda: dcp.pack_candidates(torch.zeros(3, dtype=torch.float64), torch.zeros(3, dtype=torch.int64)), "scores"),
        (lambda: dcp.scatter_topk_logits(torch.zeros(2, 3, dtype=torch.int64), torch.zeros(2, 3), 0), "width"),
    ],
)
def test_bad_input_names_the_argument(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


# ---------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------


def test_bytes_per_token_deepseek_v32_dcp8():
    """W = 8, FP8 MLA KV: 214 B (SGLang) -> 150 replicated (+43 %) -> 90.5 sharded (+136 %)."""
    kv = DEEPSEEK_V32_FP8_MLA_KV_BYTES
    assert kv == 656 and Fraction(kv, 8) == 82
    fp8 = dcp.bytes_per_token(8, index="fp8", mode="replicated")
    rep = dcp.bytes_per_token(8, index="fp4", mode="replicated")
    shard = dcp.bytes_per_token(8, index="fp4", mode="sharded")
    assert (fp8, rep, shard) == (214, 150, Fraction(181, 2))
    assert int(shard) == 90
    assert round(100 * (fp8 / rep - 1)) == 43
    assert round(100 * (fp8 / shard - 1)) == 136
    assert dcp.bytes_per_token(1, mode="sharded") == dcp.bytes_per_token(1) == 656 + 68


def test_dcp_capacity_matches_exact_division():
    mem = 70 * 2**30
    cap = dcp.dcp_capacity(mem, 8, num_layers=61)
    for tokens, per_layer in (
        (cap.tokens_fp8, Fraction(214)), (cap.tokens_fp4_replicated, Fraction(150)), (cap.tokens_fp4_sharded, Fraction(181, 2)),
    ):
        assert tokens == int(Fraction(mem) / (61 * per_layer))
    assert round(100 * cap.gain_replicated) == 43 and round(100 * cap.gain_sharded) == 136
    # Fewer index layers (shared top-k layers) shrink every index term alike.
    few = dcp.dcp_capacity(mem, 8, num_layers=61, num_index_layers=21)
    assert few.tokens_fp8 == int(Fraction(mem) / (61 * 82 + 21 * 132))


# ---------------------------------------------------------------------------
# Candidate packing and merging (single process)
# ---------------------------------------------------------------------------


def test_pack_order_is_score_then_lower_position():
    scores = torch.tensor([1.0, -0.0, 0.0, float("-inf"), -2.5, 3e38, 1.0, -1e-40, 7.0])
    pos = torch.tensor([5, 7, 3, 2, 1, 8, 4, 6, 0])
    keys = dcp.pack_candidates(scores, pos)
    order = torch.argsort(keys, descending=True)
    row = torch.empty(9)
    row[pos] = scores  # the same scores laid out by position; every column competes (-inf included)
    want = topk_reference(row[None], 9, lengths=torch.tensor([9]))[0]
    assert torch.equal(pos[order], want.long())
    p, s = dcp.unpack_candidates(keys)
    assert torch.equal(p, pos.to(torch.int32))
    assert torch.equal(s, scores + 0.0) and not torch.signbit(s[1])  # -0.0 is stored as +0.0
    pad = dcp.pack_candidates(scores, pos, torch.zeros(9, dtype=torch.bool))
    assert torch.all(pad == dcp.PAD_KEY) and bool((keys > dcp.PAD_KEY).all())
    p, s = dcp.unpack_candidates(pad)
    assert torch.all(p == -1) and torch.all(s == float("-inf"))


def test_merge_equals_global_topk_with_ties():
    """Local top-k per rank then merge == top-k of the whole row (ties to the lower position)."""
    g = torch.Generator().manual_seed(0)
    world, rows, width, k = 4, 5, 37, 6
    logits = torch.randint(-3, 4, (rows, width), generator=g).float()  # many ties
    logits[1, 20:] = float("-inf")
    cols = torch.arange(width)
    per_rank = []
    for r in range(world):
        mine = cols[cols % world == r]
        keys = dcp.pack_candidates(logits[:, mine], mine.expand(rows, -1).contiguous(), (logits[:, mine] > float("-inf")))
        top = torch.topk(keys, k, dim=1).values
        per_rank.append(top)
    merged = dcp.merge_candidates(torch.stack(per_rank), k)
    pos, scores = dcp.unpack_candidates(merged)
    assert torch.equal(pos, topk_reference(logits, k))
    assert torch.equal(scores, logits.gather(1, pos.long()))


def test_scatter_topk_logits_reselects_the_same_set():
    pos = torch.tensor([[4, 0, 2], [1, -1, -1], [-1, -1, -1]], dtype=torch.int32)
    scores = torch.tensor([[5.0, 3.0, 3.0], [2.0, float("-inf"), float("-inf")], [float("-inf")] * 3])
    out = dcp.scatter_topk_logits(pos, scores, 6)
    want = torch.full((3, 6), float("-inf"))
    want[0, 4], want[0, 0], want[0, 2], want[1, 1] = 5.0, 3.0, 3.0, 2.0
    assert torch.equal(out, want)


def _single_rank_case():
    from cases import make_paged_case

    return make_paged_case([70, 130, 5, 200, 64], next_n=1, heads=32, seed=5)


def test_local_topk_packs_in_chunks_within_its_byte_budget_and_stays_exact(monkeypatch):
    """The packing temporaries of the sharded decode top-k are bounded (rows in chunks of LOCAL_TOPK_CHUNK_BYTES)
    and the result is still the exact top-k of the scorer's logits, ties to the lower position (one rank: W = 1)."""
    from sglang_fp4_indexer.ops.paged_logits import paged_logits

    case = _single_rank_case()
    width = case.block_table.shape[1] * 64
    monkeypatch.setattr(dcp.decode, "LOCAL_TOPK_CHUNK_BYTES", dcp.decode._PACK_BYTES_PER_ELEMENT * width * 2)  # two rows' temporaries
    blocks = []
    real = dcp.pack_candidates
    monkeypatch.setattr(dcp.decode, "pack_candidates", lambda *a: blocks.append(real(*a)) or blocks[-1])
    got = dcp.sharded_decode_topk(case.q, case.weights, case.cache, case.block_table, case.context_lens, topk=16,
                                  world_size=1, rank=0, buffers=dcp.CandidateBuffers(5, 16, 1), check=False)
    assert [b.shape[0] for b in blocks] == [2, 2, 1]
    assert all(b.numel() * dcp.decode._PACK_BYTES_PER_ELEMENT <= dcp.decode.LOCAL_TOPK_CHUNK_BYTES for b in blocks)
    logits = paged_logits(case.q, case.weights, case.cache, case.block_table, case.context_lens, width=width)
    assert torch.equal(got.positions, topk_reference(logits, 16, case.context_lens))
    assert dcp.local_topk_chunk_rows(5, width) == 2
    assert dcp.local_topk_chunk_rows(5, 10**12) == 1 and dcp.local_topk_chunk_rows(5, 1) == 5


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_local_topk_memory_is_bounded():
    """256 rows x 40K local columns (W = 2 of an 80K context): beyond the fp32 logits and the small top-k
    outputs, the sharded decode top-k holds at most LOCAL_TOPK_CHUNK_BYTES (it held ~5 int64 [rows, width])."""
    rows, width, topk = 256, 40960, 2048
    logits = torch.randn(rows, width, device="cuda")
    lens = torch.full((rows, 1), width, dtype=torch.int32, device="cuda")
    local = torch.empty(rows, topk, dtype=torch.int64, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    dcp.decode._local_topk_into(local, logits, lens, 2, 1)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    assert extra <= dcp.LOCAL_TOPK_CHUNK_BYTES + 4 * rows * topk * 8 + (1 << 20), extra
    keys = dcp.pack_candidates(logits, (torch.arange(width, device="cuda") * 2 + 1).expand(rows, width).contiguous(),
                               torch.ones(rows, width, dtype=torch.bool, device="cuda"))
    want = torch.topk(keys, topk, dim=1).values
    assert torch.equal(torch.sort(local, dim=1, descending=True).values, want)


# ---------------------------------------------------------------------------
# Multi-process: gloo, W = 2 and 4, kernels under the interpreter
# ---------------------------------------------------------------------------

needs_interpreter = pytest.mark.skipif(not INTERPRET, reason="CPU ranks run the Triton kernels under TRITON_INTERPRET=1")


def _spawn(world_size, scenario, tmp_path):
    mp.spawn(dcp_workers.run, args=(world_size, str(tmp_path / "store"), scenario), nprocs=world_size, join=True)


@needs_interpreter
@pytest.mark.parametrize("world_size", [2, 4])
def test_sharded_decode_topk_equals_single_process(world_size, tmp_path):
    _spawn(world_size, "decode", tmp_path)


@needs_interpreter
@pytest.mark.parametrize("world_size", [2, 4])
def test_staged_prefill_equals_single_process_gather(world_size, tmp_path):
    _spawn(world_size, "prefill", tmp_path)


@needs_interpreter
def test_staging_reads_and_writes_scales_through_scale_row(tmp_path):
    """With pool.scale_row a non-identity permutation, the sharded store and the staging still agree with
    the single-process gather under that layout; a plain-row access on either side would fail."""
    _spawn(2, "patched", tmp_path)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_dcp_gpu_script_full_size(monkeypatch, tmp_path):
    """scripts/dcp_gpu.py on 2 GPUs (NCCL): full-size checks must pass (it also prints the timing table)."""
    import importlib
    from pathlib import Path

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "scripts"))  # spawned ranks import it too
    module = importlib.import_module("dcp_gpu")
    assert module.main(["--world-size", "2"]) == 0
    assert (tmp_path / "dcp_gpu.json").exists()
