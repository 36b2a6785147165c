"""SGLang general plugin: ``--enable-fp4-indexer`` (entry point group ``sglang.srt.plugins``).

SGLang's ``load_plugins()`` (run early in every SGLang process: launcher,
engine, schedulers, detokenizer) calls ``register()``; it registers hooks with
SGLang's ``HookRegistry`` and nothing else: no CUDA, no Triton compile, no
model work. The hooks (``HOOKS``, one row per SGLang target, see
docs/sglang-seams.md) pass straight through to SGLang's code unless the FP4
index cache is in use. ``SGLANG_PLUGINS=fp4_indexer`` (or a list containing
it) selects this plugin when SGLang's whitelist is set; a whitelist without it
leaves SGLang untouched.

Only this subpackage imports SGLang; it holds no numerics (the package layout: README, Layout).
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["ENTRY_POINT_NAME", "Hook", "hooks", "missing_hooks", "register"]

#: Name of the entry point in the ``sglang.srt.plugins`` group (what ``SGLANG_PLUGINS`` lists).
ENTRY_POINT_NAME = "fp4_indexer"

_SA = "sglang.srt.server_args.ServerArgs"
_CFG = "sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator"
_POOL = "sglang.srt.mem_cache.memory_pool.DSATokenToKVPool"
_SIZING = "sglang.srt.model_executor.pool_configurator.DefaultPoolConfigurator"
_INDEXER = "sglang.srt.layers.attention.dsa.dsa_indexer.Indexer"
_UTILS = "sglang.srt.layers.attention.dsa.utils"
_BACKEND = "sglang.srt.layers.attention.dsa_backend.DeepseekSparseAttnBackend"
_MULTI = "sglang.srt.layers.attention.dsa_backend.DeepseekSparseAttnMultiStepBackend"


class Hook(NamedTuple):
    """One registration: SGLang target (dotted path), hook callable, ``HookType`` name."""

    target: str
    hook: object
    kind: str


def hooks() -> tuple[Hook, ...]:
    """Every hook this plugin registers, in registration order.

    Imports the plugin's hook modules (which import SGLang's index-key cache
    and model-config helpers) but not the hook targets themselves: SGLang's
    ``HookRegistry.apply_hooks`` resolves those.
    """
    from . import cli, indexer, metadata, pool

    return (
        Hook(f"{_SA}.add_cli_args", cli.add_flag, "AFTER"),
        Hook(f"{_SA}.from_cli_args", cli.carry_flag, "AFTER"),
        Hook(f"{_CFG}._build_dsa_kv_pool", pool.build_dsa_kv_pool, "AROUND"),
        Hook(f"{_POOL}._create_index_key_cache", pool.create_index_key_cache, "AROUND"),
        Hook(f"{_SIZING}._compute_dsa_indexer_cell_size", pool.compute_dsa_indexer_cell_size, "AROUND"),
        Hook(f"{_INDEXER}._store_index_k_cache", indexer.store_index_k_cache, "AROUND"),
        Hook(f"{_INDEXER}._fused_k_prepare_and_store", indexer.fused_k_prepare_and_store, "AROUND"),
        Hook(f"{_INDEXER}._get_topk_paged", indexer.get_topk_paged, "AROUND"),
        Hook(f"{_INDEXER}._get_topk_ragged", indexer.get_topk_ragged, "AROUND"),
        Hook(f"{_UTILS}.resolve_paged_mqa_logits_metadata_fn", metadata.resolve_paged_mqa_logits_metadata_fn, "AROUND"),
        Hook(f"{_BACKEND}._refresh_paged_mqa_schedule_metadata", metadata.refresh_paged_mqa_schedule_metadata, "AROUND"),
        Hook(f"{_BACKEND}._build_paged_mqa_schedule_2d_ctx_lens", metadata.build_paged_mqa_schedule_2d_ctx_lens,
             "AROUND"),
        Hook(f"{_MULTI}.init_forward_metadata_out_graph", metadata.multi_step_init_forward_metadata_out_graph, "AFTER"),
    )


def register() -> None:
    """Entry point: register the hooks with SGLang's ``HookRegistry`` (applied by ``load_plugins``).

    Also lets ``sglang.Engine(..., enable_fp4_indexer=True)`` through
    (``cli.install_engine_kwarg``) when the engine module is loaded.
    """
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from .cli import install_engine_kwarg

    for hook in hooks():
        HookRegistry.register(hook.target, hook.hook, HookType[hook.kind])
    install_engine_kwarg()


def missing_hooks() -> list[str]:
    """Targets of ``hooks()`` that SGLang's ``HookRegistry`` has not applied in this process.

    ``apply_hooks`` logs and skips a target it cannot patch (e.g. after an
    SGLang upgrade moved it); the FP4 pool is only built when this is empty,
    so a half-applied plugin can never write FP4 bytes that an unhooked FP8
    reader would then read.
    """
    from sglang.srt.plugins.hook_registry import HookRegistry

    return [h.target for h in hooks() if h.target not in HookRegistry._patched]
