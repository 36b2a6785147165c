"""Read the gate's facts off SGLang 0.5.23 objects (no numerics here).

The gate (``sglang_fp4_indexer.gate``) decides from three plain records; this
module fills them from what SGLang has at hand: the HF config (through SGLang's
own ``is_deepseek_dsa`` / ``get_dsa_index_head_dim`` / ``get_dsa_index_n_heads``
/ ``get_dsa_index_kpool``), a ``ServerArgs`` record (raw or resolved, read
through SGLang's ``resolution_result``), the runtime context where one is
published, and the ``KVCacheConfigurator`` that sizes and builds the pools.
"""

from __future__ import annotations

import os

import torch

from ..gate import Decision, DeviceFacts, ModelFacts, ServerFacts, decide, report

__all__ = [
    "ENV_VAR",
    "ATTR",
    "DCP_SHARD_ENV_VAR",
    "DCP_SHARD_ATTR",
    "env_flag",
    "env_setting",
    "requested",
    "mark_requested",
    "dcp_shard_requested",
    "mark_dcp_shard",
    "model_facts",
    "server_facts",
    "device_facts",
    "global_rank",
    "decision_for_kvc",
    "server_field",
    "index_layer_count",
    "indexer_rope_interleaved",
    "indexer_fusion_disabled",
]

#: Environment variable that also asks for the FP4 indexer ("1"/"true"/"yes"/"on").
ENV_VAR = "SGLANG_ENABLE_FP4_INDEXER"
#: Underscore attribute carried on ``ServerArgs`` (kept by ``ServerArgs.__reduce__``).
ATTR = "_enable_fp4_indexer"
#: Environment variable that also asks for the sharded FP4 index under DCP (``--fp4-indexer-dcp-shard``).
DCP_SHARD_ENV_VAR = "SGLANG_FP4_INDEXER_DCP_SHARD"
#: Underscore attribute carrying ``--fp4-indexer-dcp-shard`` on ``ServerArgs``.
DCP_SHARD_ATTR = "_fp4_indexer_dcp_shard"


#: Values of the plugin's environment variables (case-insensitive, surrounding blanks ignored).
_ON, _OFF = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def env_flag(name: str) -> bool:
    """The boolean value of the environment variable ``name`` (unset or empty: False).

    Raises:
        ValueError: a value that is neither on (``1``/``true``/``yes``/``on``) nor
            off (``0``/``false``/``no``/``off``/empty), naming the variable: a
            typo must not silently leave the FP4 indexer off.
    """
    return bool(env_setting(name))


def env_setting(name: str) -> bool | None:
    """What the environment variable ``name`` decides: True (on), False (off), None (unset or empty: nothing).

    A variable set to an on or off value wins over the command line and the
    ``--config`` file (docs/user-guide.md, "Which setting wins").

    Raises:
        ValueError: a value that is neither on (``1``/``true``/``yes``/``on``) nor
            off (``0``/``false``/``no``/``off``/empty), naming the variable.
    """
    raw = os.environ.get(name)
    value = (raw or "").strip().lower()
    if not value:
        return None
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise ValueError(f"{name}={raw!r}: expected 1, true, yes or on to enable, or 0, false, no, off or empty "
                     "to disable")


def requested(server_args) -> bool:
    """Whether the FP4 indexer was asked for.

    ``$SGLANG_ENABLE_FP4_INDEXER`` set to an on or off value decides
    (``env_setting``); otherwise True when ``server_args._enable_fp4_indexer``
    is set (the command line, which SGLang merges over the ``--config`` file),
    or (in a scheduler process, where SGLang has published its record) the
    published record carries it.

    Args:
        server_args: a ``ServerArgs`` record (or None: the published record and
            the environment count).

    Raises:
        ValueError: ``$SGLANG_ENABLE_FP4_INDEXER`` holds neither an on nor an off value.
    """
    return _flag(server_args, ATTR, ENV_VAR)


def _flag(server_args, attr: str, env_var: str) -> bool:
    """A plugin flag: the environment when it is set, else the record or the record SGLang published here."""
    env = env_setting(env_var)
    if env is not None:
        return env
    if getattr(server_args, attr, False):
        return True
    try:
        from sglang.srt.runtime_context import get_server_args

        published = get_server_args()
    except Exception:  # nothing published in this process
        return False
    return published is not server_args and bool(getattr(published, attr, False))


def dcp_shard_requested(server_args) -> bool:
    """Whether the sharded index was asked for: ``$SGLANG_FP4_INDEXER_DCP_SHARD`` when set, else ``--fp4-indexer-dcp-shard``.

    Args:
        server_args: a ``ServerArgs`` record (or None).

    Raises:
        ValueError: ``$SGLANG_FP4_INDEXER_DCP_SHARD`` holds neither an on nor an off value.
    """
    return _flag(server_args, DCP_SHARD_ATTR, DCP_SHARD_ENV_VAR)


def mark_dcp_shard(server_args, value: bool = True) -> None:
    """Record ``--fp4-indexer-dcp-shard`` on a ``ServerArgs`` record (underscore attribute, as ``mark_requested``).

    Raises:
        TypeError: ``value`` is not a bool.
    """
    if not isinstance(value, bool):
        raise TypeError(f"value: expected a bool, got {type(value).__name__}")
    setattr(server_args, DCP_SHARD_ATTR, value)


def mark_requested(server_args, value: bool = True) -> None:
    """Record the flag on a ``ServerArgs`` record as an underscore attribute.

    ``ServerArgs`` is a sealed msgspec record (no new fields), but it keeps
    underscore bookkeeping attributes in its ``__dict__`` and ``__reduce__``
    carries them to the scheduler processes (the same way SGLang carries
    ``_launch_command``). Allowed before and after resolution.

    Raises:
        TypeError: ``value`` is not a bool.
    """
    if not isinstance(value, bool):
        raise TypeError(f"value: expected a bool, got {type(value).__name__}")
    setattr(server_args, ATTR, value)


def model_facts(hf_config) -> ModelFacts:
    """Gate facts of a model, through SGLang's own DSA detection.

    Args:
        hf_config: a ``transformers.PretrainedConfig``, a dict (``config.json``)
            or any object with the config's attributes.
    """
    from types import SimpleNamespace

    from sglang.srt.configs.model_config import (
        get_dsa_index_head_dim,
        get_dsa_index_kpool,
        get_dsa_index_n_heads,
        is_deepseek_dsa,
        is_deepseek_v4,
    )

    cfg = SimpleNamespace(**hf_config) if isinstance(hf_config, dict) else hf_config
    archs = getattr(cfg, "architectures", None) or [None]
    is_dsa = bool(is_deepseek_dsa(cfg))
    is_v4 = bool(is_deepseek_v4(cfg))
    head_dim = n_heads = None
    if is_dsa:
        head_dim = getattr(cfg, "index_head_dim", None) and get_dsa_index_head_dim(cfg)
        n_heads = getattr(cfg, "index_n_heads", None) and get_dsa_index_n_heads(cfg)
    kpool = get_dsa_index_kpool(cfg)
    return ModelFacts(
        architecture=archs[0],
        is_dsa=is_dsa,
        is_deepseek_v4=is_v4,
        index_head_dim=head_dim,
        index_n_heads=n_heads,
        index_kpool=int(kpool) if kpool is not None else 1,
        indexer_rope_interleave=indexer_rope_interleaved(cfg),
    )


def indexer_rope_interleaved(hf_config) -> bool:
    """Whether SGLang 0.5.23 builds this model's DSA ``Indexer`` with interleaved RoPE (``is_neox_style=False``).

    The DeepSeek-V2 family (DeepSeek-V3.2, GLM-5.x) reads the config's
    ``indexer_rope_interleave`` (``models/deepseek_v2.py``:
    ``is_neox_style = not getattr(config, "indexer_rope_interleave", False)``);
    ``gate.INTERLEAVED_INDEXER_ARCHS`` always are.

    Args:
        hf_config: a ``transformers.PretrainedConfig``, a dict or any object with the config's attributes.
    """
    from ..gate import INTERLEAVED_INDEXER_ARCHS

    get = hf_config.get if isinstance(hf_config, dict) else lambda key, default=None: getattr(hf_config, key, default)
    archs = get("architectures", None) or [None]
    return archs[0] in INTERLEAVED_INDEXER_ARCHS or bool(get("indexer_rope_interleave", False))


def server_field(server_args, name: str, default):
    """One ``ServerArgs`` field read through SGLang's ``resolution_result`` (``default`` when unset or None).

    Args:
        server_args: a ``ServerArgs`` record (raw or resolved).
        name: the field name, e.g. ``"kv_cache_dtype"``.
        default: returned when the record has no value.
    """
    from sglang.srt.arg_groups.overrides import resolution_result

    value = resolution_result(server_args, name, default)
    return default if value is None else value


def server_facts(
    server_args,
    *,
    page_size: int | None = None,
    kv_shard: bool = False,
    hybrid_pool: str = "",
) -> ServerFacts:
    """Gate facts of a server configuration.

    Fields are read through SGLang's ``resolution_result`` (the resolved value
    when the record was resolved, its raw input otherwise). Where a runtime
    context is published (scheduler processes) its parallel widths win.

    Args:
        server_args: a ``ServerArgs`` record.
        page_size: the resolved KV page size when the caller knows it (the
            ``KVCacheConfigurator`` does); else the record's (None: SGLang's default).
        kv_shard: logical-page KV sharding is active (known to the configurator).
        hybrid_pool: name of a hybrid pool kind in use, empty if none.
    """
    dcp = int(server_field(server_args, "dcp_size", 1))
    cp = int(server_field(server_args, "attn_cp_size", 1))
    try:
        from sglang.srt.runtime_context import get_parallel

        dcp = max(dcp, int(get_parallel().attn_dcp_size))
        cp = max(cp, int(get_parallel().attn_cp_size))
    except Exception:  # no runtime context published in this process (CLI, check)
        pass
    if page_size is None:
        page_size = server_field(server_args, "page_size", None)
    unified = bool(server_field(server_args, "enable_unified_memory", False)) or bool(
        server_field(server_args, "enable_unified_cache_external_linker", False)
    )
    asked = requested(server_args)
    off_by = ""
    if not asked:
        if env_setting(ENV_VAR) is False:
            off_by = "env"
        elif getattr(server_args, "_fp4_indexer_turned_off", False):
            off_by = "flag"
    return ServerFacts(
        requested=asked,
        off_by=off_by,
        page_size=None if page_size is None else int(page_size),
        dcp_size=dcp,
        dcp_shard=dcp_shard_requested(server_args),
        attn_cp_size=cp,
        enable_prefill_cp=bool(server_field(server_args, "enable_prefill_cp", False)),
        kv_shard=kv_shard,
        hicache=bool(server_field(server_args, "enable_hierarchical_cache", False)),
        hicache_storage=str(server_field(server_args, "hicache_storage_backend", "") or ""),
        hisparse=bool(server_field(server_args, "enable_hisparse", False)),
        disaggregation_mode=str(server_field(server_args, "disaggregation_mode", "null")),
        hybrid_pool=hybrid_pool,
        unified_memory=unified,
        external_kv_store=", ".join(
            name for name, field in (("flexkv", "enable_flexkv"), ("lmcache", "enable_lmcache"))
            if server_field(server_args, field, False)
        ),
        indexer_fusion_disabled=indexer_fusion_disabled(),
        speculative_eagle_topk=int(server_field(server_args, "speculative_eagle_topk", 1) or 1),
    )


def indexer_fusion_disabled() -> bool:
    """SGLang's ``SGLANG_DISABLE_DSA_INDEXER_FUSION``, read through SGLang's own ``envs`` (its parsing rules)."""
    from sglang.srt.environ import envs

    return bool(envs.SGLANG_DISABLE_DSA_INDEXER_FUSION.get())


def device_facts(device: str | torch.device = "cuda", gpu_id: int | None = None) -> DeviceFacts:
    """Gate facts of the device a pool lives on.

    Args:
        device: SGLang's device string (``"cuda"``, ``"cpu"``, ...).
        gpu_id: CUDA device index (default: the current device).
    """
    kind = torch.device(device).type
    if kind == "cuda" and getattr(torch.version, "hip", None):
        return DeviceFacts("rocm")
    if kind != "cuda":
        return DeviceFacts(kind)
    if not torch.cuda.is_available():
        return DeviceFacts("cuda", None, "no CUDA device visible")
    index = torch.cuda.current_device() if gpu_id is None else int(gpu_id)
    return DeviceFacts("cuda", tuple(torch.cuda.get_device_capability(index)), torch.cuda.get_device_name(index))


def global_rank() -> int:
    """This process's rank in the default torch.distributed group (0 when not initialised)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return 0


def _hybrid_pool(kvc) -> str:
    if getattr(kvc, "is_hybrid_swa", False):
        return "hybrid sliding-window (SWA)"
    if getattr(kvc, "mambaish_config", None) is not None:
        return "hybrid linear-attention (mamba-like)"
    return ""


def decision_for_kvc(kvc, *, log: bool = True) -> Decision:
    """The gate's decision for the pools a ``KVCacheConfigurator`` sizes and builds.

    Reads the model config, server args, page size, device, KV sharding and
    hybrid-pool kind off ``kvc`` and runs ``gate.decide``; with ``log`` the
    decision is reported once per process on rank 0 (``gate.report``).
    """
    decision = decide(
        model_facts(kvc.model_config.hf_config),
        server_facts(
            kvc.server_args,
            page_size=getattr(kvc, "page_size", None),
            kv_shard=getattr(kvc, "kv_shard_rank", None) is not None,
            hybrid_pool=_hybrid_pool(kvc),
        ),
        device_facts(kvc.device, getattr(kvc, "gpu_id", None)),
    )
    if log:
        report(decision, rank=global_rank())
    return decision


def index_layer_count(hf_config, num_layers: int) -> int:
    """Layers of a DSA model that hold an index-key cache (SGLang's ``dsa_layer_skips_topk`` is False).

    Non-DSA models: ``num_layers``.
    """
    from types import SimpleNamespace

    from sglang.srt.configs.model_config import dsa_layer_skips_topk, is_deepseek_dsa

    cfg = SimpleNamespace(**hf_config) if isinstance(hf_config, dict) else hf_config
    if not is_deepseek_dsa(cfg):
        return num_layers
    return sum(not dsa_layer_skips_topk(cfg, layer) for layer in range(num_layers))
