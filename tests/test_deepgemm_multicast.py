"""The deepgemm-fp8-sm90-multicast benchmark peer: DeepGEMM's newer SM90 paged kernel behind our launcher.

On the CPU (no GPU, usually no headers): the launcher's Python side -- its constants against the CUDA source's,
the shared-memory arithmetic by hand, the one-line reasons it is unavailable, argument and shape validation,
the schedule (against a line-by-line transcription of DeepGEMM's SM90 metadata kernel, and run through a
transcription of the kernel's scheduler: every cluster reaches its end and every split is scored once), the
block-table and schedule guards; the pack script on a stand-in wheel; the peer's place in the bench's scorer
list, its per-shape unavailability, and its check against the oracle with a torch stand-in for the kernel
(right logits pass, wrong ones fail). With nvcc and the headers (``$SGLANG_FP4_INDEXER_DEEPGEMM_SM90_INCLUDE``):
the launcher builds, and its library refuses bad arguments with a message before touching a device. On the
GPU machine (``-m gpu``): the peer at next_n 1, 2 and 4 against the oracle.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from sglang_fp4_indexer.bench import scorers as sc
from sglang_fp4_indexer.bench.runner import BenchConfig, run_benchmark
from sglang_fp4_indexer.bench.shapes import ScorerShape
from sglang_fp4_indexer.bench import deepgemm_sm90_paged as dg90
from sglang_fp4_indexer.pool import PAGE_SIZE

REPO = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")
MiB = 1 << 20


# ---------------------------------------------------------------- constants and arithmetic


def _snake(camel: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", camel).lower()


def _enum(source: str, name: str, prefix: str) -> list[str]:
    body = re.search(rf"enum {name} : int \{{(.*?)\}};", source, re.S).group(1)
    body = re.sub(r"//[^\n]*", "", body)
    names = re.findall(rf"\b{prefix}(\w+)", body)
    return [_snake(n) for n in names if n != "Count"]


def test_argument_and_info_layout_match_the_cuda_source():
    src = dg90.SOURCE.read_text()
    assert _enum(src, "Arg", "kArg") == list(dg90.ARG_NAMES)
    assert _enum(src, "Info", "kInfo") == list(dg90.INFO_NAMES)
    assert f"kArgVersionValue = {dg90.ARG_VERSION};" in src
    # The kernel configuration the source instantiates is the one the Python side computes with.
    for pattern, value in ((r"kMathWarpGroups = (\d+);", dg90.MATH_WARPGROUPS),
                           (r"kQStages = (\d+), kKVStages = (\d+);", (dg90.Q_STAGES, dg90.KV_STAGES)),
                           (r"kComputeBlockKV = (\d+);", dg90.COMPUTE_BLOCK_KV),
                           (r"kPageTokens = (\d+);", PAGE_SIZE),
                           (r"kHeadDim = (\d+);", dg90.HEAD_DIM)):
        got = tuple(int(g) for g in re.search(pattern, src).groups())
        assert got == (value if isinstance(value, tuple) else (value,)), pattern
    assert "kTMAThreads = 128, kMathThreads = 128 * kMathWarpGroups;" in src and dg90.THREADS == 640
    assert "(DGMC_NEXT_N == 4 ? 2 : 1)" in src


def test_kv_multicast_and_shared_memory_by_hand():
    assert [dg90.kv_multicast(n) for n in (1, 2, 4)] == [1, 1, 2]
    # Query pipe 3 x (rows x H x 128 + weights padded to 1 KiB) + 1 KiB of barriers; KV pipe 3 x (8 KiB + 1 KiB)
    # + 1 KiB = 28 KiB, four of them; rows per CTA: 1, 2, and 2 (next_n 4 over two CTAs).
    kv = 4 * (3 * (8192 + 1024) + 1024)
    assert kv == 114688
    assert dg90.smem_bytes(1, 64) == 3 * (8192 + 1024) + 1024 + kv == 143360
    assert dg90.smem_bytes(2, 64) == dg90.smem_bytes(4, 64) == 3 * (16384 + 1024) + 1024 + kv == 167936
    assert dg90.smem_bytes(1, 32) == 3 * (4096 + 1024) + 1024 + kv == 131072
    assert dg90.smem_bytes(4, 32) == 143360
    assert max(dg90.smem_bytes(n, h) for n in dg90.NEXT_N for h in dg90.HEADS) <= 227 * 1024
    for bad, exc in ((3, ValueError), (8, ValueError), (4.0, TypeError), (True, TypeError)):
        with pytest.raises(exc, match="next_n"):
            dg90.kv_multicast(bad)
    with pytest.raises(ValueError, match="heads: 16"):
        dg90.smem_bytes(1, 16)


def test_config_problem_names_what_the_kernel_takes():
    assert all(dg90.config_problem(n, h) is None for n in (1, 2, 4) for h in (32, 64))
    assert "next_n 3" in dg90.config_problem(3, 64) and "1, 2, 4" in dg90.config_problem(3, 64)
    assert "16 index heads" in dg90.config_problem(1, 16)
    assert "head dim 64" in dg90.config_problem(1, 64, 64)


# ---------------------------------------------------------------- unavailable reasons


def _header(tmp_path, marker=True) -> Path:
    inc = tmp_path / "include"
    path = inc / dg90.KERNEL_HEADER
    path.parent.mkdir(parents=True)
    path.write_text("template <uint32_t kNumKVMulticast> void k();\n" if marker else "template <int N> void k();\n")
    return inc


def test_reasons_one_line_each_in_order(tmp_path):
    inc = str(_header(tmp_path))
    nvcc = "/opt/cuda/bin/nvcc"
    cases = [
        (("cpu", None, inc, nvcc), "needs a CUDA device"),
        (("cuda", (8, 0), inc, nvcc, "NVIDIA A100"), "needs an SM90 (Hopper) GPU; NVIDIA A100 is sm_80"),
        (("cuda", (10, 0), inc, nvcc), "is sm_100"),
        (("cuda", (9, 0), None, nvcc), f"${dg90.INCLUDE_ENV} is not set"),
        (("cuda", (9, 0), str(tmp_path / "nowhere"), nvcc), f"no {dg90.KERNEL_HEADER}"),
        (("cuda", (9, 0), inc, None), "nvcc not found"),
    ]
    for args, want in cases:
        why = dg90.reason_for(*args)
        assert want in why and "\n" not in why, (args, why)
    assert dg90.reason_for("cuda", (9, 0), inc, nvcc) is None
    assert "pack_deepgemm_multicast.sh" in dg90.reason_for("cuda", (9, 0), None, nvcc)
    old = _header(tmp_path / "old", marker=False)
    assert "an older DeepGEMM" in dg90.header_problem(old)
    assert dg90.unavailable_reason(CPU).startswith("needs a CUDA device")


def test_find_nvcc_order(tmp_path, monkeypatch):
    home = tmp_path / "cuda"
    (home / "bin").mkdir(parents=True)
    exe = home / "bin" / "nvcc"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(home))
    assert dg90.find_nvcc() == str(exe)
    monkeypatch.delenv("CUDA_HOME")
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(dg90, "DEFAULT_NVCC", str(tmp_path / "none" / "nvcc"))
    assert dg90.find_nvcc() is None
    monkeypatch.setattr(dg90, "DEFAULT_NVCC", str(exe))
    assert dg90.find_nvcc() == str(exe)


def test_build_refuses_without_headers_nvcc_or_a_supported_config(tmp_path, monkeypatch):
    monkeypatch.delenv(dg90.INCLUDE_ENV, raising=False)
    with pytest.raises(FileNotFoundError, match="is not set"):
        dg90.build(4, 64)
    inc = _header(tmp_path)
    with pytest.raises(FileNotFoundError, match="nvcc not found"):
        monkeypatch.setattr(dg90, "find_nvcc", lambda: None)
        dg90.build(4, 64, include_dir=inc)
    with pytest.raises(ValueError, match="next_n: 3"):
        dg90.build(3, 64, include_dir=inc)
    with pytest.raises(ValueError, match="heads: 128"):
        dg90.build(1, 128, include_dir=inc)


# ---------------------------------------------------------------- the schedule


def _metadata_kernel(lens: list[int], num_sms: int, split_kv: int = dg90.SPLIT_KV, atoms: int = 1) -> list[list[int]]:
    """Line by line, sched::sm90_paged_mqa_logits_metadata's non-varlen branch (vLLM 0.34.0's DeepGEMM header)."""
    batch = len(lens)
    prefix, s = [], 0
    for n in lens:
        s += -(-n // split_kv)
        prefix.append(s)
    total = s * atoms
    if total == 0:
        return [[batch * atoms, 0] for _ in range(num_sms + 1)]
    q, r = divmod(total, num_sms)
    pivot = num_sms - r
    out = []
    for sm in range(num_sms):
        seg = sm * q + (sm - pivot if sm > pivot else 0)
        lo, hi = 0, batch
        while lo < hi:
            mid = (lo + hi) // 2
            if prefix[mid] * atoms <= seg:
                lo = mid + 1
            else:
                hi = mid
        qi = min(lo, batch - 1)
        off = seg if qi == 0 else seg - prefix[qi - 1] * atoms
        n = prefix[0] if qi == 0 else prefix[qi] - prefix[qi - 1]
        out.append([qi * atoms + (off // n if n > 0 else 0), off % n if n > 0 else 0])
    return out + [[batch * atoms, 0]]


class _Scheduler:
    """sched::SM90PagedMQALogitsScheduler<kNextN, 2-D lens, not varlen, BLOCK_KV 64, 4 blocks per split, 1 atom>."""

    def __init__(self, cluster: int, lens: list[int], meta: list[list[int]], blocks_per_split: int = 4):
        self.lens, self.batch, self.k = lens, len(lens), blocks_per_split
        self.q, self.kv = meta[cluster][0], meta[cluster][1] * self.k
        self.end_q, self.end_kv = meta[cluster + 1][0], meta[cluster + 1][1] * self.k
        self.num_kv = 0
        if self.exists(self.q):
            self.num_kv = -(-lens[self.q] // dg90.COMPUTE_BLOCK_KV)

    def exists(self, q: int) -> bool:
        return q < self.end_q or (q == self.end_q and 0 < self.end_kv)

    def fetch(self):
        while self.num_kv == 0 and not (self.q == self.end_q and self.kv == self.end_kv):
            self.kv, self.q = 0, self.q + 1
            if self.exists(self.q):
                self.num_kv = -(-self.lens[self.q] // dg90.COMPUTE_BLOCK_KV)
        task = (self.q, self.kv)
        if self.q == self.end_q and self.kv == self.end_kv:
            return None
        self.kv += self.k
        if self.kv >= self.num_kv:
            self.kv, self.q = 0, self.q + 1
            if self.exists(self.q):
                self.num_kv = -(-self.lens[self.q] // dg90.COMPUTE_BLOCK_KV)
        return task


def _random_lens(rng: random.Random) -> tuple[list[int], int, int]:
    batch = rng.randint(1, 40)
    lens = [rng.choice([0, 1, 63, 64, 65, 255, 256, 257, rng.randint(0, 5000)]) for _ in range(batch)]
    if rng.random() < 0.1:
        lens = [0] * batch
    return lens, rng.choice([1, 2, 3, 7, 57, 66, 132, rng.randint(1, 200)]), rng.choice([1, 2, 4])


def _lens_2d(lens: list[int], next_n: int) -> torch.Tensor:
    rows = [[max(n - next_n + 1 + i, 0) for i in range(next_n)] for n in lens]
    return torch.tensor(rows, dtype=torch.int32).reshape(len(lens), next_n)


def test_plan_schedule_is_deepgemms_metadata_kernel():
    rng = random.Random(0)
    for _ in range(1500):
        lens, clusters, next_n = _random_lens(rng)
        sched = dg90.plan_schedule(_lens_2d(lens, next_n), clusters)
        assert sched.dtype == torch.int32 and tuple(sched.shape) == (clusters + 1, 2) and sched.is_contiguous()
        assert sched.tolist() == _metadata_kernel(lens, clusters), (lens, clusters)
        assert dg90.plan_schedule(torch.tensor(lens, dtype=torch.int32), clusters).tolist() == sched.tolist()
    # 132 SMs, next_n 4: 66 clusters; 8 requests of 128K keys = 4096 splits, 62 each (4 clusters 63).
    sched = dg90.plan_schedule(torch.full((8, 4), 131072, dtype=torch.int32), 66).tolist()
    assert sched[0] == [0, 0] and sched[1] == [0, 62] and sched[-1] == [8, 0]


def test_every_cluster_ends_and_every_split_is_scored_once():
    rng = random.Random(1)
    for _ in range(600):
        lens, clusters, next_n = _random_lens(rng)
        meta = dg90.plan_schedule(_lens_2d(lens, next_n), clusters).tolist()
        seen = []
        for c in range(clusters):
            s = _Scheduler(c, lens, meta)
            for _step in range(10_000):
                task = s.fetch()
                if task is None:
                    break
                seen.append(task)
            else:
                pytest.fail(f"cluster {c} did not reach its end: lens {lens}, {clusters} clusters")
        want = [(b, 4 * j) for b, n in enumerate(lens) for j in range(-(-n // dg90.SPLIT_KV))]
        assert sorted(seen) == want, (lens, clusters)


def test_schedule_problem_catches_what_would_run_past_the_batch():
    lens = torch.tensor([[300, 301], [0, 0], [1000, 1001]], dtype=torch.int32)
    good = dg90.plan_schedule(lens, 3)
    assert dg90.schedule_problem(good, lens) is None
    assert dg90.schedule_problem(good, lens, max_keys=1024) is None
    bad_last = good.clone()
    bad_last[-1, 0] = 2
    assert "last row" in dg90.schedule_problem(bad_last, lens)
    past = good.clone()
    past[1] = torch.tensor([2, 4])  # request 2 has ceil(1001 / 256) = 4 splits: 0 .. 3
    assert "has 4 splits" in dg90.schedule_problem(past, lens)
    empty = good.clone()
    empty[1] = torch.tensor([1, 0])  # request 1 has no keys
    assert "has 0 splits" in dg90.schedule_problem(empty, lens)
    swapped = good.clone()
    swapped[[0, 1]] = good[[1, 0]]
    assert "out of order" in dg90.schedule_problem(swapped, lens)
    assert "int32" in dg90.schedule_problem(good.long(), lens)
    assert "negative" in dg90.schedule_problem(good, lens - 400)
    assert "above the block table's 960" in dg90.schedule_problem(good, lens, max_keys=960)
    with pytest.raises(ValueError, match="num_clusters"):
        dg90.plan_schedule(lens, 0)
    with pytest.raises(TypeError, match="integer"):
        dg90.plan_schedule(lens.float(), 3)


def test_table_problem_reads_only_the_pages_a_request_uses():
    lens = torch.tensor([[65], [1]], dtype=torch.int32)
    table = torch.tensor([[3, 0, 99], [1, -5, 99]], dtype=torch.int32)  # beyond each request's pages: ignored
    assert dg90.table_problem(table, lens, 4) is None
    assert "block_table[0, 1] = 0" not in (dg90.table_problem(table, lens, 4) or "")
    assert "block_table[0, 0] = 3, outside the cache's 3 pages" in dg90.table_problem(table, lens, 3)
    assert "4 pages, the block table has 3" in dg90.table_problem(table, torch.tensor([[200], [1]]), 4)


# ---------------------------------------------------------------- argument validation


def _call(batch=2, next_n=4, heads=64, pages=6, cols=3, clusters=5, width=None):
    rows = batch * next_n
    lens = torch.tensor([[cols * PAGE_SIZE - next_n + 1 + i for i in range(next_n)]] * batch, dtype=torch.int32)
    width = width or cols * PAGE_SIZE
    return dict(
        q=torch.zeros(rows, heads, 128, dtype=torch.float8_e4m3fn),
        kv_cache=torch.zeros(pages, dg90.PAGE_BYTES, dtype=torch.uint8),
        weights=torch.zeros(rows, heads),
        context_lens=lens,
        block_table=torch.zeros(batch, cols, dtype=torch.int32),
        schedule=dg90.plan_schedule(lens, clusters),
        logits=dg90.padded_logits(rows, width, CPU),
        max_context=int(lens.max()),
    )


def test_validate_call_accepts_the_benchs_layout():
    for next_n, heads in ((1, 32), (2, 64), (4, 64), (4, 32)):
        got = dg90.validate_call(**_call(next_n=next_n, heads=heads))
        assert got == dg90.CallShape(2, next_n, heads, 6, 5, 256)
    call = _call()
    call["q"] = call["q"].view(2, 4, 64, 128)
    call["kv_cache"] = call["kv_cache"].view(6, PAGE_SIZE, 1, 132)
    assert dg90.validate_call(**call).logits_stride == 256
    wide = _call(width=163840)
    assert dg90.validate_call(**wide).logits_stride == 163840


def _with(name, value):
    call = _call()
    call[name] = value(call[name]) if callable(value) else value
    return call


@pytest.mark.parametrize("call, exc, match", [
    (_with("q", lambda t: t.to(torch.bfloat16)), TypeError, "q: expected torch.float8_e4m3fn"),
    (_with("q", lambda t: t[:, :32]), ValueError, "q: expected a contiguous"),
    (_with("q", lambda t: t[:6]), ValueError, "q: 6 rows, expected batch 2 x next_n 4 = 8"),
    (_with("q", torch.zeros(8, 64, 64, dtype=torch.float8_e4m3fn)), ValueError, "head dim 64"),
    (_with("q", torch.zeros(8, 16, 128, dtype=torch.float8_e4m3fn)), ValueError, "16 index heads"),
    (_with("context_lens", lambda t: t[:, :3].contiguous()), ValueError, "q: 8 rows, expected batch 2 x next_n 3"),
    (_with("context_lens", lambda t: t[:, 0]), ValueError, "context_lens: expected a contiguous int32 \\[B, next_n\\]"),
    (_with("context_lens", lambda t: t.long()), TypeError, "context_lens: expected torch.int32"),
    (_with("kv_cache", torch.zeros(6, 64 * 68, dtype=torch.uint8)), ValueError, "SGLang's FP8 index pages"),
    (_with("kv_cache", lambda t: t.view(torch.int8)), TypeError, "kv_cache: expected torch.uint8"),
    (_with("weights", lambda t: t[:, ::2]), ValueError, "weights: expected float32 \\[8, 64\\]"),
    (_with("weights", lambda t: t.half()), TypeError, "weights: expected torch.float32"),
    (_with("block_table", torch.zeros(3, 3, dtype=torch.int32)), ValueError, "block_table: expected int32 \\[2,"),
    (_with("schedule", lambda t: t[:, :1].contiguous()), ValueError, "schedule: expected a contiguous"),
    (_with("logits", lambda t: t[:, :100]), ValueError, None),
    (_with("logits", torch.zeros(8, 192)), ValueError, "row stride 192, expected a multiple of 256"),
    (_with("logits", lambda t: t.double()), TypeError, "logits: expected torch.float32"),
    (_with("max_context", 3 * PAGE_SIZE + 1), ValueError, "max_context: 193 keys, expected 1 .. the block table's 192"),
    (_with("max_context", 1.0), TypeError, "max_context: expected an int"),
    (_with("schedule", "schedule"), TypeError, "schedule: expected a tensor"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_validate_call_rejects_with_a_message(call, exc, match):
    if match is None:  # a narrower view of a valid buffer is still valid: the stride is what the kernel reads
        assert dg90.validate_call(**call).logits_stride == 256
        return
    with pytest.raises(exc, match=match):
        dg90.validate_call(**call)


def test_padded_logits_rows_are_whole_splits():
    t = dg90.padded_logits(3, 300, CPU, fill=float("nan"))
    assert tuple(t.shape) == (3, 300) and t.stride(0) == 512 and torch.isnan(t).all()
    assert dg90.padded_logits(1, 256, CPU).stride(0) == 256
    with pytest.raises(ValueError):
        dg90.padded_logits(0, 10, CPU)


# ---------------------------------------------------------------- the built library (nvcc and headers)


def _include_dir(tmp_path_factory) -> Path | None:
    env = os.environ.get(dg90.INCLUDE_ENV)
    if env and dg90.header_problem(env) is None:
        return Path(env)
    archive = REPO / dg90.ARCHIVE
    if archive.is_file():
        out = tmp_path_factory.mktemp("dgmc")
        with tarfile.open(archive) as t:
            t.extractall(out, filter="data")
        return out / "deepgemm-multicast" / "include"
    return None


@pytest.mark.gpu  # runs where gpu_run.sh unpacks the headers (not in the repository) and nvcc is: the device machine
def test_library_builds_and_refuses_bad_arguments_before_any_device_call(tmp_path_factory, monkeypatch):
    """The launcher library builds from the packed headers and refuses each bad argument with its message before any
    device call (no GPU needed, but the headers and nvcc are only on the device machine)."""
    inc = _include_dir(tmp_path_factory)
    if inc is None or dg90.find_nvcc() is None:
        pytest.skip(f"needs nvcc and the headers (${dg90.INCLUDE_ENV} or {dg90.ARCHIVE})")
    monkeypatch.setenv(dg90.BUILD_DIR_ENV, str(tmp_path_factory.mktemp("build")))
    lib = dg90.build(4, 64, include_dir=inc)
    assert dg90.build(4, 64, include_dir=inc) == lib  # cached
    fn = dg90.Launcher(lib, 4, 64)
    good = dict(zip(dg90.ARG_NAMES, [0] * len(dg90.ARG_NAMES)))
    good.update(version=dg90.ARG_VERSION, next_n=4, heads=64, batch=2, num_pages=6, page_stride_bytes=dg90.PAGE_BYTES,
                weights_row_stride=64, block_table_stride=3, block_table_cols=3, num_clusters=66, logits_stride=256,
                max_context=192, smem_bytes=dg90.smem_bytes(4, 64), q=1 << 20, kv_cache=1 << 21, weights=1 << 22,
                context_lens=1 << 23, block_table=1 << 24, schedule=1 << 25, logits=1 << 26)

    def refused(**change):
        args = dict(good, **change)
        fn._args[:] = [args[n] for n in dg90.ARG_NAMES]
        assert fn._lib.dgmc_launch(fn._args, len(dg90.ARG_NAMES), fn._err, fn.ERR_BYTES) == 1
        return fn._err.value.decode()

    assert "argument layout 2" in refused(version=2)
    assert "built for next_n 4, heads 64" in refused(next_n=2)
    assert "the header's formulas 167936 B" in refused(smem_bytes=dg90.smem_bytes(1, 64))
    assert "page stride of 4352 bytes" in refused(page_stride_bytes=4352)
    assert "logits row stride 300" in refused(logits_stride=300)
    assert "the block table holds 192" in refused(max_context=193)
    assert "a null pointer" in refused(q=0)
    assert "the schedule 8-byte alignment" in refused(schedule=(1 << 25) + 4)
    assert fn._lib.dgmc_launch(fn._args, 3, fn._err, fn.ERR_BYTES) == 1
    assert "expected 21 arguments" in fn._err.value.decode()
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="deepgemm-sm90 launcher: cudaGetDevice"):
            fn.info()


# ---------------------------------------------------------------- the pack script


def _fake_wheel(path: Path, marker: bool = True) -> Path:
    root = "vllm/third_party/deep_gemm/include/"
    files = {
        "deep_gemm/impls/sm90_fp8_paged_mqa_logits.cuh":
            "#pragma once\n#include <cute/a.hpp>\n#include <deep_gemm/common/b.cuh>\n#include <cuda.h>\n"
            + ("template <uint32_t kNumKVMulticast> void k();\n" if marker else ""),
        "deep_gemm/common/b.cuh": '#include "c.cuh"\n#if 0\n  #  include <cutlass/d.h>\n#endif\n',
        "deep_gemm/common/c.cuh": "// leaf\n",
        "cute/a.hpp": "#include <cute/a.hpp>\n",  # includes itself: visited once
        "cutlass/d.h": "// conditional, still packed\n",
        "cutlass/unused.h": "// not included by anything\n",
    }
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(root + name, text)
        z.writestr("vllm-0.34.0.dist-info/licenses/LICENSE", "Apache License 2.0 (vLLM)\n")
    return path


def _pack(tmp_path: Path, wheel: Path, license_text: str | None) -> subprocess.CompletedProcess:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "scripts" / "pack_deepgemm_multicast.sh", repo / "scripts")
    env = {k: v for k, v in os.environ.items() if k not in ("DEEPGEMM_LICENSE", "OUT_ARCHIVE")}
    if license_text is not None:
        (tmp_path / "LICENSE").write_text(license_text)
        env["DEEPGEMM_LICENSE"] = str(tmp_path / "LICENSE")
    return subprocess.run(["bash", str(repo / "scripts" / "pack_deepgemm_multicast.sh"), str(wheel)],
                          capture_output=True, text=True, env=env, timeout=120)


def test_pack_script_packs_the_include_closure_with_its_licences(tmp_path):
    proc = _pack(tmp_path, _fake_wheel(tmp_path / "vllm.whl"), "MIT License\nCopyright (c) 2025 DeepSeek\n")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    archive = tmp_path / "repo" / dg90.ARCHIVE
    with tarfile.open(archive) as t:
        names = sorted(t.getnames())
        assert names == sorted("deepgemm-multicast/" + n for n in (
            "LICENSE", "LICENSE.vllm", "PACKED_FROM", "include/" + dg90.KERNEL_HEADER, "include/cute/a.hpp",
            "include/cutlass/d.h", "include/deep_gemm/common/b.cuh", "include/deep_gemm/common/c.cuh"))
        assert b"DeepSeek" in t.extractfile("deepgemm-multicast/LICENSE").read()
        assert all(m.mtime == 0 and m.uid == 0 for m in t.getmembers())
        packed = t.extractfile("deepgemm-multicast/PACKED_FROM").read().decode()
    assert "vllm.whl" in packed and "5 headers" in packed and packed.strip() in proc.stdout


def test_pack_script_refuses_an_old_header_or_no_licence(tmp_path):
    proc = _pack(tmp_path, _fake_wheel(tmp_path / "old.whl", marker=False), "MIT\nDeepSeek\n")
    assert proc.returncode != 0 and "has no kNumKVMulticast" in proc.stderr
    proc = _pack(tmp_path / "b", _fake_wheel(tmp_path / "new.whl"), None)
    assert proc.returncode != 0 and "no DeepGEMM LICENSE" in proc.stderr


def test_gpu_run_unpacks_the_archive_and_names_the_headers():
    text = (REPO / "scripts" / "gpu_run.sh").read_text()
    assert ".peers/deepgemm-multicast.tar.xz" in text
    for var in (dg90.INCLUDE_ENV, dg90.BUILD_DIR_ENV):
        assert f"export {var}=" in text
    assert "sglang_fp4_indexer.bench.deepgemm_sm90_paged build" in text


# ---------------------------------------------------------------- the bench peer


def test_peer_is_in_the_scorer_list_and_the_default_run():
    import argparse

    from sglang_fp4_indexer.bench import add_arguments

    assert "deepgemm-multicast" in sc.SCORER_NAMES
    (peer,) = sc.make_scorers(["deepgemm-multicast"])
    assert isinstance(peer, sc.DeepGemmSm90MulticastScorer) and peer.name == "deepgemm-fp8-sm90-multicast"
    assert peer.key_bytes == 132
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert "deepgemm-multicast" in parser.parse_args([]).scorers.split(",")
    assert peer.shape_reason(ScorerShape(64, 8, 4096, 4)) is None
    assert "next_n 3" in peer.shape_reason(ScorerShape(64, 8, 4096, 3))
    assert "16 index heads" in peer.shape_reason(ScorerShape(16, 8, 4096, 1))


def test_bench_on_the_cpu_lists_the_peer_unavailable():
    report = run_benchmark(BenchConfig(CPU, [ScorerShape(32, 1, 64, 1)], sc.make_scorers(["deepgemm-multicast"]),
                                       store_tokens=None, planner_batch=None, copy_bytes=MiB))
    status = {s["name"]: s["status"] for s in report["scorers"]}
    assert status["deepgemm-fp8-sm90-multicast"].startswith("unavailable: needs a CUDA device")
    assert report["rows"][0]["results"]["deepgemm-fp8-sm90-multicast"] == {"status": "unavailable"}
    assert report["failures"] == 0


class _Exact(sc.Scorer):
    """The torch oracle as a scorer (no Triton: runs on the CPU without the interpreter)."""

    name = "exact"

    def prepare(self, inputs, l2_bytes):
        from sglang_fp4_indexer.reference import paged_logits_reference

        def fn(s):
            return paged_logits_reference(inputs.q, inputs.weights, inputs.caches[s], inputs.block_table,
                                          inputs.context_lens, width=inputs.width).float()

        return sc.PreparedScorer(fn, 1, 1e-3, False, 0)


def test_a_shape_a_scorer_cannot_score_is_unavailable_in_its_row_not_a_failure():
    from sglang_fp4_indexer.bench.report import render_summary

    class NotH32(_Exact):
        name = "not-h32"

        def shape_reason(self, shape):
            return "built for H 64 only" if shape.heads == 32 else None

    shapes = [ScorerShape(32, 1, 64, 1), ScorerShape(64, 1, 64, 1)]
    report = run_benchmark(BenchConfig(CPU, shapes, [_Exact(), NotH32()], store_tokens=None, planner_batch=None,
                                       copy_bytes=MiB))
    first, second = (row["results"] for row in report["rows"])
    assert first["not-h32"] == {"status": "unavailable", "reason": "built for H 64 only"}
    assert first["exact"]["status"] == "ok" and second["not-h32"]["status"] == "ok"
    assert report["failures"] == 0 and "FAIL" not in render_summary(report)


class _TorchKernel:
    """A stand-in for the built launcher on the CPU: the kernel's semantics in torch (every row scored over its
    request's last row's pages, whole 64-key blocks written), optionally wrong by ``error`` at one logit."""

    calls = 0

    def __init__(self, next_n, heads, error=0.0):
        self.next_n, self.heads, self.error = next_n, heads, error

    def __call__(self, q, kv, w, lens, bt, schedule, logits, max_context, validate=True):
        _TorchKernel.calls += 1
        shape = dg90.validate_call(q, kv, w, lens, bt, schedule, logits, max_context)
        assert dg90.schedule_problem(schedule, lens) is None
        assert (shape.next_n, shape.heads) == (self.next_n, self.heads)
        pages = kv.shape[0]
        values = kv[:, : PAGE_SIZE * 128].contiguous().view(torch.float8_e4m3fn).float().view(pages, PAGE_SIZE, 128)
        scales = kv[:, PAGE_SIZE * 128 :].contiguous().view(torch.float32).view(pages, PAGE_SIZE)
        for b in range(shape.batch):
            n = -(-int(lens[b, -1]) // 64)
            keys = (values[bt[b, :n].long()] * scales[bt[b, :n].long(), :, None]).reshape(-1, 128)
            for i in range(self.next_n):
                r = b * self.next_n + i
                s = torch.relu(q[r].float() @ keys.T)  # [H, keys]
                logits[r, : keys.shape[0]] = (w[r][:, None] * s).sum(0)
        logits[0, 0] += self.error
        return logits


def _fake_gpu(monkeypatch, error=0.0):
    monkeypatch.setattr(dg90, "unavailable_reason", lambda device: None)
    monkeypatch.setattr(dg90, "launcher", lambda device, next_n, heads: _TorchKernel(next_n, heads, error))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(multi_processor_count=132))
    monkeypatch.setattr(sc, "first_call_watchdog", lambda fn, device, what, seconds=None: fn(0))


def test_the_peer_is_checked_against_the_oracle_like_the_other_peers(monkeypatch):
    _fake_gpu(monkeypatch)
    shapes = [ScorerShape(64, 2, 192, 4), ScorerShape(32, 1, 130, 2), ScorerShape(64, 1, 64, 1),
              ScorerShape(64, 1, 128, 3)]
    report = run_benchmark(BenchConfig(CPU, shapes, sc.make_scorers(["deepgemm-multicast"]),
                                       store_tokens=None, planner_batch=None, copy_bytes=MiB))
    results = [row["results"]["deepgemm-fp8-sm90-multicast"] for row in report["rows"]]
    for res in results[:3]:
        assert res["status"] == "ok", res
        assert res["check"]["ok"] and res["check"]["rows_checked"] >= 1
        assert "visible columns" in res["check"]["detail"] and "within 0.01 x bound" in res["check"]["detail"]
    assert results[3] == {"status": "unavailable", "reason": sc.DeepGemmSm90MulticastScorer().shape_reason(shapes[3])}
    assert report["failures"] == 0


def test_wrong_logits_from_the_peer_fail_its_check(monkeypatch):
    _fake_gpu(monkeypatch, error=1e3)
    report = run_benchmark(BenchConfig(CPU, [ScorerShape(64, 2, 192, 4)], sc.make_scorers(["deepgemm-multicast"]),
                                       store_tokens=None, planner_batch=None, copy_bytes=MiB))
    res = report["rows"][0]["results"]["deepgemm-fp8-sm90-multicast"]
    assert res["status"] == "check failed" and "exceeds 0.01 x bound" in res["check"]["detail"]
    assert report["failures"] == 1


def test_a_bad_schedule_is_refused_before_the_first_launch(monkeypatch):
    _fake_gpu(monkeypatch)
    monkeypatch.setattr(dg90, "plan_schedule", lambda lens, clusters: torch.zeros(clusters + 1, 2, dtype=torch.int32))
    _TorchKernel.calls = 0
    report = run_benchmark(BenchConfig(CPU, [ScorerShape(64, 2, 192, 4)], sc.make_scorers(["deepgemm-multicast"]),
                                       store_tokens=None, planner_batch=None, copy_bytes=MiB))
    res = report["rows"][0]["results"]["deepgemm-fp8-sm90-multicast"]
    assert res["status"].startswith("error") and "last row" in res["status"] and _TorchKernel.calls == 0


# ---------------------------------------------------------------- GPU (device machine)


@pytest.mark.gpu
def test_gpu_peer_at_next_n_1_2_4_against_the_oracle():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    dev = torch.device("cuda")
    why = dg90.unavailable_reason(dev)
    if why:
        pytest.skip(why)
    shapes = [ScorerShape(64, 2, 4096, 1), ScorerShape(64, 2, 4100, 2), ScorerShape(64, 3, 4096, 4),
              ScorerShape(32, 1, 4096, 4), ScorerShape(64, 1, 300, 4, 163840)]
    report = run_benchmark(BenchConfig(dev, shapes, sc.make_scorers(["deepgemm-multicast"]),
                                       store_tokens=None, planner_batch=None, copy_bytes=256 * MiB))
    for row in report["rows"]:
        res = row["results"]["deepgemm-fp8-sm90-multicast"]
        assert res["status"] == "ok", (row["label"], res)
    info = dg90.launcher(dev, 4, 64).info()
    assert info["kv_multicast"] == 2 and info["max_active_clusters"] >= 1 and info["local_bytes"] == 0
