"""Shared test set-up: the synthetic-trace builders in this folder import by name.

pytest runs with --import-mode=importlib (so `import plugins` from the repo root never works by
accident); this puts only tests/ itself on the path, for `synthetic_startup`, `synthetic_gates`
and `testdata`.
"""

import sys
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _no_slow_machine_progress_lines(monkeypatch):
    """The plain progress fallback prints "memtrace: Loading ...: done in 2.0 s" to stderr when a task took over
    2 s: on a loaded 2-core machine that adds a line to tests that read stderr's one line of error. Tests run
    without it; tests/unit/test_progress.py sets its own threshold."""
    from memtrace import progress

    monkeypatch.setattr(progress, "PLAIN_AFTER_S", float("inf"))
