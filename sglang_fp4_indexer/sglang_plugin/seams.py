"""What the plugin was written against, checked against the SGLang that loads it (no numerics here).

The plugin is loaded by SGLang's entry point in every server of an
environment where it is installed, so it must never harm a server that did not
ask for FP4, whatever the SGLang version. Three lines of defence:

- every hook passes the call through untouched (``*args, **kwargs``) unless
  the FP4 path is active (``passthrough_around`` / ``passthrough_after``);
  arguments are bound by name only on the FP4 path;
- at registration (``check_targets``) each hook target's signature is compared
  with the one the plugin was written for (``Hook.signature``, SGLang 0.5.23);
  a target that does not resolve or whose signature differs is not hooked at
  all, and FP4 is refused naming it (``refusal``);
- before the pools are sized (``refusal``, called by the sizing and pool-build
  hooks): the installed SGLang version is one this release was tested with
  (``TESTED_SGLANG_VERSIONS``), the index-key cache and pool attributes the
  FP4 cache relies on exist and are used as in 0.5.23 (``pool_attribute_problems``),
  and the DSA pool class SGLang picks builds its index cache through the base
  ``DSATokenToKVPool._create_index_key_cache`` (``pool_class_problem``).

A refusal goes through the gate's one warning (``gate.report``), only when
FP4 was asked for; without the flag nothing is logged and SGLang runs as if
the plugin were absent.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import pkgutil
from typing import NamedTuple

__all__ = [
    "Seam",
    "SEAMS",
    "missing_hooks",
    "TESTED_SGLANG_VERSIONS",
    "signature_text",
    "target_signature",
    "check_targets",
    "target_problems",
    "sglang_version",
    "version_problem",
    "pool_attribute_problems",
    "pool_class_problem",
    "refusal",
    "reset_targets",
    "set_load_problem",
    "load_problem",
    "passthrough_around",
    "passthrough_after",
]

class Seam(NamedTuple):
    """One SGLang target the plugin hooks: its dotted path, the hook (``module.attribute`` of this subpackage),
    the ``HookType`` name, and the target's parameter list the plugin was written for (SGLang 0.5.23, as
    ``signature_text`` writes it). ``sglang_plugin.hooks()`` binds each row to its callable."""

    target: str
    module: str
    attribute: str
    kind: str
    signature: str


_SA = "sglang.srt.server_args.ServerArgs"
_CFG = "sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator"
_POOL = "sglang.srt.mem_cache.memory_pool.DSATokenToKVPool"
_SIZING = "sglang.srt.model_executor.pool_configurator.DefaultPoolConfigurator"
_INDEXER = "sglang.srt.layers.attention.dsa.dsa_indexer.Indexer"
_UTILS = "sglang.srt.layers.attention.dsa.utils"
_BACKEND = "sglang.srt.layers.attention.dsa_backend.DeepseekSparseAttnBackend"
_MULTI = "sglang.srt.layers.attention.dsa_backend.DeepseekSparseAttnMultiStepBackend"
_HOST = "sglang.srt.mem_cache.pool_host.dsa"
_PD = "sglang.srt.disaggregation.common.conn.CommonKVManager"

#: Every SGLang target the plugin hooks, in registration order (docs/sglang-seams.md).
SEAMS: tuple[Seam, ...] = (
    Seam(f"{_SA}.add_cli_args", "server_args", "add_flag", "AFTER", "(parser)"),
    Seam(f"{_SA}.from_cli_args", "server_args", "carry_flag", "AFTER", "(cls, args)"),
    Seam(f"{_CFG}._build_dsa_kv_pool", "kv_pool", "build_dsa_kv_pool", "AROUND",
         "(self, *, max_total_num_tokens, max_running_requests, dsa_pool_class)"),
    Seam(f"{_POOL}._create_index_key_cache", "kv_pool", "create_index_key_cache", "AROUND", "(self)"),
    Seam(f"{_SIZING}._compute_dsa_indexer_cell_size", "kv_pool", "compute_dsa_indexer_cell_size", "AROUND",
         "(self, *, kvc, num_layers, allocate_all_layers=False)"),
    Seam(f"{_INDEXER}._store_index_k_cache", "indexer", "store_index_k_cache", "AROUND",
         "(self, forward_batch, layer_id, key, *, act_quant=None, out_cache_loc=None)"),
    Seam(f"{_INDEXER}._fused_k_prepare_and_store", "indexer", "fused_k_prepare_and_store", "AROUND",
         "(self, key_raw, positions, forward_batch, layer_id, act_quant, out_cache_loc=None)"),
    Seam(f"{_INDEXER}._fused_q_prepare_and_store", "indexer", "fused_q_prepare_and_store", "AROUND",
         "(self, x, q_lora, positions, forward_batch, layer_id, act_quant, *, num_tokens=None, enable_dual_stream=True)"),
    Seam(f"{_INDEXER}._maybe_rotate", "indexer", "maybe_rotate", "AROUND", "(self, x)"),
    Seam(f"{_INDEXER}._get_topk_paged", "indexer", "get_topk_paged", "AROUND",
         "(self, forward_batch, layer_id, q_fp8, weights, metadata)"),
    Seam(f"{_INDEXER}._get_topk_ragged", "indexer", "get_topk_ragged", "AROUND",
         "(self, enable_dual_stream, forward_batch, layer_id, q_fp8, weights, metadata, topk_result=None)"),
    Seam(f"{_UTILS}.resolve_paged_mqa_logits_metadata_fn", "metadata", "resolve_paged_mqa_logits_metadata_fn",
         "AROUND", "()"),
    Seam(f"{_BACKEND}._refresh_paged_mqa_schedule_metadata", "metadata", "refresh_paged_mqa_schedule_metadata",
         "AROUND", "(self, metadata, seqlens_32_2d)"),
    Seam(f"{_BACKEND}._build_paged_mqa_schedule_2d_ctx_lens", "metadata", "build_paged_mqa_schedule_2d_ctx_lens",
         "AROUND", "(self, forward_mode, cache_seqlens_int32, seqlens_expanded, batch_size)"),
    Seam(f"{_MULTI}.init_forward_metadata_out_graph", "metadata", "multi_step_init_forward_metadata_out_graph",
         "AFTER", "(self, forward_batch, in_capture=False)"),
    Seam(f"{_HOST}.make_dsa_indexer_pool_decl", "host_pool", "make_dsa_indexer_pool_decl", "AROUND",
         "(pool, *, name=<PoolName.INDEXER: 'indexer'>)"),
    Seam(f"{_PD}.__init__", "disaggregation", "kv_manager_init", "AROUND",
         "(self, args, disaggregation_mode, server_args, is_mla_backend=False)"),
)


def missing_hooks() -> list[str]:
    """Targets of ``SEAMS`` that SGLang's ``HookRegistry`` has not applied in this process.

    ``apply_hooks`` logs and skips a target it cannot patch (e.g. after an
    SGLang upgrade moved it); the FP4 pool is only built when this is empty,
    so a half-applied plugin can never write FP4 bytes that an unhooked FP8
    reader would then read.
    """
    from sglang.srt.plugins.hook_registry import HookRegistry

    return [s.target for s in SEAMS if s.target not in HookRegistry._patched]


#: SGLang releases this release of the plugin was tested with (its hook signatures are those of ``SEAMS``).
TESTED_SGLANG_VERSIONS = ("0.5.23",)

#: Problems found by ``check_targets`` at registration: ``{target: problem}`` (empty: every target as expected).
_target_problems: dict[str, str] = {}
#: Why ``register`` could hook only the flags (empty: it hooked everything).
_load_problem: list[str] = []


def set_load_problem(text: str) -> None:
    """Record that ``register`` could not import the adapter's hook modules (only the flags are hooked)."""
    _load_problem[:] = [text]


def load_problem() -> str | None:
    """Why ``register`` hooked only the flags in this process (None: it hooked everything)."""
    return _load_problem[0] if _load_problem else None


def signature_text(fn) -> str:
    """A callable's parameter list as text, without annotations: ``"(self, layer_id, *, out=None)"``.

    Names, kinds (``*``, ``/``, ``*args``, ``**kwargs``) and default values
    count; annotations do not (they may be strings or differ by import style).

    Raises:
        TypeError / ValueError: ``inspect.signature`` cannot read ``fn``.
    """
    sig = inspect.signature(fn, follow_wrapped=False)
    params = [p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()]
    return str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty))


def target_signature(target: str) -> str:
    """The signature text (``signature_text``) of a dotted SGLang target as SGLang defines it.

    A class attribute is read from the class ``__dict__`` (a ``staticmethod`` /
    ``classmethod`` is unwrapped, so a classmethod's first parameter ``cls``
    counts); a target SGLang's ``HookRegistry`` already wrapped is followed to
    the function it wrapped.

    Raises:
        ImportError / AttributeError: the target's module or attribute does not exist.
        TypeError / ValueError: the attribute has no readable signature.
    """
    owner_path, name = target.rsplit(".", 1)
    owner = pkgutil.resolve_name(owner_path)
    if isinstance(owner, type):
        for klass in owner.__mro__:
            if name in klass.__dict__:
                raw = klass.__dict__[name]
                break
        else:
            raise AttributeError(f"{owner_path} has no attribute {name!r}")
    else:
        raw = getattr(owner, name)
    fn = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
    while hasattr(fn, "__wrapped__"):  # already hooked by HookRegistry (apply_hooks) in this process
        fn = fn.__wrapped__
    return signature_text(fn)


def check_targets(rows) -> dict[str, str]:
    """Compare each hook target's signature with the one the plugin was written for; remember the differences.

    Args:
        rows: ``sglang_plugin.hooks()`` rows (``target``, ``signature``).

    Returns:
        ``{target: problem}`` for every target that does not resolve or whose
        signature differs (empty when all match). Also kept for ``refusal``.
        Never raises: any error reading a target is that target's problem.
    """
    problems: dict[str, str] = {}
    for row in rows:
        try:
            found = target_signature(row.target)
        except Exception as exc:  # renamed, removed, or its module does not import
            problems[row.target] = f"not found in this SGLang ({type(exc).__name__}: {exc})"
            continue
        if found != row.signature:
            problems[row.target] = f"signature is {found}, the plugin was written for {row.signature}"
    _target_problems.clear()
    _target_problems.update(problems)
    return dict(problems)


def target_problems() -> dict[str, str]:
    """The problems ``check_targets`` found in this process (empty when none, or before registration)."""
    return dict(_target_problems)


def reset_targets() -> None:
    """Forget what ``check_targets`` and ``register`` found (for tests)."""
    _target_problems.clear()
    _load_problem.clear()


def sglang_version() -> str | None:
    """The installed SGLang distribution's version (``importlib.metadata``), None when it is not installed."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def version_problem(version: str | None = None) -> str | None:
    """Why this SGLang version is not served (None: it is one of ``TESTED_SGLANG_VERSIONS``).

    Args:
        version: the version to judge (default: ``sglang_version()``).
    """
    version = sglang_version() if version is None else version
    if version in TESTED_SGLANG_VERSIONS:
        return None
    return (f"SGLang {version} is installed; this release of sglang-fp4-indexer was tested with SGLang "
            f"{', '.join(TESTED_SGLANG_VERSIONS)} only")


#: ``(class, attribute, names its code must use)``: what the FP4 path relies on in SGLang's classes.
#: ``Fp4IndexKeyCache`` overrides ``_buffer_shape`` (called by ``IndexKeyCache.__init__``) and
#: ``_kernel_view`` (called by ``get_local_buffer``); a rename upstream would silently allocate and
#: read 132-byte rows after 68-byte sizing.
_RELIED_ON = (
    ("sglang.srt.mem_cache.index_key_cache:IndexKeyCache", "__init__", ("_buffer_shape", "_layer_num_pages")),
    ("sglang.srt.mem_cache.index_key_cache:IndexKeyCache", "get_local_buffer", ("_kernel_view",)),
    ("sglang.srt.mem_cache.index_key_cache:IndexKeyCache", "_buffer_shape", ()),
    ("sglang.srt.mem_cache.index_key_cache:IndexKeyCache", "_kernel_view", ()),
    ("sglang.srt.mem_cache.index_key_cache:IndexKeyCache", "move", ()),
    ("sglang.srt.mem_cache.index_key_cache:IndexKeyCache", "cpu_copy", ()),
    ("sglang.srt.mem_cache.index_key_cache:IndexKeyCache", "load_cpu_copy", ()),
    ("sglang.srt.mem_cache.memory_pool:DSATokenToKVPool", "__init__",
     ("_create_index_key_cache", "index_key_cache", "index_buf_size", "index_page_size", "index_kpool",
      "index_head_dim")),
    ("sglang.srt.mem_cache.memory_pool:DSATokenToKVPool", "get_index_k_with_scale_buffer", ("index_key_cache",)),
    ("sglang.srt.layers.attention.dsa.dsa_indexer:Indexer", "_get_index_k_read_buffer", ()),
    # The FP4 path of the fused indexer (interleaved indexer RoPE): q and k come from _get_q_k_bf16, which
    # projects through wk_weights_proj (_fused_k_weights) and rotates through the hooked _maybe_rotate.
    ("sglang.srt.layers.attention.dsa.dsa_indexer:Indexer", "_get_q_k_bf16", ("_maybe_rotate", "_fused_k_weights")),
    ("sglang.srt.layers.attention.dsa.dsa_indexer:Indexer", "_scale_head_gates", ()),
    ("sglang.srt.layers.attention.dsa.dsa_indexer", "rotate_activation", ()),
    ("sglang.srt.layers.attention.dsa.dsa_indexer:Indexer", "_mask_init_and_local_tokens", ()),
    ("sglang.srt.layers.attention.dsa_backend:DeepseekSparseAttnBackend", "_refresh_topk_v2_plan", ()),
    ("sglang.srt.layers.attention.dsa_backend:DeepseekSparseAttnMultiStepBackend",
     "init_forward_metadata_out_graph", ("fused_metadata_copy_multi_cuda", "experimental_kpool_metadata_fusion")),
)


def _code_names(fn) -> set[str]:
    """Attribute and global names a function's code (and its nested code) refers to."""
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    code = getattr(fn, "__code__", None)
    names: set[str] = set()
    stack = [code] if code is not None else []
    while stack:
        c = stack.pop()
        names.update(c.co_names)
        stack.extend(k for k in c.co_consts if inspect.iscode(k))
    return names


def pool_attribute_problems() -> list[str]:
    """What is missing from SGLang's ``IndexKeyCache`` / ``DSATokenToKVPool`` / ``Indexer`` / DSA backends for FP4.

    Each entry of ``_RELIED_ON`` must exist on its class, and its code
    must still use the names the FP4 cache relies on (e.g.
    ``IndexKeyCache.__init__`` sizes its rows through ``_buffer_shape``).

    Returns:
        One text per problem (empty: as in SGLang 0.5.23). Never raises.
    """
    problems = []
    for owner_path, attr, uses in _RELIED_ON:
        where = f"{owner_path.replace(':', '.')}.{attr}"
        try:
            owner = pkgutil.resolve_name(owner_path)
            fn = getattr(owner, attr)
        except Exception as exc:
            problems.append(f"{where} not found ({type(exc).__name__}: {exc})")
            continue
        fn = getattr(fn, "__func__", fn)
        missing = [n for n in uses if n not in _code_names(fn)]
        if missing:
            problems.append(f"{where} no longer uses {', '.join(missing)}")
    return problems


def pool_class_problem(kvc) -> str | None:
    """Why the DSA pool class SGLang would build for ``kvc`` cannot hold the FP4 cache (None: it can).

    The class is the one SGLang's ``KVCacheConfigurator._build_token_to_kv_pool``
    passes to ``_build_dsa_kv_pool`` (``_resolve_kv_pool_class(kind="dsa",
    default=DSATokenToKVPool)``: a platform may substitute a subclass). It must
    build its index cache through the base ``DSATokenToKVPool._create_index_key_cache``
    (the hooked seam): a subclass that overrides it would skip the hook after
    sizing charged 68 bytes. Never raises.
    """
    try:
        from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool

        resolve = getattr(kvc, "_resolve_kv_pool_class", None)
        if resolve is None:
            from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator

            cls = KVCacheConfigurator._resolve_kv_pool_class(kvc, kind="dsa", default=DSATokenToKVPool)
        else:
            cls = resolve(kind="dsa", default=DSATokenToKVPool)
        return create_index_key_cache_owner_problem(cls, DSATokenToKVPool)
    except Exception as exc:
        return f"could not resolve SGLang's DSA pool class ({type(exc).__name__}: {exc})"


def create_index_key_cache_owner_problem(cls, base) -> str | None:
    """None when ``cls`` inherits ``_create_index_key_cache`` from ``base``, else why not."""
    owner = next((k for k in cls.__mro__ if "_create_index_key_cache" in k.__dict__), None)
    if owner is base:
        return None
    name = "no class" if owner is None else f"{owner.__module__}.{owner.__qualname__}"
    return (f"the DSA pool class {cls.__module__}.{cls.__qualname__} builds its index cache in {name}'s "
            f"_create_index_key_cache, not {base.__qualname__}'s, which the FP4 cache hooks")


def refusal(kvc=None) -> tuple[str, str] | None:
    """Why this SGLang cannot hold the FP4 cache, as ``(code, reason)`` (None: it can); checked before sizing.

    In order: targets whose signature differs or that do not resolve
    (``target_problems``; code ``"sglang_seams"``, one text naming them all), the
    SGLang version (``version_problem``; ``"sglang_version"``), the pool
    attributes (``pool_attribute_problems``; ``"sglang_seams"``), the pool class
    for ``kvc`` (``pool_class_problem``; ``"pool_class"``, skipped without ``kvc``).
    Never raises.
    """
    if load_problem():
        return "sglang_seams", load_problem()
    problems = target_problems()
    if problems:
        return "sglang_seams", "SGLang's " + "; ".join(f"{t} {p}" for t, p in problems.items())
    version = version_problem()
    if version:
        return "sglang_version", version
    attrs = pool_attribute_problems()
    if attrs:
        return "sglang_seams", "SGLang's " + "; ".join(attrs)
    pool_class = pool_class_problem(kvc) if kvc is not None else None
    return ("pool_class", pool_class) if pool_class else None


def _name(hook, fp4_path, doc: str) -> None:
    hook.__name__ = fp4_path.__name__
    hook.__qualname__ = fp4_path.__qualname__
    hook.__module__ = fp4_path.__module__
    hook.__doc__ = doc + "\n\n" + (fp4_path.__doc__ or "")
    hook.fp4_path = fp4_path


def passthrough_around(active):
    """Decorator: an AROUND hook that calls ``original(*args, **kwargs)`` untouched unless ``active()``.

    The decorated function is the FP4 path, with SGLang 0.5.23's parameters
    after ``original`` (bound by name only when ``active()`` is true); it is
    kept as the hook's ``fp4_path``.

    Args:
        active: a no-argument predicate (e.g. ``pool.fp4_active``) that reads no SGLang internals.
    """
    def decorate(fp4_path):
        def hook(original, *args, **kwargs):
            if not active():
                return original(*args, **kwargs)
            return fp4_path(original, *args, **kwargs)

        _name(hook, fp4_path, "AROUND hook: SGLang's call passes through untouched unless the FP4 path is active.")
        return hook

    return decorate


def passthrough_after(active):
    """Decorator: an AFTER hook that returns SGLang's ``result`` untouched unless ``active()`` (see ``passthrough_around``)."""
    def decorate(fp4_path):
        def hook(result, *args, **kwargs):
            if not active():
                return result
            return fp4_path(result, *args, **kwargs)

        _name(hook, fp4_path, "AFTER hook: SGLang's result passes through untouched unless the FP4 path is active.")
        return hook

    return decorate
