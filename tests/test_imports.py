"""No two modules of torchkiln import each other, directly or round a loop.

Every module under src/torchkiln is parsed with `ast`; an edge runs from a module to each
torchkiln module it imports, absolute (`torchkiln.x.y`) or relative (`.y`, `..x`), at module
level or inside a function: a function-level import runs too when the function is called, so
it is as much a dependency (only imports under `if TYPE_CHECKING:`, which never run, are left
out). `from pkg import name` counts as an import of `pkg.name` when that is a module, else of
`pkg`. A package's `__init__` importing its own submodules is allowed: that is how a package
re-exports its names and registers its built-ins (variants' eager, inductor and cudagraphs,
the backends of torchkiln.backends, the workload zoo).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def module_table(src: Path, package: str) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, whether it is a package's __init__)."""
    table = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        table[".".join(parts)] = (path, is_package)
    return table


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:`."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = getattr(test, "id", None) or getattr(test, "attr", None)
            if name == "TYPE_CHECKING":
                skipped |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skipped


def imports_of(module: str, path: Path, is_package: bool, table: dict) -> set[str]:
    """The package's modules that ``module`` imports (itself and, for a package's __init__,
    its own submodules left out)."""

    def nearest(name: str) -> str | None:
        while name and name not in table:
            name = name.rpartition(".")[0]
        return name or None

    tree = ast.parse(path.read_text(), filename=str(path))
    skipped = _type_checking_only(tree)
    here = module if is_package else module.rpartition(".")[0]
    found: set[str | None] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {nearest(a.name) for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                full = f"{source}.{alias.name}"
                found.add(full if full in table else nearest(source))
    found.discard(None)
    found.discard(module)
    if is_package:
        found = {m for m in found if not m.startswith(module + ".")}
    return {m for m in found if m is not None}


def import_graph(src: Path, package: str) -> dict[str, set[str]]:
    table = module_table(src, package)
    return {m: imports_of(m, path, is_pkg, table) for m, (path, is_pkg) in table.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One loop for every group of modules that reach each other (Tarjan's components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1 or v in graph.get(v, ()):
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_loop(sorted(g), graph) for g in groups]


def _loop(group: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A path round the group from its first module back to it, to name in the failure."""
    members, start = set(group), group[0]
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    return group


def _tree(tmp: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp


def test_torchkiln_has_no_import_cycle():
    graph = import_graph(SRC, "torchkiln")
    assert "torchkiln.runner.protocol.measure_trial" in graph  # the walk found the package
    assert "torchkiln.runner.protocol.executable" in graph["torchkiln.runner.protocol.worker"]
    loops = cycles(graph)
    assert not loops, "import loops:\n" + "\n".join(" -> ".join(loop) for loop in loops)


def test_the_walk_finds_loops_through_function_level_and_relative_imports(tmp_path):
    src = _tree(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg import a\n",
            "pkg/a.py": "from pkg.b import f\n",
            "pkg/b.py": "def f():\n    from . import c\n",
            "pkg/c.py": "import pkg.a\n",
            "pkg/d.py": "from pkg import a\n",
        },
    )
    graph = import_graph(src, "pkg")
    assert graph["pkg.b"] == {"pkg.c"}  # inside a function, relative
    assert graph["pkg"] == set()  # a package importing its own submodule is allowed
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]


def test_type_checking_imports_and_registration_by_the_package_are_not_loops(tmp_path):
    src = _tree(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg import builtin\n",
            "pkg/base.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n"
                "    from pkg.builtin import X\n"
            ),
            "pkg/builtin.py": "from pkg.base import register\n",
        },
    )
    graph = import_graph(src, "pkg")
    assert graph["pkg.base"] == set()
    assert graph["pkg.builtin"] == {"pkg.base"}
    assert cycles(graph) == []
