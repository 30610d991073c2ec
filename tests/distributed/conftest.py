"""Tests over a real multi-node Ray cluster on this machine (marker ``ray``): the helpers here import by name."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
