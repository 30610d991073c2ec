"""Fact keys are spelled once, in memtrace.facts (issue 10: one registry, documented with the format)."""

from __future__ import annotations

import ast
from pathlib import Path

from memtrace import facts as F

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [p for d in ("tracer", "plugins", "plots", "examples") for p in (ROOT / d).rglob("*.py")]
REGISTRY_FILE = ROOT / "tracer" / "facts.py"


def _fact_key_literals(path: Path) -> list[tuple[int, str]]:
    """String literals used as a facts key: facts["k"], facts.get("k"), set_fact("k", ...), "k" in facts."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        key = None
        if isinstance(node, ast.Subscript) and _is_facts(node.value):
            key = node.slice
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("get", "pop", "setdefault") and _is_facts(node.func.value) and node.args:
                key = node.args[0]
            elif node.func.attr == "set_fact" and node.args:
                key = node.args[0]
        elif isinstance(node, ast.Compare) and any(_is_facts(c) for c in node.comparators):
            key = node.left
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            found.append((node.lineno, key.value))
    return found


def _is_facts(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "facts") or (
        isinstance(node, ast.Name) and node.id == "facts"
    )


def test_no_module_spells_a_fact_key_itself():
    offenders = [
        f"{p.relative_to(ROOT)}:{line} {key!r}"
        for p in SOURCES
        if p != REGISTRY_FILE
        for line, key in _fact_key_literals(p)
    ]
    assert not offenders, "use memtrace.facts constants:\n" + "\n".join(offenders)


def test_every_registered_key_is_documented_with_a_type_and_a_writer():
    assert len(F.REGISTRY) >= 25
    for key, fact in F.REGISTRY.items():
        assert fact.key == key and fact.type in {"int", "float", "str", "bool", "dict", "list"}
        assert fact.writer and fact.doc, key


def test_the_store_format_documents_the_registry():
    from memtrace import store

    assert "memtrace.facts" in (store.__doc__ or "")


def test_the_recorded_vllm_release_is_read_in_one_place():
    """``facts.vllm_release``: reconcile's formula, the what-if's default utilization and the history key's KV sizing
    read the same release."""
    from memtrace.analysis.capacity.reconcile import FORMULA_025, FORMULA_033, choose_formula

    for text, release, formula in (("0.34.0", (0, 34), FORMULA_033), ("0.25.1.dev4+g1a2b", (0, 25), FORMULA_025),
                                   ("", None, FORMULA_033), ("unknown", None, FORMULA_033)):  # fmt: skip
        assert F.vllm_release(text) == release and choose_formula({F.VLLM_VERSION: text}) == formula
