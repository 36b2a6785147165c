"""The ``sglang-fp4-indexer`` command: argparse wiring only.

Each subcommand's work lives in its own module; this file only builds the
parser and dispatches. To add a subcommand (``check``, ``bench``, ``info``,
``accuracy``), append a ``_Subcommand`` to ``SUBCOMMANDS``: its module must
provide ``add_arguments(parser)`` and ``main(args) -> int``. Modules are
imported only when their subcommand runs (or its parser is built), and a
subcommand whose ``device`` option is ``cpu`` gets ``TRITON_INTERPRET=1`` set
before its module -- and so Triton and the kernels -- is imported, because
Triton reads that variable when a kernel is defined.

Subcommands now: ``demo`` (``demo.py``), ``check`` (``check/``), ``bench`` (``bench/``),
``accuracy`` (``accuracy/``), ``model-accuracy`` (``model_study/study.py``), ``ab`` (``ab/``), ``docs`` (``guide.py``).

This module is the entry point above every layer: the one place that hands ``check`` the SGLang adapter's
fact reader (``sglang_plugin.check_facts``), so the core never imports the adapter.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from dataclasses import dataclass
from typing import Sequence

__all__ = ["SUBCOMMANDS", "SGLANG_VERSION", "build_parser", "main"]


@dataclass(frozen=True)
class _Subcommand:
    name: str
    module: str  # relative to this package; provides add_arguments(parser) and main(args) -> int
    help: str


#: The subcommands, in the order ``--help`` lists them.
SUBCOMMANDS: tuple[_Subcommand, ...] = (
    _Subcommand("demo", ".demo",
                "the main job: FP4 vs FP8 vs exact indexer scoring on one decode step (one table)"),
    _Subcommand("check", ".check",
                "would --enable-fp4-indexer serve this model (and these SGLang flags)? decision and memory effect"),
    _Subcommand("bench", ".bench",
                "benchmark: the paged scorer vs SGLang's Triton FP4 and DeepGEMM FP8 vs the HBM floor, "
                "the store op and the planner (method and H200 results: benchmarks.md of the installed docs)"),
    _Subcommand("accuracy", ".accuracy",
                "accuracy study: FP4 vs FP8 top-k recall, rank correlation and logit error against exact scoring "
                "over workloads, contexts and H (results: accuracy.md of the installed docs)"),
    _Subcommand("model-accuracy", ".model_study.study",
                "real-model study: Gemma 3 270M with DSA-style sparse attention selected over exact, FP8 and FP4 "
                "index keys -- loss, passkey retrieval and top-k recall (on the CPU, or a GPU with --device cuda; "
                "accuracy.md of the installed docs)"),
    _Subcommand("ab", ".ab",
                "A/B on your deployment: the same SGLang server with FP8 and with FP4 index keys, one after the "
                "other (or two running servers): GSM8K, passkey, serving speed and KV capacity side by side"),
    _Subcommand("docs", ".guide",
                "where the user documentation is installed (user guide, benchmarks, accuracy study, ...), "
                "and how to report a result"),
)

#: The SGLang release the plugin is built and tested against.
SGLANG_VERSION = "0.5.23"


class _Parser(argparse.ArgumentParser):
    """``ArgumentParser`` whose usage errors are one line (``PROG: error: MESSAGE``, exit 2).

    argparse prints the whole usage text before the error by default; for
    subcommands with many options that buries the line that matters.
    """

    def error(self, message: str):
        if message.startswith("argument --sglang-args: expected one argument"):
            message += (" (a value that starts with '-' needs the = form: --sglang-args=\"--enable-hierarchical-cache\"; "
                        "argparse reads --sglang-args \"--flag\" as two options)")
        self.exit(2, f"{self.prog}: error: {message} (--help lists the options)\n")


def _module(sub: _Subcommand):
    return importlib.import_module(sub.module, __package__)


def build_parser() -> argparse.ArgumentParser:
    """The command's parser: ``--version`` and one subparser per entry of ``SUBCOMMANDS``.

    Usage errors print one line naming the option and exit with code 2.
    Building it imports each subcommand's module but not Triton (the modules
    import their kernels lazily).
    """
    from . import __version__
    from .guide import docs_dir

    folder = docs_dir()
    where = (f"The user documentation is in {folder} ('sglang-fp4-indexer docs' lists it and says how to "
             "report a result)." if folder is not None else
             "The user documentation is not installed with this copy (a wheel built with 'make wheel' carries it).")
    parser = _Parser(
        prog="sglang-fp4-indexer",
        description="MXFP4 index-key cache and Triton scorers for SGLang's DSA lightning indexer. " + where,
    )
    parser.add_argument("--version", action="version",
                        version=f"%(prog)s {__version__} (for SGLang {SGLANG_VERSION})")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    parser.subcommand_parsers = {}  # name -> its parser, whose error names the subcommand (main)
    for sub in SUBCOMMANDS:
        sp = subparsers.add_parser(sub.name, help=sub.help, description=sub.help)
        _module(sub).add_arguments(sp)
        sp.set_defaults(_subcommand=sub)
        parser.subcommand_parsers[sub.name] = sp
    return parser


def _run(sub: _Subcommand, args: argparse.Namespace) -> int:
    """Run one subcommand. ``check`` (and ``ab``, which asks the same question first) also gets the adapter's SGLang fact reader: the core decides from fact records
    and never imports the adapter, so this entry point (above both) wires the two together."""
    module = _module(sub)
    if sub.name == "check":
        from .sglang_plugin.check_facts import read_sglang_facts

        return module.main(args, read_sglang=read_sglang_facts)
    if sub.name == "ab":  # also SGLang's GSM8K answer reader, through the adapter
        from .sglang_plugin.check_facts import gsm8k_answer_value, read_sglang_facts

        return module.main(args, read_sglang=read_sglang_facts, answer_value=gsm8k_answer_value)
    return module.main(args)


def _wants_interpreter(args: argparse.Namespace) -> bool:
    device = getattr(args, "device", None)
    return isinstance(device, str) and device.strip().lower() == "cpu"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script ``sglang-fp4-indexer``.

    Args:
        argv: arguments without the program name (default ``sys.argv[1:]``).

    Returns:
        The subcommand's exit code; 2 on a usage error (argparse's convention,
        also used for a ``ValueError`` raised by the subcommand on bad options); 1, with one line, when ``ab``
        stops on a ``RuntimeError`` (a server that does not start, an SGLang client that fails).
    """
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version"):
        names = ", ".join(sub.name for sub in SUBCOMMANDS)
        parser.error(f"unrecognized option {argv[0]}: the command comes first, one of {names} "
                     "(its options after it: sglang-fp4-indexer COMMAND --help)")
    tail = None
    if argv and argv[0] == "ab" and "--" in argv:  # ab's SGLang server flags: everything after the first --
        at = argv.index("--")
        argv, tail = argv[:at], argv[at + 1:]
    # argparse reports a subcommand's unknown option from the top-level parser; the subcommand's own names it.
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.subcommand_parsers[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    if tail is not None:
        args.server_flags = tail
    if _wants_interpreter(args):
        # Must precede the first import of triton / the ops modules.
        os.environ["TRITON_INTERPRET"] = "1"
    if args.command == "ab":
        # A time limit's SIGTERM (timeout, a job scheduler) ends an A/B as Ctrl-C does: the launched server is
        # stopped on the way out instead of being left holding the GPU and the port.
        import signal

        def _terminated(signum, frame):
            raise KeyboardInterrupt

        signal.signal(signal.SIGTERM, _terminated)
    try:
        return int(_run(args._subcommand, args))
    except ValueError as exc:
        parser.exit(2, f"{parser.prog} {args.command}: error: {exc}\n")
    except RuntimeError as exc:
        if args.command != "ab":
            raise
        # A server that does not start or an SGLang client that fails: one line, the finished arms kept.
        parser.exit(1, f"{parser.prog} ab: stopped: {exc}\n(the arms finished so far are kept in {args.out}; the "
                       "same command resumes there)\n")
    except KeyboardInterrupt:
        if args.command != "ab":
            raise
        # Ctrl-C during an A/B: the arm running is dropped (its server stopped on the way out), the finished kept.
        from sglang_fp4_indexer.ab.command import finished_arms

        kept = finished_arms(args.out) if os.path.isdir(args.out) else []
        parser.exit(130, f"\n{parser.prog} ab: interrupted (" + (
            f"the arms finished so far are kept in {args.out}; the same command resumes there" if kept
            else "before any arm finished: nothing kept") + ")\n")


if __name__ == "__main__":
    sys.exit(main())
