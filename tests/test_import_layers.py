"""The package's imports go one way and form no cycle (docs/design.md, Module map).

Layers, top to bottom: the command's entry point (``cli``, which wires the subcommands and hands ``check``
the adapter's SGLang fact reader), the adapter (``sglang_plugin``), the core (every other module and
subpackage), the kernels (``ops``), the format (``format``, with ``pool``, the page layout, and
``reference``, the torch oracles). A module may import its own layer or a lower one, never a higher one.
Every import counts: at module level and inside functions (a call-time import is still a dependency, and
still a cycle), and the subcommand modules ``cli`` imports by name (its ``_Subcommand`` table).

The graph is read from the source with ``ast``, not by importing (so SGLang, torch and Triton are not
needed, and a call-time import that no test reaches is still seen).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = "sglang_fp4_indexer"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE

#: Layer of each module, bottom (0) to top. The format layer: the byte format, the page layout and the
#: torch oracles every kernel is checked against; the kernels build on it; the core builds on the kernels;
#: the adapter on the core.
FORMAT, OPS, CORE, ADAPTER, ENTRY = 0, 1, 2, 3, 4
LAYER_NAMES = {FORMAT: "format", OPS: "ops", CORE: "core", ADAPTER: "adapter", ENTRY: "entry point"}
FORMAT_MODULES = {f"{PACKAGE}", f"{PACKAGE}.format", f"{PACKAGE}.pool", f"{PACKAGE}.reference"}
ENTRY_MODULES = {f"{PACKAGE}.cli"}


def layer_of(module: str) -> int:
    """The layer of a dotted module name of the package (the explicit table above)."""
    if module in FORMAT_MODULES:
        return FORMAT
    if module in ENTRY_MODULES:
        return ENTRY
    if module == f"{PACKAGE}.ops" or module.startswith(f"{PACKAGE}.ops."):
        return OPS
    if module == f"{PACKAGE}.sglang_plugin" or module.startswith(f"{PACKAGE}.sglang_plugin."):
        return ADAPTER
    return CORE


def package_modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted name -> source file of every module under ``root`` (a package's name is its ``__init__``)."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a ``from X import ...`` names (relative levels resolved against ``importer``)."""
    if node.level == 0:
        return node.module or ""
    base = importer.split(".")
    if not is_package:
        base = base[:-1]
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Edges importer -> imported module, for imports of the package's own modules, at any depth in the file.

    ``from P import name`` is an edge to ``P.name`` where that is a module, else to ``P``; ``import a.b.c``
    an edge to the longest prefix that is a module; ``_Subcommand(name, ".module", ...)`` (``cli``'s table of
    modules imported by name) an edge to that module.
    """
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Import):
                for alias in node.names:
                    parts = alias.name.split(".")
                    for end in range(len(parts), 0, -1):
                        candidate = ".".join(parts[:end])
                        if candidate in modules:
                            targets.append(candidate)
                            break
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, is_package, node)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in modules else base)
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "_Subcommand"
                  and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)):
                # cli's subcommand table: the module is imported by name, relative to the package
                package = name if is_package else name.rsplit(".", 1)[0]
                targets.append(package + node.args[1].value)
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of ``graph``, each sorted, largest first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(components, key=len, reverse=True)


def wrong_direction(graph: dict[str, set[str]]) -> list[str]:
    """Every edge from a lower layer to a higher one, as ``"a (layer) -> b (layer)"``."""
    return sorted(
        f"{a} ({LAYER_NAMES[layer_of(a)]}) -> {b} ({LAYER_NAMES[layer_of(b)]})"
        for a, targets in graph.items() for b in targets if layer_of(b) > layer_of(a)
    )


@pytest.fixture(scope="module")
def graph():
    modules = package_modules()
    assert f"{PACKAGE}.format" in modules and f"{PACKAGE}.sglang_plugin" in modules  # the walk found the package
    return import_graph(modules)


def test_no_import_cycle(graph):
    cycles = [c for c in strongly_connected(graph) if len(c) > 1]
    assert not cycles, "import cycles (strongly connected components):\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_imports_go_one_way(graph):
    bad = wrong_direction(graph)
    assert not bad, ("imports against the layer order entry point -> adapter -> core -> ops -> format:\n"
                     + "\n".join(bad))


# The checker itself, on small synthetic packages whose answer is known by construction.

def _write(root: Path, files: dict[str, str]) -> dict[str, Path]:
    for rel, text in files.items():
        path = root / PACKAGE / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return package_modules(root / PACKAGE)


def test_checker_sees_call_time_cycle_and_wrong_direction(tmp_path):
    modules = _write(tmp_path, {
        "__init__.py": "",
        "format.py": "",
        "ops/__init__.py": "",
        "ops/a.py": "from ..format import X\ndef f():\n    from ..gate import decide\n",
        "gate.py": "from .ops import a\n",
        "sglang_plugin/__init__.py": "def g():\n    from . import kv_pool\n",
        "sglang_plugin/kv_pool.py": "from . import missing_hooks\nimport sglang_fp4_indexer.gate\n",
        "cli.py": "SUBCOMMANDS = (_Subcommand('check', '.gate', 'help'),)\n",
    })
    g = import_graph(modules)
    assert g[f"{PACKAGE}.ops.a"] == {f"{PACKAGE}.format", f"{PACKAGE}.gate"}
    assert g[f"{PACKAGE}.sglang_plugin.kv_pool"] == {f"{PACKAGE}.sglang_plugin", f"{PACKAGE}.gate"}
    assert g[f"{PACKAGE}.cli"] == {f"{PACKAGE}.gate"}
    cycles = [c for c in strongly_connected(g) if len(c) > 1]
    assert sorted(cycles) == [[f"{PACKAGE}.gate", f"{PACKAGE}.ops.a"],
                              [f"{PACKAGE}.sglang_plugin", f"{PACKAGE}.sglang_plugin.kv_pool"]]
    assert wrong_direction(g) == [f"{PACKAGE}.ops.a (ops) -> {PACKAGE}.gate (core)"]


def test_checker_passes_a_clean_package(tmp_path):
    modules = _write(tmp_path, {
        "__init__.py": "",
        "format.py": "",
        "ops/__init__.py": "",
        "ops/a.py": "from .. import format as fmt\n",
        "gate.py": "from .ops.a import f\n",
        "sglang_plugin/__init__.py": "from ..gate import decide\n",
    })
    g = import_graph(modules)
    assert all(len(c) == 1 for c in strongly_connected(g))
    assert wrong_direction(g) == []
