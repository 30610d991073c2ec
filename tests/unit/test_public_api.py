"""``dir(memtrace)`` and type checkers see the public API, while ``import memtrace`` stays cheap (issue 34)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import memtrace

INIT = Path(memtrace.__file__)
PUBLIC = {"trace", "start", "stop", "phase", "load", "current_session"}


def test_dir_lists_the_public_api_in_a_fresh_process_without_loading_it():
    code = (
        "import json, sys, memtrace; names = dir(memtrace); "
        "print(json.dumps([names, [m for m in ('torch', 'numpy', 'matplotlib', 'vllm', 'memtrace.capture.api') "
        "if m in sys.modules]]))"
    )
    names, loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout)
    assert PUBLIC <= set(names) and "Any" not in names
    assert loaded == []


def test_every_public_name_resolves_and_type_checkers_import_the_same_objects():
    tree = ast.parse(INIT.read_text())
    checked: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            for imp in node.body:
                for alias in imp.names:
                    checked[alias.asname or alias.name] = f"{imp.module}:{alias.name}"
    assert set(checked) == PUBLIC == set(memtrace.__all__) - {"__version__"}
    for name, where in checked.items():
        module, attr = where.split(":")
        assert getattr(memtrace, name) is getattr(__import__(module, fromlist=[attr]), attr)
