"""SGLang general plugin: ``--enable-fp4-indexer`` (entry point group ``sglang.srt.plugins``).

SGLang's ``load_plugins()`` (run early in every SGLang process: launcher,
engine, schedulers, detokenizer) calls ``register()``; it registers hooks with
SGLang's ``HookRegistry`` and nothing else: no CUDA, no Triton compile, no
model work. The hooks (``HOOKS``, one row per SGLang target, see
docs/sglang-seams.md) pass straight through to SGLang's code unless the FP4
index cache is in use. ``SGLANG_PLUGINS=fp4_indexer`` (or a list containing
it) selects this plugin when SGLang's whitelist is set; a whitelist without it
leaves SGLang untouched.

Only this subpackage imports SGLang; it holds no numerics (docs/design.md, Module map).
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
    """One registration: SGLang target (dotted path), hook callable, ``HookType`` name, and the target's
    parameter list the plugin was written for (SGLang 0.5.23, as ``seams.signature_text`` writes it)."""

    target: str
    hook: object
    kind: str
    signature: str


def hooks() -> tuple[Hook, ...]:
    """Every hook this plugin registers, in registration order.

    Imports the plugin's hook modules (which import SGLang's index-key cache
    and model-config helpers) but not the hook targets themselves: SGLang's
    ``HookRegistry.apply_hooks`` resolves those.
    """
    from . import indexer, metadata, pool

    return _cli_hooks() + (
        Hook(f"{_CFG}._build_dsa_kv_pool", pool.build_dsa_kv_pool, "AROUND",
             "(self, *, max_total_num_tokens, max_running_requests, dsa_pool_class)"),
        Hook(f"{_POOL}._create_index_key_cache", pool.create_index_key_cache, "AROUND", "(self)"),
        Hook(f"{_SIZING}._compute_dsa_indexer_cell_size", pool.compute_dsa_indexer_cell_size, "AROUND",
             "(self, *, kvc, num_layers, allocate_all_layers=False)"),
        Hook(f"{_INDEXER}._store_index_k_cache", indexer.store_index_k_cache, "AROUND",
             "(self, forward_batch, layer_id, key, *, act_quant=None, out_cache_loc=None)"),
        Hook(f"{_INDEXER}._fused_k_prepare_and_store", indexer.fused_k_prepare_and_store, "AROUND",
             "(self, key_raw, positions, forward_batch, layer_id, act_quant, out_cache_loc=None)"),
        Hook(f"{_INDEXER}._get_topk_paged", indexer.get_topk_paged, "AROUND",
             "(self, forward_batch, layer_id, q_fp8, weights, metadata)"),
        Hook(f"{_INDEXER}._get_topk_ragged", indexer.get_topk_ragged, "AROUND",
             "(self, enable_dual_stream, forward_batch, layer_id, q_fp8, weights, metadata, topk_result=None)"),
        Hook(f"{_UTILS}.resolve_paged_mqa_logits_metadata_fn", metadata.resolve_paged_mqa_logits_metadata_fn,
             "AROUND", "()"),
        Hook(f"{_BACKEND}._refresh_paged_mqa_schedule_metadata", metadata.refresh_paged_mqa_schedule_metadata,
             "AROUND", "(self, metadata, seqlens_32_2d)"),
        Hook(f"{_BACKEND}._build_paged_mqa_schedule_2d_ctx_lens", metadata.build_paged_mqa_schedule_2d_ctx_lens,
             "AROUND", "(self, forward_mode, cache_seqlens_int32, seqlens_expanded, batch_size)"),
        Hook(f"{_MULTI}.init_forward_metadata_out_graph", metadata.multi_step_init_forward_metadata_out_graph,
             "AFTER", "(self, forward_batch, in_capture=False)"),
    )


def _cli_hooks() -> tuple[Hook, ...]:
    """The two flag hooks (their module imports no SGLang internals)."""
    from . import cli

    return (
        Hook(f"{_SA}.add_cli_args", cli.add_flag, "AFTER", "(parser)"),
        Hook(f"{_SA}.from_cli_args", cli.carry_flag, "AFTER", "(cls, args)"),
    )


def register() -> None:
    """Entry point: register the hooks with SGLang's ``HookRegistry`` (applied by ``load_plugins``).

    Each target's signature is first compared with the one the plugin was
    written for (``seams.check_targets``): a target that does not resolve or
    whose parameters differ is not hooked at all (SGLang's own method runs),
    and the FP4 indexer is refused naming it when it is asked for
    (``seams.refusal``, through the gate's one warning). Every hook that is
    registered passes its calls through untouched while FP4 is not active.

    Also lets ``sglang.Engine(..., enable_fp4_indexer=True)`` through
    (``cli.install_engine_kwarg``) when the engine module is loaded.
    """
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from .cli import install_engine_kwarg
    from .seams import check_targets, set_load_problem

    try:
        rows = hooks()
    except Exception as exc:  # the adapter's modules do not import against this SGLang: only the flags
        set_load_problem(f"sglang-fp4-indexer's SGLang adapter does not import here ({type(exc).__name__}: {exc})")
        rows = _cli_hooks()
    drifted = check_targets(rows)
    for hook in rows:
        if hook.target not in drifted:
            HookRegistry.register(hook.target, hook.hook, HookType[hook.kind])
    try:
        install_engine_kwarg()
    except Exception:  # another Engine: Engine(enable_fp4_indexer=...) is then SGLang's own TypeError
        pass


def missing_hooks() -> list[str]:
    """Targets of ``hooks()`` that SGLang's ``HookRegistry`` has not applied in this process.

    ``apply_hooks`` logs and skips a target it cannot patch (e.g. after an
    SGLang upgrade moved it); the FP4 pool is only built when this is empty,
    so a half-applied plugin can never write FP4 bytes that an unhooked FP8
    reader would then read.
    """
    from sglang.srt.plugins.hook_registry import HookRegistry

    return [h.target for h in hooks() if h.target not in HookRegistry._patched]
