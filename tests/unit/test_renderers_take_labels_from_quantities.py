"""No renderer spells a quantity's label itself: every output takes it from ``analysis.quantities`` (issue 32).

Grep-level, like the one-peak test: every string literal of a renderer module (docstrings left out; an
f-string's literal parts included) is searched for the label of each quantity in ``quantities.QUANTITIES``.
A renderer that writes "PyTorch reserved" or "other processes" as its own text would say something else the
day the label changes; it must write ``Q.RESERVED.label`` (or ``Q.RESERVED.meaning``) instead.
"""

import ast
from pathlib import Path

import memtrace.plots
import pytest
from memtrace.analysis.memory import quantities as Q

PLOTS = Path(memtrace.plots.__file__).parent
RENDERERS = [p for p in sorted(PLOTS.glob("*.py")) if p.name not in ("__init__.py", "format_spec.py", "formats.py")]
LABELS = sorted({q.label for q in Q.QUANTITIES}, key=len, reverse=True)


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def hard_coded_labels(source: str) -> list[tuple[int, str]]:
    """(line, label) of every quantity label written in a string literal of ``source`` (docstrings aside)."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            found += [(node.lineno, label) for label in LABELS if label in node.value]
    return sorted(set(found))


def test_the_check_finds_a_label_in_a_literal_and_an_f_string_but_not_in_a_docstring():
    src = '"""PyTorch reserved, in a docstring."""\nA = "PyTorch reserved"\nB = f"{x} other processes"\n'
    assert hard_coded_labels(src) == [(2, "PyTorch reserved"), (3, "other processes")]


@pytest.mark.parametrize("path", RENDERERS, ids=lambda p: p.name)
def test_no_renderer_spells_a_quantitys_label_itself(path):
    assert hard_coded_labels(path.read_text()) == [], f"{path.name}: use analysis.quantities' label"
