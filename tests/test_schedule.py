"""CTA-schedule planner (ops/schedule.py) and ScheduleBuffer (schedule.py).

Run on the CPU under TRITON_INTERPRET=1; the ``gpu`` test captures the planner
in a CUDA graph on the device. The oracle is ``reference.paged_schedule_reference``;
coverage (every tile exactly once, in order) is also asserted straight from the
schedule, against tiles enumerated here from the contract.
"""

from __future__ import annotations


import pytest
import torch
from cases import DEVICE, INTERPRET, kernel_marker

from sglang_fp4_indexer.ops.schedule import (
    check_block_kv,
    num_key_blocks,
    plan_paged_schedule,
    plan_paged_schedule_into,
)
from sglang_fp4_indexer.reference import paged_schedule_reference
from sglang_fp4_indexer.ops.grid import CPU_NUM_CTAS, default_num_ctas
from sglang_fp4_indexer.schedule_buffer import ScheduleBuffer

needs_kernel = kernel_marker("the planner kernel needs")


def _expected_tiles(context_lens: torch.Tensor, block_kv: int) -> list[tuple[int, int]]:
    """All (b, blk) tiles, b-major, from the contract's nblocks rule (exact integer maths)."""
    lens = context_lens.to(torch.int64).cpu()
    lens = lens if lens.dim() == 2 else lens[:, None]
    tiles = []
    for b in range(lens.shape[0]):
        max_len = int(lens[b].max())
        n = max(1, (max_len + block_kv - 1) // block_kv)
        tiles += [(b, k) for k in range(n)]
    return tiles


def _assert_covers(schedule: torch.Tensor, context_lens: torch.Tensor, block_kv: int) -> None:
    """The union of the CTAs' tile ranges is every tile, once, in b-major order, balanced."""
    tiles = _expected_tiles(context_lens, block_kv)
    batch = context_lens.shape[0]
    index = {t: i for i, t in enumerate(tiles)}
    index[(batch, 0)] = len(tiles)
    sched = [tuple(r) for r in schedule.cpu().tolist()]
    num_ctas = len(sched) - 1
    assert sched[-1] == (batch, 0)
    starts = [index[t] for t in sched]  # KeyError: a boundary that is not a tile
    covered = []
    for i in range(num_ctas):
        assert starts[i] <= starts[i + 1], f"CTA {i} runs backwards"
        covered += tiles[starts[i] : starts[i + 1]]
        # Balanced split: every CTA gets floor or ceil of T / num_ctas tiles.
        size = starts[i + 1] - starts[i]
        assert len(tiles) // num_ctas <= size <= -(-len(tiles) // num_ctas)
    assert starts[0] == 0
    assert covered == tiles  # union == all tiles, no overlap, order preserved


def _plan(context_lens, block_kv, num_ctas):
    got = plan_paged_schedule(context_lens, block_kv, num_ctas)
    want = paged_schedule_reference(context_lens, block_kv, num_ctas)
    assert got.dtype == torch.int32 and got.shape == (num_ctas + 1, 2)
    assert torch.equal(got.cpu(), want.cpu())
    _assert_covers(got, context_lens, block_kv)
    return got


def test_num_key_blocks_rule():
    assert num_key_blocks(0, 64) == 1
    assert num_key_blocks(1, 64) == 1
    assert num_key_blocks(64, 64) == 1
    assert num_key_blocks(65, 64) == 2
    assert num_key_blocks(-5, 128) == 1
    t = torch.tensor([0, 1, 128, 129, 1000])
    assert num_key_blocks(t, 128).tolist() == [1, 1, 1, 2, 8]
    with pytest.raises(ValueError, match="block_kv"):
        num_key_blocks(10, 0)


def test_reference_hand_checked():
    # lens 0, 130, 64 with block 64 -> tiles per request 1, 3, 1 -> T = 5 over 2 CTAs:
    # CTA 0 tiles [0, 2) starts at (0, 0); CTA 1 tiles [2, 5) starts at flat 2 = (1, 1).
    lens = torch.tensor([0, 130, 64], dtype=torch.int32)
    want = torch.tensor([[0, 0], [1, 1], [3, 0]], dtype=torch.int32)
    assert torch.equal(paged_schedule_reference(lens, 64, 2), want)


@needs_kernel
@pytest.mark.parametrize(
    "lens, block_kv, num_ctas",
    [
        ([0, 0, 0, 0], 64, 4),  # all-zero lengths: one tile per request
        ([0], 64, 1),  # a single empty row, one CTA
        ([5000], 64, 7),  # a single row over several CTAs
        ([100, 3, 4096, 0, 65, 64, 128, 1], 128, 4),  # more rows than CTAs
        ([10, 70], 64, 16),  # fewer tiles than CTAs
        (list(range(0, 3000, 37)), 256, 5),  # 82 requests of mixed lengths
    ],
)
def test_planner_matches_oracle_1d(lens, block_kv, num_ctas):
    context_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    _plan(context_lens, block_kv, num_ctas)


@needs_kernel
def test_planner_many_requests_crosses_scan_chunks():
    # B = 300 spans three 128-request chunks of the scan; 133 boundaries span three programs.
    g = torch.Generator().manual_seed(0)
    lens = torch.randint(0, 2000, (300,), generator=g, dtype=torch.int32)
    lens[::7] = 0
    _plan(lens.to(DEVICE), 64, 132)


@needs_kernel
@pytest.mark.parametrize("next_n", [1, 2, 3, 4])
def test_planner_2d_lens(next_n):
    g = torch.Generator().manual_seed(next_n)
    lens = torch.randint(0, 700, (9, next_n), generator=g, dtype=torch.int32)
    lens[2] = 0
    _plan(lens.to(DEVICE), 128, 6)
    # A non-contiguous [B, next_n] view reads the same lengths.
    wide = torch.zeros((9, next_n * 2), dtype=torch.int32)
    wide[:, ::2] = lens
    view = wide.to(DEVICE)[:, ::2]
    assert not view.is_contiguous() or next_n == 1
    assert torch.equal(plan_paged_schedule(view, 128, 6).cpu(), paged_schedule_reference(lens, 128, 6))


@needs_kernel
def test_planner_1d_equals_2d_with_same_max():
    lens = torch.tensor([300, 0, 64, 65], dtype=torch.int32)
    two_d = torch.stack([lens - 1, lens], dim=1).clamp_min(0)
    a = plan_paged_schedule(lens.to(DEVICE), 64, 3)
    b = plan_paged_schedule(two_d.to(DEVICE), 64, 3)
    assert torch.equal(a, b)


@needs_kernel
def test_planner_int64_lens_and_empty_batch():
    lens = torch.tensor([129, 1, 0], dtype=torch.int64, device=DEVICE)
    _plan(lens, 64, 3)
    empty = torch.zeros((0,), dtype=torch.int32, device=DEVICE)
    got = plan_paged_schedule(empty, 64, 3)
    assert got.cpu().tolist() == [[0, 0]] * 4  # no tiles: every CTA starts at (B, 0)
    assert torch.equal(got.cpu(), paged_schedule_reference(empty, 64, 3))


@needs_kernel
def test_planner_negative_length_counts_as_zero():
    lens = torch.tensor([-5, 200], dtype=torch.int32, device=DEVICE)
    clamped = lens.clamp_min(0)
    assert torch.equal(plan_paged_schedule(lens, 64, 2), paged_schedule_reference(clamped, 64, 2).to(DEVICE))


@needs_kernel
def test_into_writes_in_place_and_overwrites_stale_content():
    out = torch.full((6, 2), 12345, dtype=torch.int32, device=DEVICE)
    ptr = out.data_ptr()
    lens = torch.tensor([1000, 2], dtype=torch.int32, device=DEVICE)
    res = plan_paged_schedule_into(lens, 64, out)
    assert res is out and out.data_ptr() == ptr
    assert torch.equal(out.cpu(), paged_schedule_reference(lens, 64, 5))


@needs_kernel
def test_schedule_buffer_is_address_stable():
    sb = ScheduleBuffer(block_kv=64, num_ctas=5, device=DEVICE)
    first = sb.get("decode", 3)
    ptr = first.data_ptr()
    for lens in ([0, 0, 0], [4000, 1, 77], [64, 64, 64], [1, 2, 3]):
        t = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
        got = sb.publish(t, key="decode")
        assert got is first and got.data_ptr() == ptr
        assert torch.equal(got.cpu(), paged_schedule_reference(t, 64, 5))
    # Another batch size or key gets its own buffer; the first is untouched by it.
    before = first.clone()
    other = sb.publish(torch.tensor([500] * 4, dtype=torch.int32, device=DEVICE), key="decode")
    draft = sb.publish(torch.tensor([9, 9, 9], dtype=torch.int32, device=DEVICE), key="draft")
    assert other.data_ptr() != ptr and draft.data_ptr() != ptr and other.data_ptr() != draft.data_ptr()
    assert torch.equal(first, before)
    assert len(sb) == 3


def test_default_num_ctas_cpu():
    assert default_num_ctas("cpu") == CPU_NUM_CTAS
    assert ScheduleBuffer(128, device="cpu").num_ctas == CPU_NUM_CTAS


@pytest.mark.parametrize("block_kv", [0, -64, 32, 100, 64.0, True])
def test_bad_block_kv(block_kv):
    with pytest.raises(ValueError, match="block_kv"):
        check_block_kv(block_kv)
    with pytest.raises(ValueError, match="block_kv"):
        ScheduleBuffer(block_kv, num_ctas=2, device="cpu")


@needs_kernel
def test_bad_inputs_name_the_argument():
    lens = torch.tensor([3, 4], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="context_lens"):
        plan_paged_schedule(lens.float(), 64, 2)
    with pytest.raises(ValueError, match="context_lens"):
        plan_paged_schedule(lens.reshape(1, 1, 2), 64, 2)
    with pytest.raises(ValueError, match="context_lens"):
        plan_paged_schedule(torch.zeros((2, 0), dtype=torch.int32, device=DEVICE), 64, 2)
    with pytest.raises(TypeError, match="context_lens"):
        plan_paged_schedule([3, 4], 64, 2)
    with pytest.raises(ValueError, match="block_kv"):
        plan_paged_schedule(lens, 96, 2)
    for bad in (0, -1, 2.0):
        with pytest.raises(ValueError, match="num_sms"):
            plan_paged_schedule(lens, 64, bad)
    with pytest.raises(ValueError, match="out"):
        plan_paged_schedule_into(lens, 64, torch.zeros((3, 2), dtype=torch.int64, device=DEVICE))
    with pytest.raises(ValueError, match="out"):
        plan_paged_schedule_into(lens, 64, torch.zeros((3, 3), dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="out"):
        plan_paged_schedule_into(lens, 64, torch.zeros((1, 2), dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="out"):
        plan_paged_schedule_into(lens, 64, torch.zeros((2, 4), dtype=torch.int32, device=DEVICE)[:, ::2])
    with pytest.raises(TypeError, match="out"):
        plan_paged_schedule_into(lens, 64, None)
    sb = ScheduleBuffer(64, num_ctas=2, device=DEVICE)
    with pytest.raises(ValueError, match="batch_size"):
        sb.get("k", -1)
    with pytest.raises(ValueError, match="num_ctas"):
        ScheduleBuffer(64, num_ctas=0, device=DEVICE)
    with pytest.raises(ValueError, match="context_lens"):
        sb.publish(torch.tensor(3, dtype=torch.int32, device=DEVICE))


def test_cpu_without_interpreter_is_refused(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        plan_paged_schedule(torch.tensor([3], dtype=torch.int32), 64, 2)


@pytest.mark.gpu
def test_out_on_other_device_is_refused():
    lens = torch.tensor([3, 4], dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="out"):
        plan_paged_schedule_into(lens, 64, torch.zeros((3, 2), dtype=torch.int32))


@pytest.mark.gpu
def test_planner_captured_in_cuda_graph_follows_new_lengths():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    block_kv, batch, next_n = 64, 64, 2
    num_ctas = default_num_ctas("cuda")
    sb = ScheduleBuffer(block_kv, device="cuda")
    static_lens = torch.full((batch, next_n), 100, dtype=torch.int32, device="cuda")
    out = sb.get("graph", batch)
    # Warm up (compiles the kernel) outside capture, on a side stream as torch recommends.
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        sb.publish(static_lens, key="graph")
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sb.publish(static_lens, key="graph")
    g = torch.Generator().manual_seed(1)
    cases = {
        "grow": torch.randint(1000, 40000, (batch, next_n), generator=g),
        "shrink": torch.randint(0, 300, (batch, next_n), generator=g),
        "zeros": torch.zeros((batch, next_n), dtype=torch.int64),
        "max": torch.full((batch, next_n), 131072),
    }
    for name, lens in cases.items():
        static_lens.copy_(lens.to(torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        want = paged_schedule_reference(lens, block_kv, num_ctas)
        assert torch.equal(out.cpu(), want), name
        _assert_covers(out, lens, block_kv)
    assert sb.get("graph", batch).data_ptr() == out.data_ptr()


def test_cuda_planner_builds_with_nvrtc():
    from sglang_fp4_indexer.ops import nvrtc
    from sglang_fp4_indexer.ops.schedule import _CUDA_PLANNER_SOURCE

    if nvrtc.bindings_missing():
        pytest.skip(nvrtc.bindings_missing())
    for arch in ("sm_80", "sm_90a", "sm_100"):
        cubin, log = nvrtc.compile_cubin(_CUDA_PLANNER_SOURCE.read_text(), "plan_schedule.cu", arch, verbose=True)
        assert cubin[:4] == b"\x7fELF" and nvrtc.ptxas_registers(log)[1] == 0, log


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [0, 1, 7, 64, 1023, 1024, 1025, 3000, 6000, 6001, 7000])
@pytest.mark.parametrize("next_n", [1, 3])
def test_gpu_planner_matches_oracle(batch, next_n):
    # On NVIDIA GPUs the CUDA planner runs up to CUDA_PLANNER_MAX_BATCH requests, Triton beyond.
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    g = torch.Generator().manual_seed(batch + next_n)
    lens = torch.randint(-3, 140_000, (batch, next_n), generator=g)
    lens[::5] = 0
    lens_c = (lens[:, 0] if next_n == 1 else lens).to(torch.int32).cuda()
    for block_kv in (64, 256):
        for num_ctas in (1, 132, 528, 1000):
            out = torch.full((num_ctas + 1, 2), -7, dtype=torch.int32, device="cuda")
            plan_paged_schedule_into(lens_c, block_kv, out)
            want = paged_schedule_reference(lens_c.cpu().clamp_min(0), block_kv, num_ctas)
            assert torch.equal(out.cpu(), want), (batch, next_n, block_kv, num_ctas)
