"""The gate: decisions for hand-written HF configs (through SGLang 0.5.23's own
DSA detection) and for every refusal reason; one log line per process."""

from __future__ import annotations

import logging

import pytest

from sglang_fp4_indexer import gate
from sglang_fp4_indexer.gate import Decision, DeviceFacts, ModelFacts, ServerFacts, decide

H200 = DeviceFacts("cuda", (9, 0), "H200")

DSV32 = {
    "architectures": ["DeepseekV32ForCausalLM"], "index_topk": 2048,
    "index_head_dim": 128, "index_n_heads": 64, "num_hidden_layers": 61,
    "kv_lora_rank": 512, "qk_rope_head_dim": 64,
}
GLM5 = {
    "architectures": ["GlmMoeDsaForCausalLM"], "index_topk": 2048,
    "index_head_dim": 128, "index_n_heads": 32, "num_hidden_layers": 78,
    "kv_lora_rank": 512, "qk_rope_head_dim": 64,
}
DSV4 = {"architectures": ["DeepseekV4ForCausalLM"], "index_topk": 512, "index_head_dim": 128, "index_n_heads": 64}
LLAMA = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32}

ON = ServerFacts(requested=True, page_size=64)


def _model(cfg):
    from sglang_fp4_indexer.sglang_plugin.facts import model_facts

    return model_facts(cfg)


@pytest.mark.sglang
def test_model_facts_from_sglang_detection():
    assert _model(DSV32) == ModelFacts("DeepseekV32ForCausalLM", True, False, 128, 64, 1)
    assert _model(GLM5) == ModelFacts("GlmMoeDsaForCausalLM", True, False, 128, 32, 1)
    v4 = _model(DSV4)
    assert (v4.is_dsa, v4.is_deepseek_v4) == (False, True)
    llama = _model(LLAMA)
    assert (llama.is_dsa, llama.is_deepseek_v4, llama.index_n_heads) == (False, False, None)
    # SGLang's rule: a DSA architecture without index_topk is not DSA.
    assert not _model({**DSV32, "index_topk": None}).is_dsa


@pytest.mark.sglang
@pytest.mark.parametrize("cfg", [DSV32, GLM5], ids=["deepseek-v3.2", "glm-5"])
def test_dsa_models_enabled(cfg):
    d = decide(_model(cfg), ON, H200)
    assert d.enabled and d.codes == () and d.fix == ""
    assert cfg["architectures"][0] in d.reason and f"{cfg['index_n_heads']} index heads" in d.reason


@pytest.mark.sglang
def test_deepseek_v4_points_to_sglang_flag():
    d = decide(_model(DSV4), ON, H200)
    assert not d.enabled and d.codes == ("deepseek_v4",)
    assert "--enable-deepseek-v4-fp4-indexer" in d.fix


@pytest.mark.sglang
def test_non_dsa_refused():
    d = decide(_model(LLAMA), ON, H200)
    assert not d.enabled and d.codes == ("not_dsa",) and "LlamaForCausalLM" in d.reason


def test_not_requested_is_off_and_silent(caplog):
    gate.reset_reports()
    d = decide(ModelFacts("DeepseekV32ForCausalLM", True, False, 128, 64), ServerFacts(requested=False), H200)
    assert d == Decision(False, "--enable-fp4-indexer not given", "", ("off",))
    with caplog.at_level(logging.INFO, logger="sglang_fp4_indexer"):
        assert gate.report(d) is False
    assert caplog.records == []


GOOD = ModelFacts("DeepseekV32ForCausalLM", True, False, 128, 64, 1)


@pytest.mark.parametrize(
    "model, server, device, code",
    [
        (ModelFacts("X", True, False, 64, 64), ON, H200, "index_head_dim"),
        (ModelFacts("X", True, False, 128, 48), ON, H200, "index_heads"),
        (ModelFacts("X", True, False, 128, 256), ON, H200, "index_heads"),
        (ModelFacts("X", True, False, 128, 64, 4), ServerFacts(True, page_size=256), H200, "index_kpool"),
        (GOOD, ServerFacts(True, page_size=1), H200, "page_size"),
        (GOOD, ON, DeviceFacts("cuda", (8, 0), "A100"), "device"),
        (GOOD, ON, DeviceFacts("cuda", None), "device"),
        (GOOD, ON, DeviceFacts("rocm"), "device"),
        (GOOD, ON, DeviceFacts("cpu"), "device"),
        (GOOD, ServerFacts(True, 64, attn_cp_size=2), H200, "prefill_cp"),
        (GOOD, ServerFacts(True, 64, enable_prefill_cp=True), H200, "prefill_cp"),
        (GOOD, ServerFacts(True, 64, kv_shard=True), H200, "kv_shard"),
        (GOOD, ServerFacts(True, 64, hicache=True, dcp_size=2), H200, "hicache_dcp"),
        (GOOD, ServerFacts(True, 64, hicache=True, hicache_storage="file"), H200, "hicache_storage"),
        (GOOD, ServerFacts(True, 64, hisparse=True), H200, "hisparse"),
        (GOOD, ServerFacts(True, 64, disaggregation_mode="decode", dcp_size=2), H200, "pd_dcp"),
        (GOOD, ServerFacts(True, 64, hybrid_pool="hybrid sliding-window (SWA)"), H200, "hybrid_pool"),
        (GOOD, ServerFacts(True, 64, unified_memory=True), H200, "unified_memory"),
        (GOOD, ServerFacts(True, 64, external_kv_store="flexkv"), H200, "external_kv_store"),
    ],
)
def test_each_refusal(model, server, device, code):
    d = decide(model, server, device)
    assert not d.enabled
    assert d.codes == (code,)
    assert d.reason and d.fix


@pytest.mark.parametrize("server", [
    ServerFacts(True, 64, hicache=True),
    ServerFacts(True, 64, disaggregation_mode="prefill"),
    ServerFacts(True, 64, disaggregation_mode="decode", hicache=True),
    ServerFacts(True, 64, hicache_storage="file"),  # a storage backend without the hierarchical cache is unused
], ids=["hicache", "pd-prefill", "pd-decode-hicache", "storage-without-hicache"])
def test_hierarchical_cache_and_pd_are_served(server):
    assert decide(GOOD, server, H200).enabled


def test_interleaved_indexer_rope_is_served_with_the_plugins_rotation():
    """Interleaved indexer RoPE (GLM-5.x): SGLang's fused indexer skips the Hadamard rotation, the plugin's hooks
    apply it with the FP4 cache, so FP4 is served with fusion on or off; the text says who rotates."""
    interleaved = ModelFacts("GlmMoeDsaForCausalLM", True, False, 128, 32, 1, True)
    assert decide(interleaved, ON, H200).enabled
    assert decide(interleaved, ServerFacts(True, 64, indexer_fusion_disabled=True), H200).enabled
    rotated, text = gate.index_key_rotation(interleaved, ON)
    assert rotated is True and "the plugin applies SGLang's rotation to the index queries and keys" in text
    assert "SGLang's unfused indexer" in gate.index_key_rotation(
        interleaved, ServerFacts(True, 64, indexer_fusion_disabled=True))[1]
    assert gate.index_key_rotation(GOOD, ON)[0] is True
    # Off CUDA the device refusal alone applies.
    assert decide(interleaved, ON, DeviceFacts("rocm")).codes == ("device",)


@pytest.mark.sglang
def test_interleaved_indexer_rope_is_read_as_sglangs_models_read_it():
    """The fact mirrors SGLang 0.5.23's choice of the fused (unrotated) indexer; if an upgrade moves it, this names
    the site: DeepSeek-V2-family layers (DeepSeek-V3.2, GLM-5.x) take ``is_neox_style`` from
    ``indexer_rope_interleave``, Dots3 always builds interleaved, the Indexer fuses (and skips the rotation)
    exactly for interleaved RoPE on CUDA unless SGLANG_DISABLE_DSA_INDEXER_FUSION is set."""
    import inspect

    from sglang.srt.layers.attention.dsa import dsa_indexer
    from sglang.srt.models import deepseek_v2
    from sglang.srt.models.dots3_common import modeling as dots3

    from sglang_fp4_indexer.sglang_plugin.facts import indexer_fusion_disabled, indexer_rope_interleaved

    assert 'is_neox_style = not getattr(config, "indexer_rope_interleave", False)' in inspect.getsource(deepseek_v2)
    assert "is_neox_style=False" in inspect.getsource(dots3)
    init = " ".join(inspect.getsource(dsa_indexer.Indexer.__init__).split())
    assert ("self.use_dsa_indexer_fusion = ( _is_cuda and not envs.SGLANG_DISABLE_DSA_INDEXER_FUSION.get() "
            "and not is_neox_style )") in init
    rotate = " ".join(inspect.getsource(dsa_indexer.Indexer._maybe_rotate).split())
    assert "if self.use_dsa_indexer_fusion or self.use_aiter_fused_fp8_writer: return x" in rotate
    for cfg, want in ((GLM5, False), ({**GLM5, "indexer_rope_interleave": True}, True), (DSV32, False),
                      ({**DSV32, "architectures": ["Dots3NoteForCausalLM"]}, True)):
        assert indexer_rope_interleaved(cfg) is want and _model(cfg).indexer_rope_interleave is want
    assert indexer_fusion_disabled() is False


def test_page_size_default_and_supported_heads():
    # None = left to SGLang, which sets 64 for DSA models.
    assert decide(GOOD, ServerFacts(True, page_size=None), H200).enabled
    assert decide(GOOD, ON, DeviceFacts("cuda", (8, 9))).enabled  # Ada is the floor
    from sglang_fp4_indexer.ops.paged_logits import SUPPORTED_HEADS

    assert gate.supported_heads() == tuple(SUPPORTED_HEADS)
    for h in SUPPORTED_HEADS:
        assert decide(ModelFacts("X", True, False, 128, h), ON, H200).enabled


def test_all_reasons_listed_in_order_and_deterministic():
    server = ServerFacts(True, 64, dcp_size=4, hisparse=True)
    model = ModelFacts("X", True, False, 128, 48)
    d1 = decide(model, server, DeviceFacts("cuda", (8, 0)))
    d2 = decide(model, server, DeviceFacts("cuda", (8, 0)))
    assert d1 == d2
    assert d1.codes == ("index_heads", "device", "hisparse")
    assert "HiSparse" in d1.reason and "48" in d1.reason


def test_bad_arguments():
    with pytest.raises(TypeError, match="model"):
        decide({"architectures": []}, ON, H200)
    with pytest.raises(TypeError, match="server"):
        decide(GOOD, None, H200)
    with pytest.raises(TypeError, match="device"):
        decide(GOOD, ON, "cuda")
    with pytest.raises(TypeError, match="decision"):
        gate.report("enabled")


def test_exactly_one_warning_per_process(caplog):
    gate.reset_reports()
    refused = decide(GOOD, ServerFacts(True, 64, hisparse=True), H200)
    with caplog.at_level(logging.INFO, logger="sglang_fp4_indexer"):
        assert gate.report(refused, rank=1) is False  # not rank 0
        assert gate.report(refused) is True
        for _ in range(3):
            assert gate.report(refused) is False
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    msg = warnings[0].getMessage()
    assert msg.startswith("FP4 indexer disabled") and "HiSparse" in msg and "Fix:" in msg


def test_active_line_once(caplog):
    gate.reset_reports()
    d = decide(GOOD, ON, H200)
    with caplog.at_level(logging.INFO, logger="sglang_fp4_indexer"):
        assert gate.report(d) is True
        assert gate.report(d) is False
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(infos) == 1 and infos[0].startswith("FP4 indexer active") and "68 B/token/layer" in infos[0]
    gate.reset_reports()
