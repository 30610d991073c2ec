"""The package's wiring reads one way (issue 40, "Visible wiring"): no import circles, counting imports inside
functions (a deferred import is still a dependency); no module imports a layer above its own; no function past
80 lines. ``TYPE_CHECKING`` imports are annotations only and do not count."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"tracer": "memtrace", "plots": "memtrace.plots", "plugins": "memtrace.plugins"}

#: what each layer may not import (data flows capture -> Trace -> analysis -> renderers / CLI)
FORBIDDEN = {
    "memtrace.model": ("memtrace.analysis", "memtrace.plots", "memtrace.cli", "memtrace.capture", "memtrace.plugins"),
    "memtrace.store": ("memtrace.analysis", "memtrace.plots", "memtrace.cli", "memtrace.capture", "memtrace.plugins"),
    "memtrace.importers": (
        "memtrace.analysis",
        "memtrace.plots",
        "memtrace.cli",
        "memtrace.capture",
        "memtrace.plugins",
    ),
    "memtrace.analysis": ("memtrace.plots", "memtrace.cli", "memtrace.capture", "memtrace.plugins"),
    "memtrace.capture": ("memtrace.analysis", "memtrace.plots", "memtrace.cli"),
    "memtrace.plots": ("memtrace.cli", "memtrace.capture", "memtrace.plugins"),
}


def _modules() -> dict[str, Path]:
    mods = {}
    for folder, base in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [p for p in path.relative_to(ROOT / folder).with_suffix("").parts if p != "__init__"]
            mods[".".join([base, *parts])] = path
    return mods


def _imports(path: Path, known: dict[str, Path]) -> set[str]:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            node.body = []
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("memtrace"):
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                out.add(name if name in known else node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("memtrace"))
    return {m for m in out if m in known}


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(p, mods) - {m} for m, p in mods.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_takes_part_in_an_import_circle():
    assert _circles(_graph()) == []


def test_the_circle_finder_finds_one():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_imports_a_layer_above_its_own():
    bad = []
    for mod, deps in _graph().items():
        for layer, above in FORBIDDEN.items():
            if mod == layer or mod.startswith(layer + "."):
                bad += [f"{mod} -> {d}" for d in deps if d.startswith(above)]
    assert bad == []


def test_no_function_is_longer_than_80_lines():
    long = []
    for path in _modules().values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 80:
                long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1})")
    assert long == []
