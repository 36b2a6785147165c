"""The one NVRTC build path (ops/nvrtc.py) on the CPU: build keys, one build per key, failures remembered and
warned about once, the inspection variables; and that the three CUDA kernels of the package go through it."""

from __future__ import annotations

import hashlib
import warnings

import pytest
import torch

from sglang_fp4_indexer.ops import nvrtc

SRC = 'extern "C" __global__ void k(int* p) { p[0] = N; }\n'


def test_program_text_prepends_one_define_per_line_in_order():
    assert nvrtc.program_text(SRC, (("N", 3), ("FLAG", True))) == "#define N 3\n#define FLAG 1\n" + SRC
    assert nvrtc.program_text(SRC, {"B": "x y", "A": 2}) == "#define B x y\n#define A 2\n" + SRC
    with pytest.raises(ValueError, match="defines: '2X' is not a C identifier"):
        nvrtc.program_text(SRC, {"2X": 1})
    with pytest.raises(ValueError, match="defines: the value of N holds a line break"):
        nvrtc.program_text(SRC, {"N": "1\n#define M 2"})


def test_build_key_is_source_hash_defines_options_and_arch():
    key = nvrtc.build_key(SRC, {"N": 3}, "sm_90a")
    assert key == nvrtc.BuildKey(hashlib.sha256(SRC.encode()).hexdigest(), (("N", "3"),), nvrtc.DEFAULT_OPTIONS,
                                 "sm_90a")
    assert nvrtc.build_key(SRC, (("N", 3),), "sm_90a") == key  # a mapping or pairs, ints or their text
    others = {nvrtc.build_key(SRC + " ", {"N": 3}, "sm_90a"), nvrtc.build_key(SRC, {"N": 4}, "sm_90a"),
              nvrtc.build_key(SRC, {"N": 3}, "sm_80"), nvrtc.build_key(SRC, {"N": 3}, "sm_90a", ("-std=c++17",))}
    assert key not in others and len(others) == 4
    with pytest.raises(ValueError, match="arch: expected 'sm_XY'"):
        nvrtc.build_key(SRC, {}, "90a")


@pytest.fixture()
def fake_nvrtc(monkeypatch):
    """NVRTC and the driver replaced: ``calls`` records each compile's program text and options."""
    calls = []

    def fake_compile(text, name, key):
        calls.append((text, key.options))
        if "FAIL" in text:
            raise RuntimeError(f"NVRTC could not compile {name} for {key.arch} (stand-in)")
        return b"\x7fELF" + text.encode(), "ptxas info    : Used 40 registers"

    monkeypatch.setattr(nvrtc, "_BUILT", {})
    monkeypatch.setattr(nvrtc, "_KERNELS", {})
    monkeypatch.setattr(nvrtc, "_compile", fake_compile)
    monkeypatch.setattr(nvrtc, "bindings_missing", lambda: None)
    monkeypatch.setattr(nvrtc, "cuda_arch", lambda device: "sm_90a")
    monkeypatch.setattr(nvrtc, "_index", lambda device: 0)
    monkeypatch.setattr(nvrtc, "get_function", lambda device, cubin, kernel, smem=0: ("fn", cubin, kernel, smem))
    monkeypatch.delenv(nvrtc.PTXAS_VERBOSE_ENV, raising=False)
    monkeypatch.delenv(nvrtc.DUMP_CUBIN_ENV, raising=False)
    return calls


def test_one_build_per_key_and_a_failure_is_not_retried(fake_nvrtc):
    a = nvrtc.compile_cubin(SRC, "k.cu", "sm_90a", {"N": 1})
    assert nvrtc.compile_cubin(SRC, "k.cu", "sm_90a", (("N", "1"),)) is a and len(fake_nvrtc) == 1
    assert a[0] == b"\x7fELF#define N 1\n" + SRC.encode()
    nvrtc.compile_cubin(SRC, "k.cu", "sm_80", {"N": 1})
    nvrtc.compile_cubin(SRC, "k.cu", "sm_90a", {"N": 1}, verbose=True)
    assert [opts for _, opts in fake_nvrtc] == [nvrtc.DEFAULT_OPTIONS] * 2 + [nvrtc.DEFAULT_OPTIONS + ("--ptxas-options=-v",)]
    for _ in range(2):
        with pytest.raises(RuntimeError, match="could not compile k.cu for sm_90a"):
            nvrtc.compile_cubin("FAIL", "k.cu", "sm_90a")
    assert len(fake_nvrtc) == 4  # the failed build ran once


def test_load_remembers_a_failure_warns_once_and_lets_the_caller_fall_back(fake_nvrtc):
    good = nvrtc.KernelSpec(SRC, "k.cu", "k", {"N": 2}, 1024, "the test kernel", "using the other one")
    bad = nvrtc.KernelSpec("FAIL" + SRC, "k.cu", "k", {"N": 2}, 0, "the broken kernel", "using the other one")
    fn = nvrtc.load("cuda", good)
    assert fn == ("fn", b"\x7fELF#define N 2\n" + SRC.encode(), "k", 1024)
    assert nvrtc.load("cuda", good) is fn and nvrtc.failure("cuda", good) is None
    with pytest.warns(UserWarning, match=r"^sglang-fp4-indexer: the broken kernel could not be built, loaded or "
                                         r"launched \(NVRTC could not compile k.cu .*\); using the other one$"):
        assert nvrtc.load("cuda", bad) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning, no second build
        assert nvrtc.load("cuda", bad) is None
        assert nvrtc.record_failure("cuda", bad, RuntimeError("again")).startswith("the broken kernel could not be")
    assert nvrtc.failure("cuda", bad).endswith("(NVRTC could not compile k.cu for sm_90a (stand-in))")
    assert len(fake_nvrtc) == 2
    # A launch failure of a loaded kernel: recorded, warned once, and load() falls back from then on.
    with pytest.warns(UserWarning, match=r"the test kernel could not be built, loaded or launched \(cuLaunchKernel"):
        why = nvrtc.record_failure("cuda", good, RuntimeError("cuLaunchKernel failed"))
    assert nvrtc.load("cuda", good) is None and nvrtc.failure("cuda", good) == why


def test_spec_equality_and_hash_follow_its_fields():
    a = nvrtc.KernelSpec(SRC, "k.cu", "k", {"N": 2})
    b = nvrtc.KernelSpec(SRC, "k.cu", "k", (("N", "2"),))
    assert a == b and hash(a) == hash(b) and a.defines == (("N", "2"),)
    assert a != nvrtc.KernelSpec(SRC, "k.cu", "k", {"N": 3}) and a != nvrtc.KernelSpec(SRC, "k.cu", "k", {"N": 2}, 8)


def test_inspection_variables(fake_nvrtc, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv(nvrtc.PTXAS_VERBOSE_ENV, "1")
    monkeypatch.setenv(nvrtc.DUMP_CUBIN_ENV, str(tmp_path / "dump"))
    cubin, log = nvrtc.compile_cubin(SRC, "k.cu", "sm_90a", {"N": 5})
    assert fake_nvrtc[-1][1] == nvrtc.DEFAULT_OPTIONS + ("--ptxas-options=-v",)
    assert "ptxas log of k.cu (sm_90a, {'N': '5'}):\nptxas info    : Used 40 registers" in capsys.readouterr().err
    (dumped,) = (tmp_path / "dump").glob("k-sm_90a-*.cubin")
    assert dumped.read_bytes() == cubin and dumped.with_suffix(".cu").read_text() == "#define N 5\n" + SRC


def test_ptxas_registers_reads_the_verbose_log():
    log = ("ptxas info    : Function properties for k\nptxas         .     0 bytes stack frame, 8 bytes spill stores, "
           "8 bytes spill loads\nptxas info    : Used 96 registers, used 5 barriers")
    assert nvrtc.ptxas_registers(log) == (96, 8)
    with pytest.raises(ValueError, match="no ptxas -v report"):
        nvrtc.ptxas_registers("")


def test_the_three_cuda_kernels_build_through_nvrtc_load(fake_nvrtc):
    """The store kernel, the planner and the Hopper scorer: each a KernelSpec built once per device, with the
    defines each kernel reads."""
    from sglang_fp4_indexer.ops import quantize, schedule, sm90

    store = quantize._store_spec(torch.bfloat16, torch.int64, 64, 2)
    assert store.defines == (("K_KIND", "0"), ("SLOT64", "1"), ("PAGE_SIZE", "64"), ("TOKENS_PER_GROUP", "2"))
    assert (store.kernel, store.what, store.fallback) == ("store_index_k", "the CUDA store kernel", "storing with Triton")
    assert quantize._store_spec(torch.bfloat16, torch.int64, 64, 2) is store
    planner = schedule._planner_spec()
    assert (planner.kernel, planner.defines, planner.what) == ("plan_paged_schedule", (), "the CUDA planner")
    config = sm90.Config.of_call(1, 64, torch.float32, True)
    scorer = sm90._spec(config)
    assert (scorer.kernel, scorer.smem, scorer.fallback) == ("fp4_paged_logits_sm90", config.smem_bytes,
                                                             "scoring it with the Triton kernels")
    assert scorer.what == "the Hopper kernel for next_n 1, 64 heads, torch.float32 logits, [B, next_n] lengths"
    for spec in (store, planner, scorer):
        assert nvrtc.load("cuda", spec)[2:] == (spec.kernel, spec.smem)
    assert len(fake_nvrtc) == 3


def test_a_real_build_leaves_the_interpreters_one_byte_bytes_intact():
    """NVRTC writes its log and cubin into the buffers it is given. An empty log has size 1, and ``b" " * 1`` is
    CPython's shared one-byte ``b" "``: had the build passed that, the NUL NVRTC writes would turn every later
    one-byte encode of a space in the process into a NUL byte (as it did in an FP4 server's profiler traces).
    A real build without ``-v`` (empty log) in a fresh interpreter, which then encodes a space."""
    import subprocess
    import sys

    if nvrtc.bindings_missing():
        pytest.skip(nvrtc.bindings_missing())
    code = ("from sglang_fp4_indexer.ops import nvrtc\n"
            f"cubin, log = nvrtc.compile_cubin({SRC!r}, 'k.cu', 'sm_90a', {{'N': 1}}, verbose=False)\n"
            "assert cubin[:4] == b'\\x7fELF' and log == '', (cubin[:4], log)\n"
            "assert ' '.encode()[0] == 32 and b' '[0] == 32, (' '.encode(), b' ')\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
