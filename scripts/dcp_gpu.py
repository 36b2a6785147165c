"""DCP on the 2-GPU device kind (``nvidia-h200-x2``): the sharded FP4 index at full size, checked and timed.

Not product code: a measurement tool for docs/user-guide.md (DCP section) and
docs/benchmarks.md. One process per GPU (``torch.multiprocessing.spawn``),
NCCL process group, NVLink multicast off (``NCCL_NVLS_ENABLE=0``,
``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``, ``NVSHMEM_DISABLE_NVLS=1``, set in this
script's environment for every process, as the device notes ask).

Checks (each rank; a failure exits non-zero):

- sharded decode / verify top-k (``dcp.sharded_decode_topk``, k = 2048, H = 64)
  == ``reference.topk_reference`` of the unsharded ``paged_logits`` on the full
  cache, its scores == the unsharded logits at those positions, the same on
  every rank; the unsharded logits of one row against ``reference.paged_logits_reference``
  within the scorer's fp32 bound (2e-5 x sum of |terms|, tests/test_paged_logits.py);
- prefill staging (``dcp.stage_index_k``) of a 16K-token prefill == the
  single-process ``ops.gather.gather_index_k`` byte for byte, and the ragged
  logits of its last 1024 tokens == ``ragged_logits`` on the gathered planes.

Timing (CUDA graphs; inputs rotated past L2 as ``sglang_fp4_indexer.bench.timing`` does):

- replicated scorer: ``paged_logits`` on the whole cache (what every rank runs
  today), alone and followed by ``torch.topk(2048)``;
- sharded decode step: local score + exchange + merge (``sharded_decode_topk``),
  and its parts (local score alone, exchange + merge alone); max over ranks;
- staging of a 16K-token prefill (eager: it reads host lengths) vs the
  single-process gather.

Shapes: batch x context 2 x 64K and 8 x 128K (decode), 2 x 64K verify next_n 2.
Usage on the device (prints a short table last; JSON to $OUT/dcp_gpu.json)::

    PYTHONPATH=. python3 scripts/dcp_gpu.py [--world-size 2] [--eager]

``--smoke`` runs the same code on the CPU (gloo, tiny shapes, wall-clock timing;
needs ``TRITON_INTERPRET=1``) to check the script itself, not for numbers.
"""

from __future__ import annotations

import os

NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
os.environ.update(NCCL_ENV)

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from sglang_fp4_indexer import dcp  # noqa: E402
from sglang_fp4_indexer.bench.timing import l2_cache_bytes, rotation_sets, time_calls  # noqa: E402
from sglang_fp4_indexer.format import dequantize_index_k  # noqa: E402
from sglang_fp4_indexer.ops import sm90  # noqa: E402
from sglang_fp4_indexer.ops.gather import gather_index_k  # noqa: E402
from sglang_fp4_indexer.ops.paged_logits import paged_logits, resolved_impl  # noqa: E402
from sglang_fp4_indexer.ops.quantize import store_index_k  # noqa: E402
from sglang_fp4_indexer.ops.ragged_logits import ragged_logits  # noqa: E402
from sglang_fp4_indexer.pool import allocate_index_k_cache, read_index_k  # noqa: E402
from sglang_fp4_indexer.reference import paged_logits_reference, paged_slots, topk_reference  # noqa: E402

TOPK = 2048
HEADS = 64
DECODE_SHAPES = [(2, 65536, 1), (8, 131072, 1), (2, 65536, 2)]  # (batch, context, next_n)
PREFILL_KEYS = 16384
PREFILL_QUERIES = 1024
GRAPH_CALLS = 20
GRAPH_REPLAYS = 10
# The oracle bound relative to sum_h |w| sum_d |q k| for the Triton scorers (fp32 sums); where the Hopper CUDA
# kernel runs, its own bound sm90.rel_bound() (FP8 MMA with f16 accumulation, its f16 head sum) and
# sm90.logit_error_floor instead.
REL = 2e-5
DEVICE = "cuda"


def _smoke_sizes() -> None:
    """Tiny shapes on the CPU (``--smoke``)."""
    global TOPK, HEADS, DECODE_SHAPES, PREFILL_KEYS, PREFILL_QUERIES, GRAPH_CALLS, GRAPH_REPLAYS, DEVICE
    TOPK, HEADS, DECODE_SHAPES, PREFILL_KEYS, PREFILL_QUERIES = 16, 16, [(2, 300, 1), (2, 200, 2)], 300, 8
    GRAPH_CALLS, GRAPH_REPLAYS, DEVICE = 1, 2, "cpu"


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def generator(seed: int) -> torch.Generator:
    return torch.Generator(device=DEVICE).manual_seed(seed)


class Case:
    """One global case on this rank: DCP block table, the full cache and this rank's local cache (rotated copies)."""

    def __init__(self, lens, rank, world, seed, sets=1):
        g = torch.Generator().manual_seed(seed)
        table, pages = dcp.dcp_block_table(lens, world, spare_logical_pages=1, generator=g)
        self.lens = lens
        self.table = table.to(DEVICE)
        slots = torch.cat([paged_slots(table[b], n) for b, n in enumerate(lens)]).to(DEVICE)
        keys = torch.randn(len(slots), 128, device=DEVICE, generator=generator(seed)).to(torch.bfloat16)
        self.full = [allocate_index_k_cache(pages, device=DEVICE) for _ in range(sets)]
        self.local = [allocate_index_k_cache(pages // world, device=DEVICE) for _ in range(sets)]
        for full, local in zip(self.full, self.local):
            store_index_k(keys, full, slots)
            dcp.store_index_k_sharded(keys, local, slots, world, rank)
        self.slots = slots


def _seconds(fn) -> float:
    """Wall time of ``fn()`` (CUDA events on the GPU)."""
    if DEVICE != "cuda":
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3


def graph_time(fn, sets, calls=None, replays=None, eager=False):
    """Per-call seconds of ``fn(set)``: fixed calls and replays, so every rank captures and replays the same collectives."""
    calls = max(GRAPH_CALLS if calls is None else calls, sets)
    replays = GRAPH_REPLAYS if replays is None else replays
    eager = eager or DEVICE != "cuda"
    if DEVICE == "cuda":
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for s in range(min(sets, 3)):
                fn(s)
        torch.cuda.current_stream().wait_stream(side)
    else:
        fn(0)
    sync()
    graph = None
    if not eager:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for j in range(calls):
                fn(j % sets)
        graph.replay()
        sync()

    def once():
        if graph is not None:
            graph.replay()
        else:
            for j in range(calls):
                fn(j % sets)

    samples = []
    for _ in range(replays):
        dist.barrier()
        sync()
        samples.append(_seconds(once) / calls)
    return statistics.median(samples)


def term_bound_row(q, w, cache, slots):
    """``sum_h |w| sum_d |q k|`` per key of one row (the scorer's fp32 error scale)."""
    k = dequantize_index_k(*read_index_k(cache, slots)).abs().double()
    return (k @ q.double().abs().t()) @ w.double().abs()


def queries(rows, seed):
    gen = generator(seed)
    q = (torch.randn(rows, HEADS, 128, device=DEVICE, generator=gen) * 2).to(torch.float8_e4m3fn)
    w = torch.rand(rows, HEADS, device=DEVICE, generator=gen) * HEADS**-0.5
    return q, w


def check_decode(case, rank, world, batch, ctx, next_n, failures):
    rows = batch * next_n
    q, w = queries(rows, 1000 + batch + next_n)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device=DEVICE)
    buffers = dcp.CandidateBuffers(rows, TOPK, world, DEVICE)
    got = dcp.sharded_decode_topk(
        q, w, case.local[0], case.table, lens, topk=TOPK, world_size=world, rank=rank, buffers=buffers, check=True
    )
    unsharded = paged_logits(q, w, case.full[0], case.table, lens, check=True)
    want = topk_reference(unsharded, TOPK)
    bad_rows = int((got.positions != want).any(dim=1).sum())
    sel = want.clamp_min(0).long()
    scores_equal = torch.equal(got.scores, unsharded.gather(1, sel))
    parts = [torch.empty_like(got.positions) for _ in range(world)]
    dist.all_gather(parts, got.positions)
    same = all(torch.equal(p, parts[0]) for p in parts)
    # One row against the fp64 oracle (row 0 sees ctx - next_n + 1 keys).
    n = ctx - (next_n - 1)
    ref = paged_logits_reference(q[:1], w[:1], case.full[0], case.table[:1], lens[:1] - (next_n - 1))
    bound = term_bound_row(q[0], w[0], case.full[0], case.slots[:n])
    err = (unsharded[0, :n].double() - ref[0, :n].double()).abs()
    rel = sm90.rel_bound() if resolved_impl(q, case.full[0], next_n) == "wgmma" else REL
    ref_ok = bool((err <= rel * bound + 1e-30).all())
    if not (bad_rows == 0 and scores_equal and same and ref_ok):
        failures.append(f"decode {batch}x{ctx} next_n {next_n}: rows off {bad_rows}, scores equal {scores_equal}, "
                        f"same on ranks {same}, reference ok {ref_ok}")
    checks = {"rows_off": bad_rows, "scores_equal": scores_equal, "same_on_ranks": same, "reference_ok": ref_ok}
    return q, w, lens, buffers, checks


def time_decode(case, rank, world, q, w, lens, buffers, sets, eager):
    device = torch.device(DEVICE)
    out = {}
    rep = time_calls(lambda s: paged_logits(q, w, case.full[s], case.table, lens, check=False), device, sets)
    out["replicated_score_s"] = rep.timing.seconds
    rep_k = time_calls(
        lambda s: torch.topk(paged_logits(q, w, case.full[s], case.table, lens, check=False), TOPK, dim=1),
        device, sets)
    out["replicated_score_topk_s"] = rep_k.timing.seconds
    table = dcp.local_block_table(case.table, world)
    llens = dcp.local_context_lens(lens, world, rank, next_n=q.shape[0] // lens.shape[0])
    loc = time_calls(lambda s: paged_logits(q, w, case.local[s], table, llens, check=False), device, sets)
    out["local_score_s"] = loc.timing.seconds
    del rep, rep_k, loc
    out["sharded_step_s"] = graph_time(
        lambda s: dcp.sharded_decode_topk(q, w, case.local[s], case.table, lens, topk=TOPK, world_size=world,
                                          rank=rank, buffers=buffers, check=False),
        sets, eager=eager)
    rows = q.shape[0]
    _, gathered = buffers.views(rows)

    def exchange_merge(_s):
        dist.all_gather_into_tensor(gathered, buffers.local[: rows * TOPK])
        return dcp.unpack_candidates(dcp.merge_candidates(gathered.view(world, rows, TOPK), TOPK))

    out["exchange_merge_s"] = graph_time(exchange_merge, 1, eager=eager)
    return out


def check_and_time_prefill(rank, world, failures):
    lens = [PREFILL_KEYS]
    case = Case(lens, rank, world, seed=77)
    seq = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    buffers = dcp.StagingBuffers(PREFILL_KEYS, 1, world, DEVICE)
    payload, scales = dcp.stage_index_k(case.local[0], case.table, seq, lens, world_size=world, rank=rank,
                                        buffers=buffers, check=True)
    want_p, want_s = gather_index_k(case.full[0], case.table, seq, PREFILL_KEYS, PREFILL_KEYS)
    planes_equal = torch.equal(payload, want_p) and torch.equal(scales, want_s)
    t = PREFILL_QUERIES
    q, w = queries(t, 5)
    ke = torch.arange(PREFILL_KEYS - t + 1, PREFILL_KEYS + 1, dtype=torch.int32, device=DEVICE)
    ks = torch.zeros_like(ke)
    got = dcp.sharded_ragged_logits(q, w, case.local[0], case.table, seq, lens, ks, ke, world_size=world, rank=rank,
                                    buffers=buffers, check=True)
    want = ragged_logits(q, w, want_p, want_s, ks, ke)
    logits_equal = torch.equal(got, want)
    if not (planes_equal and logits_equal):
        failures.append(f"prefill {PREFILL_KEYS}: planes equal {planes_equal}, logits equal {logits_equal}")

    def timed(fn, repeats=10):
        samples = []
        for _ in range(repeats):
            dist.barrier()
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            samples.append(time.perf_counter() - t0)
        return statistics.median(samples)

    stage_s = timed(lambda: dcp.stage_index_k(case.local[0], case.table, seq, lens, world_size=world, rank=rank,
                                              buffers=buffers, check=False))
    gather_s = timed(lambda: gather_index_k(case.full[0], case.table, seq, PREFILL_KEYS, PREFILL_KEYS, check=False))
    return {"planes_equal": planes_equal, "logits_equal": logits_equal, "stage_s": stage_s, "gather_s": gather_s}


def worker(rank, world, init_file, result_file, eager, smoke):
    os.environ.update(NCCL_ENV)
    if smoke:
        _smoke_sizes()
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=300))
    else:
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=300), device_id=torch.device("cuda", rank))
    failures: list[str] = []
    results = {"decode": [], "prefill": None}
    l2 = l2_cache_bytes(torch.device(DEVICE))
    try:
        dist.barrier()
        for batch, ctx, next_n in DECODE_SHAPES:
            # Rotate past L2 on the local cache's footprint (the smaller one), as the bench harness does.
            sets = rotation_sets(batch * ctx * 68 // world, l2, max_sets=64)
            case = Case([ctx] * batch, rank, world, seed=batch * 7 + next_n, sets=sets)
            q, w, lens, buffers, checks = check_decode(case, rank, world, batch, ctx, next_n, failures)
            timings = time_decode(case, rank, world, q, w, lens, buffers, sets, eager)
            results["decode"].append({"batch": batch, "context": ctx, "next_n": next_n, "sets": sets, **checks,
                                      **timings})
            del case
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
        results["prefill"] = check_and_time_prefill(rank, world, failures)
    except Exception as exc:
        failures.append(f"rank {rank}: {type(exc).__name__}: {exc}")
        raise
    finally:
        # Each rank writes its own file (no collective here: a failed rank must not wait on the others).
        with open(f"{result_file}.{rank}", "w") as fh:
            json.dump({"rank": rank, "results": results, "failures": failures}, fh)
    device_name = torch.cuda.get_device_name(rank) if DEVICE == "cuda" else "CPU (smoke run, times meaningless)"
    if rank == 0:
        with open(result_file, "w") as fh:
            json.dump({"world_size": world, "device": device_name, "eager": eager or DEVICE != "cuda"}, fh)
    dist.destroy_process_group()


def table(report) -> str:
    ranks = report["ranks"]
    lines = [f"DCP W={report['world_size']} on {report['device']} ({'eager' if report['eager'] else 'CUDA graphs'}); "
             f"H={HEADS}, top-k {TOPK}; ms per call; replicated = min over ranks, sharded = max over ranks"]
    lines.append(f"{'shape':<16}{'repl score':>11}{'repl +topk':>11}{'local score':>12}{'xchg+merge':>11}"
                 f"{'sharded step':>13}{'checks':>8}")
    decode = ranks[0]["results"]["decode"] if ranks else []
    for i, row in enumerate(decode):
        per = [r["results"]["decode"][i] for r in ranks if i < len(r["results"]["decode"])]
        ok = len(per) == len(ranks) and all(
            p["rows_off"] == 0 and p["scores_equal"] and p["same_on_ranks"] and p["reference_ok"] for p in per)

        def ms(key, agg=max):
            vals = [p[key] for p in per if key in p]
            return f"{1e3 * agg(vals):.3f}" if vals else "-"

        ctx = row["context"]
        shape = f"{row['batch']}x{ctx // 1024}K n{row['next_n']}" if ctx >= 1024 else f"{row['batch']}x{ctx} n{row['next_n']}"
        lines.append(f"{shape:<16}{ms('replicated_score_s', min):>11}{ms('replicated_score_topk_s', min):>11}"
                     f"{ms('local_score_s'):>12}{ms('exchange_merge_s'):>11}{ms('sharded_step_s'):>13}"
                     f"{'ok' if ok else 'FAIL':>8}")
    pre = [r["results"]["prefill"] for r in ranks if r["results"]["prefill"]]
    if pre:
        ok = len(pre) == len(ranks) and all(p["planes_equal"] and p["logits_equal"] for p in pre)
        lines.append(f"prefill {PREFILL_KEYS} keys: staging {1e3 * max(p['stage_s'] for p in pre):.3f} ms "
                     f"(single-process gather {1e3 * min(p['gather_s'] for p in pre):.3f} ms) {'ok' if ok else 'FAIL'}")
    for r in ranks:
        for f in r["failures"]:
            lines.append(f"FAIL {f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2, help="GPUs (DCP width), default 2")
    parser.add_argument("--eager", action="store_true", help="time without CUDA graphs (if capture fails)")
    parser.add_argument("--smoke", action="store_true", help="CPU + gloo + tiny shapes (needs TRITON_INTERPRET=1)")
    args = parser.parse_args(argv)
    if args.smoke:
        if os.environ.get("TRITON_INTERPRET") != "1":
            print("--smoke needs TRITON_INTERPRET=1", file=sys.stderr)
            return 2
        _smoke_sizes()
    else:
        os.environ.pop("TRITON_INTERPRET", None)
        if not torch.cuda.is_available() or torch.cuda.device_count() < args.world_size:
            print(f"needs {args.world_size} CUDA GPUs, found {torch.cuda.device_count()}", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory() as tmp:
        result_file = os.path.join(tmp, "result.json")
        error = None
        try:
            mp.spawn(worker, args=(args.world_size, os.path.join(tmp, "store"), result_file, args.eager, args.smoke),
                     nprocs=args.world_size, join=True)
        except Exception as exc:  # keep what the ranks wrote, print it, fail
            error = exc
        report = {"world_size": args.world_size, "device": "?", "eager": args.eager, "ranks": []}
        if os.path.exists(result_file):
            with open(result_file) as fh:
                report.update(json.load(fh))
        for r in range(args.world_size):
            if os.path.exists(f"{result_file}.{r}"):
                with open(f"{result_file}.{r}") as fh:
                    report["ranks"].append(json.load(fh))
    out_dir = os.environ.get("OUT")
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "dcp_gpu.json"), "w") as fh:
            json.dump(report, fh, indent=1)
    if error is not None:
        print(f"a rank failed: {error}", file=sys.stderr)
    text = table(report)
    print(text)
    return 1 if (error is not None or "FAIL" in text or not report["ranks"]) else 0


if __name__ == "__main__":
    sys.exit(main())
