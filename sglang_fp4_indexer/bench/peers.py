"""Loading the peer scorers the benchmark compares against, without importing them eagerly.

Two peers, both optional (the benchmark says ``unavailable: <reason>`` for a
peer that cannot be loaded):

* SGLang 0.5.23's Triton FP4 scorer,
  ``sglang.kernels.ops.attention.dsv4.fp4_indexer.fp4_index_logits_paged``
  (the DeepSeek-V4 indexer path). Importing ``sglang`` itself runs
  ``sglang/__init__.py``, which pulls in the whole serving stack
  (transformers, the language frontend, FlashInfer, ...). The kernel module
  needs none of that, so ``load_sglang_fp4_indexer`` registers the package
  *shells* on the path to it (``sglang``, ``sglang.kernels``, ...: proper
  package modules with SGLang's own ``__path__`` and ``__spec__``, whose
  ``__init__.py`` is not executed) and then imports the kernel module and
  every module it imports with the ordinary import system. All the code that
  runs is SGLang's own, unmodified; only the package ``__init__`` side effects
  are skipped. The third-party packages that import chain needs are listed in
  ``SGLANG_PEER_REQUIREMENTS`` (docs/benchmarks.md says how they were found).
* DeepGEMM's ``fp8_paged_mqa_logits`` (what SGLang runs on H200 today), from
  the ``deep_gemm`` package when it imports.

(The third DeepGEMM column, its newer SM90 kernel, is no Python package: its
headers are named by ``$SGLANG_FP4_INDEXER_DEEPGEMM_SM90_INCLUDE`` and
``bench.deepgemm_sm90_paged`` builds and calls this project's launcher for it.)

Nothing here is imported by the core modules; SGLang is imported lazily and
only by the benchmark.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from types import ModuleType

__all__ = [
    "SGLANG_FP4_MODULE",
    "SGLANG_VERSION",
    "SGLANG_SHELL_PACKAGES",
    "SGLANG_PEER_REQUIREMENTS",
    "SGLANG_PEER_IMAGE_REQUIREMENTS",
    "PEER_SITE_ENV",
    "add_peer_site",
    "load_sglang_fp4_indexer",
    "load_deep_gemm",
]

#: The module holding SGLang's Triton FP4 scorer.
SGLANG_FP4_MODULE = "sglang.kernels.ops.attention.dsv4.fp4_indexer"
#: The SGLang release whose scorer the benchmark was written against.
SGLANG_VERSION = "0.5.23"
#: Packages whose ``__init__.py`` is skipped (their modules are imported normally).
#: ``sglang`` (the serving API), ``sglang.kernels`` and ``sglang.kernels.ops``
#: (the kernel registry and every operator group), the two attention
#: packages and ``sglang.kernels.ops.quantization`` (operator groups), and
#: ``sglang.srt.utils`` (re-exports ``network``, which needs pyzmq).
SGLANG_SHELL_PACKAGES = (
    "sglang",
    "sglang.kernels",
    "sglang.kernels.ops",
    "sglang.kernels.ops.attention",
    "sglang.kernels.ops.attention.dsv4",
    "sglang.kernels.ops.quantization",
    "sglang.srt.utils",
)
#: Distributions (PyPI names, pinned as tested) that the import chain of
#: ``SGLANG_FP4_MODULE``, loaded through ``load_sglang_fp4_indexer``, needs and
#: the device image (KINDS.md, read 2026-11-17) lacks: SGLang itself, and what
#: ``sglang.srt.utils.common`` / ``sglang.srt.runtime_context`` /
#: ``sglang.kernels.jit.utils`` import at module level. scripts/fetch_peer_wheels.sh
#: downloads these (cp312); docs/benchmarks.md records how the set was found.
SGLANG_PEER_REQUIREMENTS = (
    "sglang==0.5.23",
    "orjson==3.13.0",
    "pybase64==1.5.1",
    "msgspec==0.23.0",
    "pydantic-core==2.50.5",
    "starlette==1.10.0",
)
#: The rest of that import chain's needs beyond torch, triton and numpy: already in
#: the device image, so not carried by default (``fetch_peer_wheels.sh --all`` adds them).
SGLANG_PEER_IMAGE_REQUIREMENTS = (
    "anyio==4.16.0",
    "certifi==2026.10.19.post1",
    "charset-normalizer==3.5.3",
    "idna==3.20",
    "packaging==26.4",
    "pillow==13.0.0",
    "psutil==7.2.2",
    "requests==2.34.2",
    "urllib3==2.8.0",
)
#: Environment variable: extra folders (``os.pathsep``-separated) appended to
#: ``sys.path`` before SGLang is looked up -- where scripts/gpu_run.sh installs the
#: carried wheels. Appended, not prepended, so the device's own packages win.
PEER_SITE_ENV = "SGLANG_FP4_INDEXER_PEER_SITE"


def _register_shell(name: str, root: str) -> None:
    path = os.path.join(root, *name.split("."))
    init = os.path.join(path, "__init__.py")
    if not os.path.isfile(init):
        raise ModuleNotFoundError(f"{name}: no package at {path}")
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[path])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent and parent in sys.modules:
        setattr(sys.modules[parent], child, module)


def add_peer_site() -> list[str]:
    """Append the folders named in ``$SGLANG_FP4_INDEXER_PEER_SITE`` to ``sys.path`` (once each).

    Returns:
        The folders appended now (existing ones only).
    """
    added = []
    for folder in os.environ.get(PEER_SITE_ENV, "").split(os.pathsep):
        if folder and os.path.isdir(folder) and folder not in sys.path:
            sys.path.append(folder)
            added.append(folder)
    if added:
        importlib.invalidate_caches()
    return added


def load_sglang_fp4_indexer() -> ModuleType:
    """Import SGLang's FP4 indexer kernel module without running SGLang's package ``__init__`` files.

    Folders in ``$SGLANG_FP4_INDEXER_PEER_SITE`` are appended to ``sys.path``
    first (``add_peer_site``). If ``sglang`` is already imported (the full
    package), the module is imported the ordinary way. Otherwise the packages in
    ``SGLANG_SHELL_PACKAGES`` are registered as shells first (module
    docstring); they stay registered for the life of the process, so a later
    plain ``import sglang`` in the same process gets the shell (the benchmark
    process never needs more).

    Returns:
        The module ``sglang.kernels.ops.attention.dsv4.fp4_indexer``.

    Raises:
        ModuleNotFoundError: SGLang, or a package its kernel modules import, is
            not installed (the message names it).
        ImportError / AttributeError: the installed SGLang does not have the
            scorer (another release).
    """
    add_peer_site()
    if "sglang" not in sys.modules:
        spec = importlib.util.find_spec("sglang")
        if spec is None or not spec.submodule_search_locations:
            raise ModuleNotFoundError("sglang is not installed", name="sglang")
        root = os.path.dirname(list(spec.submodule_search_locations)[0])
        for name in SGLANG_SHELL_PACKAGES:
            if name not in sys.modules:
                _register_shell(name, root)
    module = importlib.import_module(SGLANG_FP4_MODULE)
    getattr(module, "fp4_index_logits_paged")
    return module


def load_deep_gemm() -> ModuleType:
    """Import ``deep_gemm`` and check it has a paged scorer (``ops.deepgemm.read_api``) and its planner.

    Folders in ``$SGLANG_FP4_INDEXER_PEER_SITE`` are appended to ``sys.path`` first.

    Raises:
        ModuleNotFoundError / ImportError / OSError: ``deep_gemm`` is missing or
            does not load (e.g. built for another torch or CUDA).
        AttributeError: it has neither paged form (sgl-deep-gemm 0.2.3's ``fp8_paged_mqa_logits``,
            0.2.5's ``fp8_fp4_paged_mqa_logits``), or lacks ``get_paged_mqa_logits_metadata``.
    """
    from ..ops.deepgemm import read_api

    add_peer_site()
    module = importlib.import_module("deep_gemm")
    found = read_api(module)
    if found.paged is None:
        raise AttributeError(found.paged_problem)
    getattr(module, "get_paged_mqa_logits_metadata")
    return module
