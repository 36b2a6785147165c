"""``--enable-fp4-indexer`` on every SGLang entry, and its way to the scheduler processes.

Seams (SGLang 0.5.23, see docs/sglang-seams.md):

- ``ServerArgs.add_cli_args`` (staticmethod; builds the parser of
  ``python -m sglang.launch_server``, ``sglang serve`` and ``--config``
  merging): an AFTER hook adds ``--enable-fp4-indexer`` (store_true) and
  ``--no-enable-fp4-indexer`` (store_false, same destination).
  ``ConfigArgumentMerger`` reads the parser's store_true actions, so
  ``enable-fp4-indexer: true`` in a ``--config`` YAML works too; it puts the
  file's flags before the command line's, so ``--no-enable-fp4-indexer`` on
  the command line turns off a file's ``enable-fp4-indexer: true``.
- ``ServerArgs.from_cli_args`` (classmethod; copies only declared fields off
  the argparse namespace): an AFTER hook records the flag on the record as the
  underscore attribute ``_enable_fp4_indexer`` (and ``--fp4-indexer-dcp-shard``
  as ``_fp4_indexer_dcp_shard``). ``ServerArgs.__reduce__``
  carries underscore bookkeeping to the scheduler processes.
- ``Engine.server_args_class`` (what ``Engine(**kwargs)`` constructs): replaced
  by a factory that takes ``enable_fp4_indexer=`` off the keyword arguments.
  Installed directly, not through ``HookRegistry``: the registry would also
  rebind every module's ``ServerArgs`` name to the factory (its
  ``_propagate_patch``), and ``Engine.__init__`` reads the attribute after it
  has called ``load_plugins()``, so the first ``Engine(...)`` call already sees it.

The environment variable ``SGLANG_ENABLE_FP4_INDEXER``, when set to an on or
off value, wins over the command line and the file (``facts.requested``);
``carry_flag`` warns once when it overrides a flag that was given.

``--fp4-indexer-dcp-shard`` (``SGLANG_FP4_INDEXER_DCP_SHARD=1``, Engine keyword
``fp4_indexer_dcp_shard=``) travels the same way: under decode context
parallelism it shards the FP4 index over the DCP ranks instead of replicating
it (``sglang_fp4_indexer.dcp``; no effect without ``--dcp-size > 1``).
"""

from __future__ import annotations

import argparse
import os
import sys

from .facts import DCP_SHARD_ENV_VAR, ENV_VAR, env_flag, env_setting, mark_dcp_shard, mark_requested

__all__ = ["FLAG", "NO_FLAG", "HELP", "DCP_SHARD_FLAG", "NO_DCP_SHARD_FLAG", "DCP_SHARD_HELP", "add_flag",
           "carry_flag", "install_engine_kwarg", "server_args_from_flags"]

FLAG = "--enable-fp4-indexer"
HELP = (
    "Store the DSA lightning indexer's key cache in MXFP4 (68 B/token/layer instead "
    "of 132) and score it with the sglang-fp4-indexer kernels (CUDA C++ on Hopper, Triton elsewhere). DeepSeek Sparse "
    "Attention models only (DeepSeek-V3.2, GLM-5.x); on anything the FP4 path does "
    "not serve, one warning names the reason and SGLang keeps its FP8 indexer."
)
NO_FLAG = "--no-enable-fp4-indexer"
NO_HELP = (
    "Turn the FP4 indexer off, also where a --config file sets enable-fp4-indexer: true (the command line wins "
    "over the file; SGLANG_ENABLE_FP4_INDEXER, when set, wins over both)."
)
DCP_SHARD_FLAG = "--fp4-indexer-dcp-shard"
NO_DCP_SHARD_FLAG = "--no-fp4-indexer-dcp-shard"
DCP_SHARD_HELP = (
    "With --enable-fp4-indexer and --dcp-size W > 1: keep on each DCP rank only the FP4 index keys "
    "of the tokens it owns (68/W B/token/layer instead of 68); decode exchanges top-k candidates "
    "between the ranks and prefill stages the keys it needs. Without it the FP4 index is replicated."
)
_ENGINE_MODULE = "sglang.srt.entrypoints.engine"


def _argument(args, kwargs, name: str, kind: type):
    """The call's argument ``name`` if it is a ``kind`` (by keyword, else the first positional one that is), else None."""
    value = kwargs.get(name)
    if isinstance(value, kind):
        return value
    return next((a for a in args if isinstance(a, kind)), None)


def add_flag(result, *args, **kwargs):
    """AFTER hook of ``ServerArgs.add_cli_args(parser)``: add the plugin's flags and their ``--no-`` forms.

    ``--enable-fp4-indexer`` / ``--no-enable-fp4-indexer`` and
    ``--fp4-indexer-dcp-shard`` / ``--no-fp4-indexer-dcp-shard``: each pair
    shares one destination (default False), so the last one given wins, and
    SGLang's ``--config`` merging puts the file's flags before the command line's.

    Takes SGLang's call as it comes (``*args, **kwargs``) and adds the flags to
    the ``argparse.ArgumentParser`` among its arguments; without one it does
    nothing. Idempotent per parser. Returns ``result`` unchanged (``None``).
    """
    parser = _argument(args, kwargs, "parser", argparse.ArgumentParser)
    if parser is None:
        return result
    for flag, no_flag, help_text, no_help in (
            (FLAG, NO_FLAG, HELP, NO_HELP),
            (DCP_SHARD_FLAG, NO_DCP_SHARD_FLAG, DCP_SHARD_HELP,
             f"Keep the FP4 index replicated under DCP, also where a --config file sets {DCP_SHARD_FLAG[2:]}: true.")):
        if flag not in parser._option_string_actions:
            action = parser.add_argument(flag, action="store_true", default=False, help=help_text)
            parser.add_argument(no_flag, dest=action.dest, action="store_false", default=False, help=no_help)
    return result


def _check_env() -> None:
    """Read the plugin's environment variables once at launch, so a bad value stops it there (``facts.env_flag``)."""
    env_flag(ENV_VAR)
    env_flag(DCP_SHARD_ENV_VAR)


def carry_flag(result, *args, **kwargs):
    """AFTER hook of ``ServerArgs.from_cli_args(args)``: record the parsed flag on the new record.

    Takes SGLang's call as it comes (``*args, **kwargs``) and reads the
    ``argparse.Namespace`` among its arguments; without one it only checks
    the environment variables.

    Raises:
        SystemExit: (code 2, as argparse's own errors) ``SGLANG_ENABLE_FP4_INDEXER`` or
            ``SGLANG_FP4_INDEXER_DCP_SHARD`` holds neither an on nor an off value
            (``facts.env_flag``); one line on stderr names the variable, no traceback.
    """
    try:
        _check_env()
    except ValueError as exc:  # the launch command's parse: stop it like a bad flag, in one line
        print(f"sglang-fp4-indexer: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    args = _argument(args, kwargs, "args", argparse.Namespace)
    value = getattr(args, "enable_fp4_indexer", None)
    if value is not None:
        mark_requested(result, bool(value))
        _warn_if_env_overrides(ENV_VAR, FLAG, bool(value))
    _warn_if_unhooked(result)
    shard = getattr(args, "fp4_indexer_dcp_shard", None)
    if shard is not None:
        mark_dcp_shard(result, bool(shard))
        _warn_if_env_overrides(DCP_SHARD_ENV_VAR, DCP_SHARD_FLAG, bool(shard))
    return result


def _warn_if_env_overrides(env_var: str, flag: str, value: bool) -> None:
    """One stderr line when the environment variable, which wins, turns off ``flag`` given on the command line or file."""
    env = env_setting(env_var)
    if value and env is False:
        print(f"sglang-fp4-indexer: warning: {env_var}={os.environ[env_var]!r} wins over {flag} (the environment "
              "variable, when set, decides; unset it to let the command line decide)", file=sys.stderr)


def _warn_if_unhooked(server_args) -> None:
    """One warning when FP4 is asked for but ``register`` could hook only the flags (the gate never runs then)."""
    from ..gate import Decision, report
    from .facts import global_rank, requested
    from .seams import load_problem

    problem = load_problem()
    if problem and requested(server_args):
        report(Decision(False, problem, "use an SGLang version this release was tested with", ("sglang_seams",)),
               rank=global_rank())


def _factory(base):
    def build(**kwargs):
        _check_env()
        flag = kwargs.pop("enable_fp4_indexer", None)
        shard = kwargs.pop("fp4_indexer_dcp_shard", None)
        server_args = base(**kwargs)
        if flag is not None:
            mark_requested(server_args, bool(flag))
        if shard is not None:
            mark_dcp_shard(server_args, bool(shard))
        return server_args

    build.__doc__ = (
        f"Build {getattr(base, '__name__', base)} from keyword arguments; accepts enable_fp4_indexer=bool "
        "and fp4_indexer_dcp_shard=bool."
    )
    build._fp4_base = base
    return build


def install_engine_kwarg(engine_cls=None) -> bool:
    """Let ``sglang.Engine(..., enable_fp4_indexer=True)`` through.

    Replaces ``engine_cls.server_args_class`` by a factory that pops the keyword
    and marks the built ``ServerArgs``. Without ``engine_cls`` it patches
    ``sglang.srt.entrypoints.engine.Engine`` if that module is already imported
    (it is whenever ``Engine.__init__`` is the caller of ``load_plugins()``), so
    scheduler and detokenizer processes do not import the engine for nothing.
    Idempotent.

    Returns:
        True if the factory is in place on the class.
    """
    if engine_cls is None:
        module = sys.modules.get(_ENGINE_MODULE)
        if module is None:
            return False
        engine_cls = module.Engine
    current = engine_cls.__dict__.get("server_args_class")
    current_fn = current.__func__ if isinstance(current, staticmethod) else current
    if getattr(current_fn, "_fp4_base", None) is not None:
        return True
    engine_cls.server_args_class = staticmethod(_factory(engine_cls.server_args_class))
    return True


def server_args_from_flags(model_path: str, flags: list[str], *, requested: bool | None = None):
    """A raw ``ServerArgs`` from SGLang server flags, parsed by SGLang's own parser (no resolution).

    The parser is ``ServerArgs.add_cli_args`` plus the plugin's flags, built
    directly so no plugin hooks need to be applied. A ``--config FILE`` among
    the flags is merged as ``prepare_server_args`` merges it (SGLang's own
    ``ConfigArgumentMerger``: the file's values first, the flags after them,
    so a flag wins over the file); ``model_path`` comes last and wins over a
    ``model-path`` in the file, which is recorded as ``_config_model_path`` (None without one, or when it is
    ``model_path``) for ``check`` to compare.

    Args:
        model_path: the ``--model-path`` value.
        flags: further SGLang command-line flags.
        requested: if not None, whether the FP4 indexer is asked for in place of the flags' own answer
            (``check`` passes True: it answers as if asked), except that an explicit ``--no-enable-fp4-indexer``
            (the last of the two flags) still turns it off and is recorded as ``_fp4_indexer_turned_off``.

    Raises:
        ValueError: SGLang's parser rejects the flags, or SGLang cannot read
            the ``--config`` file (missing, not YAML, an option it does not take).
    """
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang server flags", exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    add_flag(None, parser)
    argv = [*flags, "--model-path", model_path]
    given = next((a for a in argv if a.startswith("--config=")), None)
    if given is not None:
        raise ValueError(f"{given}: SGLang merges a config file only when it is given as --config FILE (two "
                         f"words); it ignores {given}. Write --config {given.split('=', 1)[1]}")
    if "--config" in argv:
        import logging

        from sglang.srt.utils import server_args_config_parser as config_parser

        # SGLang logs the file's error before raising it; the error raised here says it once, on one line.
        log = logging.getLogger(config_parser.__name__)
        was = log.disabled
        log.disabled = True
        try:
            argv = config_parser.ConfigArgumentMerger(parser).merge_config_with_args(argv)
        except (ValueError, OSError) as exc:  # OSError: SGLang re-raises what open() or PyYAML raised
            raise ValueError(f"--config: {' '.join(str(exc).split())}") from None
        except Exception as exc:  # PyYAML's YAMLError: a file that is not YAML
            raise ValueError(f"--config: SGLang cannot read it: {' '.join(str(exc).split())}") from None
        finally:
            log.disabled = was
    try:
        ns, unknown = parser.parse_known_args(argv)
    except (argparse.ArgumentError, SystemExit) as exc:
        raise ValueError(f"server flags: SGLang's parser rejected {flags}: {exc}") from None
    if unknown:
        def takes_none(flag: str) -> bool:
            action = parser._option_string_actions.get(flag)
            return action is not None and action.nargs == 0

        said, used = [], set()
        for tok in unknown:  # a value after a flag that takes none (a --config file's "flag: maybe") says which
            i = next((i for i in range(1, len(argv)) if argv[i] == tok and i not in used and takes_none(argv[i - 1])),
                     None)
            if i is None:
                said.append(repr(tok))
            else:
                used.add(i)
                said.append(f"{tok!r} after {argv[i - 1]}, which takes no value (in a --config file: true or false)")
        raise ValueError(f"server flags: SGLang does not know {', '.join(said)}")
    record = ServerArgs.from_cli_args(ns)
    # A --config file's model-path comes before ``model_path`` in the merged flags (the file first): check compares
    # it with the model it describes instead of letting ``model_path`` silently win.
    paths = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--model-path"]
    record._config_model_path = paths[0] if len(paths) > 1 and paths[0] != model_path else None
    # The last of --enable-fp4-indexer / --no-enable-fp4-indexer wins (one destination); a --config file's flags are
    # merged before the command line's, so this covers both.
    given = [a for a in argv if a in (FLAG, NO_FLAG)]
    turned_off = bool(given) and given[-1] == NO_FLAG
    mark_requested(record, bool(ns.enable_fp4_indexer) if requested is None else requested and not turned_off)
    if turned_off:
        record._fp4_indexer_turned_off = True  # read by facts.server_facts: which switch turned FP4 off
    mark_dcp_shard(record, bool(getattr(ns, "fp4_indexer_dcp_shard", False)))
    return record
