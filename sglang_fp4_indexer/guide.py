"""``sglang-fp4-indexer docs``: where the user documentation and the SGLang ``--config`` files are, and how to report.

The wheel carries the user documents in ``sglang_fp4_indexer/docs/`` and the
per-model SGLang ``--config`` files in ``sglang_fp4_indexer/configs/`` (copied
there at build time by the checkout's ``setup.py``: README.md, CHANGELOG.md,
every page of docs/ and every file of configs/). From a checkout (an editable
install, or ``PYTHONPATH``) they are the checkout's own files.
Nothing here imports torch, Triton or SGLang.
"""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["DOCS", "REPORT", "docs_dir", "doc_path", "configs_dir", "config_names", "config_path", "add_arguments",
           "main"]

#: The user documents, in reading order, with what each answers.
DOCS = (
    ("README.md", "should you turn it on: what FP4 gives and costs, measured on which GPU and stack, what was "
                  "never run; install, the two commands"),
    ("user-guide.md", "enable, check before you launch, turn off, uninstall, report results, what is refused"),
    ("demo.md", "the demo's table and options"),
    ("accuracy.md", "what FP4 costs the indexer's top-k: the accuracy study"),
    ("benchmarks.md", "the measured H200 times, the method and the bench commands"),
    ("perf-notes.md", "why the Hopper scorer is built as it is, and what limits it"),
    ("format.md", "the MXFP4 index-key format, byte by byte"),
    ("design.md", "the design the code relies on: terms, contracts, module map, departures from the original design"),
    ("sglang-seams.md", "where the plugin meets SGLang's code"),
    ("CHANGELOG.md", "changes per version"),
)
#: How to report a result; the user guide's "Report results" section says what to include.
REPORT = ("There is no public issue tracker for this package: send your report to the person or team you got the "
          "package (the checkout or the wheel) from, with what user-guide.md lists under \"Report results\".")

_PACKAGE = Path(__file__).resolve().parent


def docs_dir() -> Path | None:
    """The folder of the installed user documents, or None when neither copy is there.

    Returns:
        ``sglang_fp4_indexer/docs`` of an installed wheel; from a checkout
        (no such folder in the package), the checkout's ``docs/``.
    """
    installed = _PACKAGE / "docs"
    if (installed / "user-guide.md").is_file():
        return installed
    checkout = _PACKAGE.parent / "docs"
    if (checkout / "user-guide.md").is_file():
        return checkout
    return None


def doc_path(name: str) -> Path | None:
    """The file of one user document (``DOCS`` names), or None when it is not there.

    README.md and CHANGELOG.md sit next to the pages in the wheel, and at the
    top of a checkout (one level above its docs/).
    """
    folder = docs_dir()
    if folder is None:
        return None
    for candidate in (folder / name, folder.parent / name):
        if candidate.is_file():
            return candidate
    return None


def configs_dir() -> Path | None:
    """The folder of the shipped SGLang ``--config`` files, or None when neither copy is there.

    Returns:
        ``sglang_fp4_indexer/configs`` of an installed wheel; from a checkout, the checkout's ``configs/``.
    """
    for folder in (_PACKAGE / "configs", _PACKAGE.parent / "configs"):
        if any(folder.glob("*.yaml")):
            return folder
    return None


def config_names() -> list[str]:
    """The names of the shipped ``--config`` files (file names without ``.yaml``), sorted; empty when none."""
    folder = configs_dir()
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder is not None else []


def config_path(name: str) -> Path:
    """The shipped ``--config`` file ``name`` (``deepseek-v3.2``, with or without ``.yaml``).

    Raises:
        ValueError: no shipped config of that name (the message lists the names), or none is installed.
    """
    folder = configs_dir()
    stem = name[:-5] if name.endswith(".yaml") else name
    if folder is None:
        raise ValueError("--config: the SGLang config files are not installed with this copy "
                         "(a wheel built with 'make wheel' carries them)")
    if stem not in config_names():
        raise ValueError(f"--config: no shipped config {name!r}; expected one of {', '.join(config_names())}")
    return folder / f"{stem}.yaml"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``docs``."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--path", action="store_true",
                       help="print only the folder of the user guide (for scripts: "
                            "less \"$(sglang-fp4-indexer docs --path)/user-guide.md\")")
    group.add_argument("--config", metavar="NAME", default=None,
                       help="print only the path of the shipped SGLang --config file NAME (e.g. deepseek-v3.2), "
                            "for sglang serve --model-path MODEL --config \"$(sglang-fp4-indexer docs --config "
                            "NAME)\"")


def main(args: argparse.Namespace) -> int:
    """List the user documents and config files with their paths, then how to report a result.

    Returns:
        0; 1 when the documents are not installed.

    Raises:
        ValueError: ``--config NAME`` names no shipped config (``config_path``).
    """
    if getattr(args, "config", None) is not None:
        print(config_path(args.config))
        return 0
    folder = docs_dir()
    if folder is None:
        print("the user documentation is not installed with this copy of sglang-fp4-indexer "
              "(a wheel built with `make wheel` carries it)")
        return 1
    if args.path:
        print(folder)
        return 0
    from . import __version__

    print(f"sglang-fp4-indexer {__version__}: the user documentation is in {folder}")
    shown = [(name if path.parent == folder else f"../{name}", what)
             for name, what in DOCS if (path := doc_path(name)) is not None]
    width = max(len(name) for name, _ in shown)
    for name, what in shown:
        print(f"  {name:<{width}}  {what}")
    print("(plain Markdown: open them in any viewer, e.g. less; the links to benchmarks/results/ point into the "
          "source checkout, which keeps the raw measurements)")
    configs = configs_dir()
    if configs is not None:
        print(f"SGLang --config files, in {configs} (one path: sglang-fp4-indexer docs --config NAME):")
        for name in config_names():
            print(f"  {name}.yaml")
    print(REPORT)
    return 0
