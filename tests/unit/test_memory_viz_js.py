"""The streamed memory-viz export read with the opcode table of PyTorch's MemoryViz.js (the browser
viewer's own unpickler, re-implemented in tests/unit/js/memory_viz_unpickle.js), under node when it
is installed: no opcode the viewer cannot read, and the same entries, OOM and device as Python reads."""

from __future__ import annotations

import json
import pickle
import shutil
import subprocess
from pathlib import Path

import pytest
from memtrace.importers.files import traces_from_snapshot_file
from memtrace.plots.memory_viz import export_memory_viz

TESTS = Path(__file__).resolve().parents[1]
JS = TESTS / "unit" / "js" / "memory_viz_unpickle.js"
SNAP = TESTS / "data" / "snapshots" / "multi-device-oom.pickle"


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_memory_viz_js_reads_the_streamed_export(tmp_path):
    if not SNAP.exists():
        pytest.skip("tests/data/snapshots is not shipped")
    trace = traces_from_snapshot_file(SNAP, device=1)[0]
    path = export_memory_viz(trace, tmp_path / "m.pickle")
    out = subprocess.run(["node", str(JS), str(path)], capture_output=True, text=True, check=True, timeout=120)
    got = json.loads(out.stdout)
    with open(path, "rb") as f:
        snap = pickle.load(f)
    entries = snap["device_traces"][1]
    assert got["keys"] == list(snap) and got["device"] == 1 and got["entries"] == len(entries) == 596
    assert got["oom"] == {"size": 5_308_694_528, "device_free": 95_682_560}
    net = sum(
        e["size"] if e["action"] == "alloc" else -e["size"]
        for e in entries
        if e["action"] in ("alloc", "free_completed")
    )
    assert got["net_alloc"] == net
