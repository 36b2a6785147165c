"""Which kernels serve, and why (``ops.serving``), and that the Hopper availability check builds nothing.

On the CPU the Hopper device is a stand-in: ``sm90.unavailable_reason`` /
``sm90.serving_unavailable`` (which need a CUDA device) are replaced by what an
H200 with ``cuda-bindings`` answers; the GPU tests ask the real device.
"""

from __future__ import annotations

import pytest
import torch

from sglang_fp4_indexer.ops import nvrtc, serving, sm90
from sglang_fp4_indexer.ops.paged_logits import MAX_NEXT_N

BINDINGS = "cuda-bindings is not installed (pip install 'sglang-fp4-indexer[cuda]')"


@pytest.fixture()
def hopper(monkeypatch):
    """An H200 with cuda-bindings, as sm90 and nvrtc see it (stand-in: there is no GPU here)."""
    monkeypatch.setattr(sm90, "unavailable_reason", lambda device: None)
    monkeypatch.setattr(sm90, "serving_unavailable", lambda *a: None)
    monkeypatch.setattr(nvrtc, "bindings_missing", lambda: None)


@pytest.mark.parametrize("heads", [16, 32, 64, 128])
def test_request_form_only_where_the_hopper_kernel_takes_it(hopper, heads):
    """The Hopper kernel holds next_n x heads x 128 bytes of index queries in 32 KB of shared memory."""
    for next_n in range(1, MAX_NEXT_N + 2):
        fits = next_n * heads * 128 <= 32 * 1024
        assert serving.verify_request_form("cuda", heads, next_n) == (2 <= next_n <= MAX_NEXT_N and fits), next_n
    assert [n for n in range(2, 9) if serving.verify_request_form("cuda", 64, n)] == [2, 3, 4]


def test_request_form_where_the_triton_scorer_serves():
    for heads in (32, 64):
        assert [n for n in range(0, MAX_NEXT_N + 2) if serving.verify_request_form("cpu", heads, n)] == \
            list(range(2, MAX_NEXT_N + 1))


def test_describe_names_the_kernels_and_why(hopper, monkeypatch):
    assert serving.describe("cuda", 64) == \
        "scorer: Hopper CUDA kernel (decode); store and CTA planner: CUDA kernels"
    assert serving.describe("cuda", 64, 3) == ("scorer: Hopper CUDA kernel (decode; target verify next_n 3, one pass "
                                               "per request); store and CTA planner: CUDA kernels")
    assert serving.describe("cuda", 64, 5) == (
        "scorer: Hopper CUDA kernel (decode; target verify next_n 5 per row, as SGLang hands it over: 5 x 64 heads "
        "of index queries exceed the Hopper kernel's 32 KB of shared memory for them); store and CTA planner: "
        "CUDA kernels")
    # A decode build that fails to load names the failure and the Triton kernels.
    monkeypatch.setattr(sm90, "serving_unavailable", lambda *a: "the Hopper kernel ... could not be built (boom)")
    assert serving.describe("cuda", 32).startswith(
        "scorer: Triton kernels (the Hopper kernel ... could not be built (boom)); store and CTA planner: CUDA")


def test_describe_without_cuda_bindings(monkeypatch):
    """Without cuda-bindings the scorer, the store and the planner all run Triton: the line says so and why."""
    monkeypatch.setattr(sm90, "unavailable_reason", lambda device: BINDINGS)
    monkeypatch.setattr(nvrtc, "bindings_missing", lambda: BINDINGS)
    assert serving.describe("cuda", 64, 2) == (f"scorer: Triton kernels ({BINDINGS}); target verify next_n 2: one "
                                               f"pass per request; store and CTA planner: Triton kernels ({BINDINGS})")


def test_describe_on_the_cpu():
    assert serving.describe("cpu", 32) == ("scorer: Triton kernels (not an NVIDIA CUDA device); store and CTA "
                                           "planner: Triton kernels (not an NVIDIA CUDA device)")


def test_hopper_availability_builds_nothing(monkeypatch):
    """The check answers from the device and cuda-bindings; no probe kernel is built (serving builds its own)."""
    def no_build(*args, **kwargs):
        raise AssertionError("unavailable_reason built a kernel")

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(nvrtc, "bindings_missing", lambda: None)
    monkeypatch.setattr(sm90, "build", no_build)
    monkeypatch.setattr(nvrtc, "get_function", no_build)
    assert sm90.unavailable_reason(torch.device("cuda", 0)) is None
    monkeypatch.setattr(nvrtc, "bindings_missing", lambda: BINDINGS)
    assert sm90.unavailable_reason(torch.device("cuda", 0)) == BINDINGS


@pytest.mark.gpu
def test_describe_on_this_gpu():
    """On an H200 with cuda-bindings: the Hopper kernel serves decode and verify up to next_n 4 at 64 heads."""
    if sm90.unavailable_reason("cuda") is not None:
        pytest.skip(f"the Hopper kernel does not serve here: {sm90.unavailable_reason('cuda')}")
    built = len(nvrtc._BUILT)
    sm90.unavailable_reason("cuda")
    assert len(nvrtc._BUILT) == built  # the check builds nothing
    assert serving.describe("cuda", 64, 5).startswith(
        "scorer: Hopper CUDA kernel (decode; target verify next_n 5 per row, as SGLang hands it over")
    assert serving.describe("cuda", 32, 8).startswith(
        "scorer: Hopper CUDA kernel (decode; target verify next_n 8, one pass per request)")
    assert serving.describe("cuda", 64).endswith("store and CTA planner: CUDA kernels")
    assert [n for n in range(2, 9) if serving.verify_request_form("cuda", 64, n)] == [2, 3, 4]


def test_describe_names_a_head_count_the_hopper_kernel_has_no_build_for(monkeypatch):
    """On Hopper, a head count outside sm90's builds is scored by Triton, and the line says why (no exception)."""
    monkeypatch.setattr(sm90, "unavailable_reason", lambda device: None)
    monkeypatch.setattr(nvrtc, "bindings_missing", lambda: None)
    assert serving.describe("cuda", 48) == (
        "scorer: Triton kernels (the Hopper kernel has no build for next_n 1, 48 heads (heads: expected one of "
        "(16, 32, 64, 128), got 48)); store and CTA planner: CUDA kernels")
