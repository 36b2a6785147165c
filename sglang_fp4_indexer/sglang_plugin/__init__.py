"""SGLang general plugin: ``--enable-fp4-indexer`` (entry point group ``sglang.srt.plugins``).

SGLang's ``load_plugins()`` (run early in every SGLang process: launcher,
engine, schedulers, detokenizer) calls ``register()``; it registers hooks with
SGLang's ``HookRegistry`` and nothing else: no CUDA, no Triton compile, no
model work. The hooks (``seams.SEAMS``, one row per SGLang target, see
docs/sglang-seams.md) pass straight through to SGLang's code unless the FP4
index cache is in use. ``SGLANG_PLUGINS=fp4_indexer`` (or a list containing
it) selects this plugin when SGLang's whitelist is set; a whitelist without it
leaves SGLang untouched.

Only this subpackage imports SGLang; it holds no numerics (docs/design.md, Module map).
"""

from __future__ import annotations

from typing import NamedTuple

from ..gate import ENTRY_POINT_NAME  # the entry point's name in sglang.srt.plugins (what SGLANG_PLUGINS lists)
from .seams import SEAMS, missing_hooks

__all__ = ["ENTRY_POINT_NAME", "Hook", "hooks", "missing_hooks", "register"]


class Hook(NamedTuple):
    """One registration: SGLang target (dotted path), hook callable, ``HookType`` name, and the target's
    parameter list the plugin was written for (SGLang 0.5.23, as ``seams.signature_text`` writes it)."""

    target: str
    hook: object
    kind: str
    signature: str


def hooks() -> tuple[Hook, ...]:
    """Every hook this plugin registers, in registration order (the rows of ``seams.SEAMS``, each bound to its callable).

    Imports the plugin's hook modules (which import SGLang's index-key cache
    and model-config helpers) but not the hook targets themselves: SGLang's
    ``HookRegistry.apply_hooks`` resolves those.
    """
    from . import disaggregation, host_pool, indexer, kv_pool, metadata, server_args

    return _bound(SEAMS, {"server_args": server_args, "kv_pool": kv_pool, "indexer": indexer, "metadata": metadata,
                          "host_pool": host_pool, "disaggregation": disaggregation})


def _cli_hooks() -> tuple[Hook, ...]:
    """The two flag hooks (their module imports no SGLang internals)."""
    from . import server_args

    return _bound(tuple(s for s in SEAMS if s.module == "server_args"), {"server_args": server_args})


def _bound(seams, modules: dict) -> tuple[Hook, ...]:
    return tuple(Hook(s.target, getattr(modules[s.module], s.attribute), s.kind, s.signature) for s in seams)


def register() -> None:
    """Entry point: register the hooks with SGLang's ``HookRegistry`` (applied by ``load_plugins``).

    Each target's signature is first compared with the one the plugin was
    written for (``seams.check_targets``): a target that does not resolve or
    whose parameters differ is not hooked at all (SGLang's own method runs),
    and the FP4 indexer is refused naming it when it is asked for
    (``seams.refusal``, through the gate's one warning). Every hook that is
    registered passes its calls through untouched while FP4 is not active.

    Also lets ``sglang.Engine(..., enable_fp4_indexer=True)`` through
    (``server_args.install_engine_kwarg``) when the engine module is loaded.
    """
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from .server_args import install_engine_kwarg
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
