"""The figures of tests/data/snapshots/README.md's table: memtrace's peaks equal an independent replay of
the raw pickle (plain Python over the dicts, no memtrace code), and import -> export -f memory-viz ->
import keeps every event column, the kept fields and the peaks byte for byte."""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import numpy as np
import pytest
from memtrace.analysis.memory.curves import all_curves
from memtrace.importers.files import read_snapshot, traces_from_snapshot_file
from memtrace.importers.snapshot import traces_from_snapshot
from memtrace.plots.memory_viz import write_snapshot
from references import snapshot_replay as replay

SNAPS = Path(__file__).resolve().parents[1] / "data" / "snapshots"

#: (file, device) -> (allocated peak, reserved peak), as the README's table states them.
TABLE = {
    ("multi-device-oom.pickle", 0): (8_456_473_388, 8_541_700_096),
    ("multi-device-oom.pickle", 1): (84_063_351_764, 84_202_749_952),
    ("multi-device-oom.pickle", 2): (21_564_645_800, 21_883_781_120),
    ("python-stacks.pickle", 0): (7_498_356_744, 14_180_941_824),
    ("stacks-all.pickle", 0): (3_249_143_816, 3_781_165_056),
    ("state-only.pickle", 0): (11_840_159_744, 11_844_714_496),
    ("torch20-no-time.pickle", 0): (20_802_383_104, 22_519_218_176),
}


@pytest.mark.parametrize("name", sorted({n for n, _ in TABLE}))
def test_peaks_equal_an_independent_replay_and_survive_the_memory_viz_round_trip(name):
    path = SNAPS / name
    if not path.exists():
        pytest.skip(f"{name} is not shipped")
    raw = read_snapshot(path)
    traces = traces_from_snapshot_file(path)
    assert sorted(t.process.device_index for t in traces) == sorted(d for n, d in TABLE if n == name)
    for t in traces:
        d = t.process.device_index
        curves = all_curves(t)
        peaks = (curves.allocated.peak_bytes, curves.reserved.peak_bytes)
        assert peaks == replay(raw, d) == TABLE[(name, d)]
        buf = io.BytesIO()
        write_snapshot(t, buf)
        (back,) = traces_from_snapshot(pickle.loads(buf.getvalue()), device=d)
        assert np.array_equal(back.events, t.events)
        assert back.facts.get("snapshot_fields") == t.facts.get("snapshot_fields")
        assert back.facts["import"]["state"] == t.facts["import"]["state"]
        b = all_curves(back)
        assert (b.allocated.peak_bytes, b.reserved.peak_bytes) == peaks
        assert np.array_equal(b.allocated.bytes, curves.allocated.bytes)
