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
