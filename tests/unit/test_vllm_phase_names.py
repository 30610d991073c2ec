"""vLLM's phase names are spelled once, in memtrace.vllm_phase_names (issue 40: one registry, below every layer)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from memtrace import vllm_phase_names as N

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [p for d in ("tracer", "plugins", "plots") for p in (ROOT / d).rglob("*.py")]
REGISTRY_FILE = ROOT / "tracer" / "vllm_phase_names.py"
#: Strings equal to a phase name that are not phase names: (file, string) -> why.
NOT_PHASES = {
    ("tracer/analysis/gate/history_key.py", "kv_cache_sizing"): "the history key of the KV sizing mode",
}


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring nodes of a module, its classes and functions."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _is_phase_name(text: str) -> bool:
    """A registered name, or a '/'-joined path of them (an f-string's piece may start or end at a '/')."""
    parts = text.strip("/").split("/")
    return text.strip("/") != "" and all(p in N.REGISTRY for p in parts)


def _phase_literals(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = _docstrings(tree)
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
        if _is_phase_name(node.value)
    ]


def test_no_module_spells_a_vllm_phase_name_itself():
    offenders = [
        f"{rel}:{line} {text!r}"
        for p in SOURCES
        if p != REGISTRY_FILE
        for line, text in _phase_literals(p)
        if ((rel := p.relative_to(ROOT).as_posix()), text) not in NOT_PHASES
    ]
    assert not offenders, "use memtrace.vllm_phase_names constants:\n" + "\n".join(offenders)


def test_the_check_sees_literals_and_paths_but_not_docstrings(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        '"""profile_run"""\n'
        'A = "profile_run"\n'
        'B = "determine_available_memory/profile_run"\n'
        'C = f"{A}/capture_model"\n'
        'D = "initialize_kv_cache"\n'
        "def f():\n"
        '    """kv_cache_init"""\n'
    )
    found = sorted(t for _, t in _phase_literals(sample))
    assert found == ["/capture_model", "determine_available_memory/profile_run", "profile_run"]


def test_every_name_is_documented_and_nests_in_a_top_level_phase():
    assert len(N.REGISTRY) >= 13
    for name, phase in N.REGISTRY.items():
        assert phase.name == name and phase.doc, name
        assert phase.parent is None or N.REGISTRY[phase.parent].parent is None, name
    assert N.REGISTRY[N.KV_CACHE_SIZING_WARMUP].parent == N.COMPILE_OR_WARM_UP
    assert N.REGISTRY[N.PROFILE_RUN].parent == N.DETERMINE_AVAILABLE_MEMORY


def test_the_registry_imports_nothing_of_memtrace():
    code = "import memtrace.vllm_phase_names, sys; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    loaded = {m for m in out.stdout.split() if m.startswith("memtrace.")}
    assert loaded == {"memtrace.vllm_phase_names"}, loaded


def test_the_plugin_and_its_table_take_the_names_from_the_registry():
    from memtrace.plugins import surface

    # every phase the table marks is registered, and every registered phase is marked by some entry
    assert {e.phase for e in surface.TABLE if e.phase} == set(N.REGISTRY)
