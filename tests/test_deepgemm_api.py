"""DeepGEMM's index-logits API across sgl-deep-gemm versions (``ops.deepgemm``).

The kernels need a GPU; here the entry points are recorders carrying the real
Python signatures: those of the installed sgl-deep-gemm 0.2.3.post2 (what
SGLang 0.5.23 pins; read from the module with ``inspect``) and those of
sgl-deep-gemm 0.2.5 (copied from its ``deep_gemm/__init__.py``), so every call
the adapter makes is bound against the real parameter list. The GPU run of the
prefill route through DeepGEMM is ``tests/test_ragged_logits.py::test_deepgemm_impl_against_reference``.
"""

from __future__ import annotations

import inspect
import sys
import types
import warnings

import pytest
import torch

from sglang_fp4_indexer.ops import deepgemm

# sgl-deep-gemm 0.2.5's Python entry points (deep_gemm/__init__.py of its wheel), bodies left out.
_V025 = '''
def fp8_fp4_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len, indices=None): ...
def fp8_fp4_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, max_seqlen_k, schedule_meta=None): ...
def get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms, indices=None): ...
'''
_NAMES = ("fp8_mqa_logits", "fp8_fp4_mqa_logits", "fp8_paged_mqa_logits", "fp8_fp4_paged_mqa_logits",
          "get_paged_mqa_logits_metadata")


def _recording(signatures: dict) -> tuple[types.ModuleType, list]:
    """A module standing for ``deep_gemm`` whose functions bind each call to the given signature and record it."""
    calls = []
    module = types.ModuleType("deep_gemm")
    for name, sig in signatures.items():
        def fn(*args, _name=name, _sig=sig, **kwargs):
            bound = _sig.bind(*args, **kwargs)  # a TypeError if the adapter calls it the wrong way
            calls.append((_name, dict(bound.arguments)))
            return _name

        fn.__signature__ = sig
        setattr(module, name, fn)
    return module, calls


def _v023():
    import deep_gemm  # the installed sgl-deep-gemm 0.2.3.post2 (its Python layer imports without a GPU)

    return _recording({n: inspect.signature(getattr(deep_gemm, n)) for n in _NAMES if hasattr(deep_gemm, n)})


def _v025():
    space: dict = {}
    exec(_V025, space)
    return _recording({n: inspect.signature(f) for n, f in space.items() if callable(f)})


def test_installed_version_is_the_one_sglang_pins():
    import deep_gemm

    assert deepgemm.read_api(deep_gemm).version == "0.2.3.post2"


def test_sgl_deep_gemm_0_2_3_calls():
    module, calls = _v023()
    found = deepgemm.read_api(module, "0.2.3.post2")
    assert found.ragged_problem is None and found.paged_problem is None
    q, kv, w, ks, ke = "q", ("values", "scales"), "w", "ks", "ke"
    assert found.ragged(q, kv, w, ks, ke, False, torch.float32) == "fp8_mqa_logits"
    assert calls[-1] == ("fp8_mqa_logits", {"q": q, "kv": kv, "weights": w, "ks": ks, "ke": ke, "clean_logits": False})
    assert found.ragged(q, kv, w, ks, ke, True, torch.float32) == "fp8_mqa_logits" and calls[-1][1]["clean_logits"]
    assert found.ragged(q, kv, w, ks, ke, True, torch.bfloat16) == "fp8_fp4_mqa_logits"
    assert calls[-1] == ("fp8_fp4_mqa_logits", {
        "q": (q, None), "kv": kv, "weights": w, "cu_seq_len_k_start": ks, "cu_seq_len_k_end": ke,
        "clean_logits": True, "max_seqlen_k": 0, "logits_dtype": torch.bfloat16})
    assert found.paged("q", "cache", "w", "lens", "bt", "sched", 4096, False) == "fp8_paged_mqa_logits"
    assert calls[-1] == ("fp8_paged_mqa_logits", {
        "q": "q", "kv_cache": "cache", "weights": "w", "context_lens": "lens", "block_table": "bt",
        "schedule_meta": "sched", "max_context_len": 4096, "clean_logits": False})


def test_sgl_deep_gemm_0_2_5_calls():
    """0.2.5: the paged scorer is fp8_fp4_paged_mqa_logits without clean_logits; the ragged one writes compressed
    logits only, so the prefill route keeps the Triton scorer and says why."""
    module, calls = _v025()
    found = deepgemm.read_api(module, "0.2.5")
    assert found.ragged is None
    assert found.ragged_problem == (
        "DeepGEMM 0.2.5 has no fp8_mqa_logits, and its fp8_fp4_mqa_logits(q, kv, weights, cu_seq_len_k_start, "
        "cu_seq_len_k_end, max_seqlen_k, schedule_meta) writes compressed logits (each row from its own ks), not "
        "the absolute columns SGLang's top-k reads")
    assert found.paged("q", "cache", "w", "lens", "bt", "sched", 4096, False) == "fp8_fp4_paged_mqa_logits"
    assert calls[-1] == ("fp8_fp4_paged_mqa_logits", {
        "q": "q", "kv_cache": "cache", "weights": "w", "context_lens": "lens", "block_table": "bt",
        "schedule_meta": "sched", "max_context_len": 4096})
    with pytest.raises(ValueError, match="^clean_logits: DeepGEMM 0.2.5's fp8_fp4_paged_mqa_logits does not clean"):
        found.paged("q", "cache", "w", "lens", "bt", "sched", 4096, True)


def test_compiled_entry_points_without_a_signature_are_called_as_0_2_3s():
    """A DeepGEMM build whose functions are compiled (no readable Python signature) is called positionally, as
    sgl-deep-gemm 0.2.3's are."""
    calls = []
    module = types.ModuleType("deep_gemm")
    for name in ("fp8_mqa_logits", "fp8_paged_mqa_logits"):
        def fn(*args, _name=name):
            calls.append((_name, args))
            return _name

        fn.__signature__ = "compiled"  # inspect.signature raises on it, as on a compiled function
        setattr(module, name, fn)
    assert deepgemm._params(module.fp8_mqa_logits) == ()
    found = deepgemm.read_api(module, "0.2.3")
    assert found.ragged("q", "kv", "w", "ks", "ke", True, torch.float32) == "fp8_mqa_logits"
    assert calls[-1] == ("fp8_mqa_logits", ("q", "kv", "w", "ks", "ke", True))
    assert found.paged("q", "c", "w", "l", "bt", "s", 64, False) == "fp8_paged_mqa_logits"
    assert calls[-1] == ("fp8_paged_mqa_logits", ("q", "c", "w", "l", "bt", "s", 64, False))


def test_no_deep_gemm_and_an_unknown_one():
    assert deepgemm.read_api(None).ragged_problem == "the deep_gemm package is not installed or does not import"
    empty = deepgemm.read_api(types.ModuleType("deep_gemm"), "9.9")
    assert empty.ragged is None and empty.paged is None
    assert empty.ragged_problem == "DeepGEMM 9.9 has neither fp8_mqa_logits nor fp8_fp4_mqa_logits"
    assert empty.paged_problem.startswith("DeepGEMM 9.9 has neither fp8_paged_mqa_logits nor fp8_fp4_paged_mqa_logits")


@pytest.fixture()
def installed_0_2_5(monkeypatch):
    """``import deep_gemm`` finds the 0.2.5 stand-in; the cached reading is redone around the test."""
    module, _ = _v025()
    monkeypatch.setitem(sys.modules, "deep_gemm", module)
    deepgemm.api.cache_clear()
    yield module
    deepgemm.api.cache_clear()


def test_prefill_falls_back_with_the_reason_warned_once(installed_0_2_5):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        first, again = deepgemm.api(), deepgemm.api()
    assert first is again and first.ragged is None and first.paged is not None
    texts = [str(w.message) for w in seen]
    assert len(texts) == 1 and texts[0].startswith("sglang-fp4-indexer: DeepGEMM ")
    assert texts[0].endswith("writes compressed logits (each row from its own ks), not the absolute columns "
                             "SGLang's top-k reads; prefill scores with the Triton kernels")


def test_benchmark_peer_loads_either_version(installed_0_2_5):
    """The benchmark's DeepGEMM FP8 peer needs only a paged scorer and the planner: 0.2.5 has both."""
    from sglang_fp4_indexer.bench.peers import load_deep_gemm

    assert load_deep_gemm() is installed_0_2_5
    del installed_0_2_5.fp8_fp4_paged_mqa_logits
    with pytest.raises(AttributeError, match="has neither fp8_paged_mqa_logits nor fp8_fp4_paged_mqa_logits"):
        load_deep_gemm()
