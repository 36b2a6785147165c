"""Helpers for the plugin tests (tests/test_plugin_*.py); not a test module.

``load()`` runs SGLang's own ``load_plugins()`` in the test process with the
whitelist set to this plugin, so the hooks are applied to the real SGLang
0.5.23 classes exactly as in a server process. ``published()`` publishes a
runtime context with SGLang's own test helper (``published_topology``), which
is what a scheduler process has after its ``publish`` call.
"""

from __future__ import annotations

import os
import types

import pytest
import torch

from sglang_fp4_indexer.gate import DeviceFacts

ENTRY = "fp4_indexer"
H200 = DeviceFacts("cuda", (9, 0), "H200 (stand-in: no GPU on the CPU test machine)")

DSV32 = {
    "architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32", "index_topk": 2048,
    "index_head_dim": 128, "index_n_heads": 64, "num_hidden_layers": 61,
    "kv_lora_rank": 512, "qk_rope_head_dim": 64,
}
GLM5 = {
    "architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa", "index_topk": 2048,
    "index_head_dim": 128, "index_n_heads": 32, "num_hidden_layers": 78,
    "kv_lora_rank": 512, "qk_rope_head_dim": 64,
}
#: GLM-5.2: GLM-5's geometry with interleaved indexer RoPE (SGLang's DeepSeek-V2 model reads
#: ``indexer_rope_interleave`` and builds the Indexer with ``is_neox_style=False``).
GLM52 = {**GLM5, "indexer_rope_interleave": True}
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 32}


def load() -> None:
    """SGLang's ``load_plugins()`` with ``SGLANG_PLUGINS`` naming only this plugin (idempotent)."""
    os.environ.setdefault("SGLANG_PLUGINS", ENTRY)
    from sglang.srt.plugins import load_plugins

    load_plugins()


def published(**server_args_fields):
    """SGLang's ``published_topology`` context manager (a dummy-model ``ServerArgs`` published as in a scheduler)."""
    from sglang.test.test_utils import published_topology

    return published_topology(**server_args_fields)


def hf_config(cfg: dict):
    """An object with the HF config's attributes (what ``ModelConfig.hf_config`` is to SGLang's helpers)."""
    return types.SimpleNamespace(**cfg)


def stand_in_kvc(cfg: dict, server_args, *, num_layers: int | None = None, is_draft_worker: bool = False):
    """Stands for ``KVCacheConfigurator``: ModelRunner builds it on a GPU from a loaded model.

    Its ``device`` is ``"cpu"`` so the real pool classes allocate here; the
    gate's device facts are given separately (``H200``).

    Carries the attributes SGLang's ``_build_dsa_kv_pool`` / sizing methods and
    the plugin's ``decision_for_kvc`` read. ``loc_space_scale`` and
    ``pool_page_size`` are SGLang's own properties evaluated on it (under
    ``--dcp-size W`` a draft worker's are ``W`` and ``64 * W``), so call it
    inside the published runtime context the test describes.
    """
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator

    layers = cfg.get("num_hidden_layers", 2) if num_layers is None else num_layers
    model_config = types.SimpleNamespace(
        hf_config=hf_config(cfg),
        kv_lora_rank=cfg.get("kv_lora_rank", 512),
        qk_rope_head_dim=cfg.get("qk_rope_head_dim", 64),
    )
    layer_info = types.SimpleNamespace(start_layer=0, end_layer=layers, num_effective_layers=layers)
    kvc = types.SimpleNamespace(
        model_config=model_config, server_args=server_args, is_draft_worker=is_draft_worker,
        device="cpu", gpu_id=0, page_size=64, kv_shard_rank=None,
        is_hybrid_swa=False, mambaish_config=None, layer_info=layer_info,
        kv_cache_dtype=torch.bfloat16, use_mla_backend=True,
    )
    kvc.loc_space_scale = KVCacheConfigurator.loc_space_scale.fget(kvc)
    kvc.pool_page_size = KVCacheConfigurator.pool_page_size.fget(kvc)
    return kvc


@pytest.fixture()
def plugin(monkeypatch):
    """Hooks applied; the gate sees an H200 (there is no GPU here); pool state and reports reset around the test.

    Yields ``sglang_fp4_indexer.sglang_plugin.kv_pool``. Import it into a test module to use it.
    """
    load()
    from sglang_fp4_indexer import gate
    from sglang_fp4_indexer.sglang_plugin import facts
    from sglang_fp4_indexer.sglang_plugin import kv_pool as pool

    monkeypatch.setattr(facts, "device_facts", lambda *a, **k: H200)
    monkeypatch.delenv("SGLANG_ENABLE_FP4_INDEXER", raising=False)
    pool.reset_state()
    gate.reset_reports()
    yield pool
    pool.reset_state()
    gate.reset_reports()


def server_args(*flags):
    """SGLang's own ``prepare_server_args`` on ``--model-path dummy FLAGS`` (plugins loaded: the flag parses)."""
    from sglang.srt.server_args import prepare_server_args

    return prepare_server_args(["--model-path", "dummy", *flags])
