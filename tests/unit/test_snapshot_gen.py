"""The benchmark's synthetic snapshot (tests/bench/snapshot_gen.py) has the object structure of real
``_dump_snapshot`` pickles: checked against the public snapshots in tests/data/snapshots."""

from __future__ import annotations

import collections
import io
import pickle
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "bench"))
import snapshot_gen  # noqa: E402

REAL = TESTS / "data" / "snapshots" / "python-stacks.pickle"  # recorded by PyTorch 2.x with Python stacks


def sharing(entries) -> collections.Counter:
    """Which actions share one frames list object (torch: a list per traceback, the free pair shares one)."""
    by_list = collections.defaultdict(list)
    for e in entries:
        by_list[id(e["frames"])].append(e["action"])
    return collections.Counter(tuple(v) for v in by_list.values())


@pytest.fixture(scope="module")
def synthetic():
    buf = io.BytesIO()
    n = snapshot_gen.write_snapshot(buf, 20_000)
    snap = pickle.loads(buf.getvalue())
    assert len(snap["device_traces"][0]) == n
    return snap


def test_the_synthetic_snapshot_has_torchs_keys_in_torchs_order(synthetic):
    if not REAL.exists():
        pytest.skip("tests/data/snapshots is not shipped")
    with open(REAL, "rb") as f:
        real = pickle.load(f)
    assert list(synthetic) == list(real)
    r = next(e for e in real["device_traces"][0] if e["frames"])
    s = synthetic["device_traces"][0][0]
    assert list(s) == list(r)  # action, addr, size, stream, time_us, compile_context, user_metadata, frames
    assert list(s["frames"][0]) == list(r["frames"][0])  # name, filename, line
    rs, ss = real["segments"][0], synthetic["segments"][0]
    assert set(ss) <= set(rs) and list(ss["blocks"][0]) == [k for k in rs["blocks"][0] if k in ss["blocks"][0]]


def test_the_synthetic_snapshot_shares_objects_as_torch_does(synthetic):
    entries = synthetic["device_traces"][0]
    patterns = sharing(entries)
    assert set(patterns) <= {("alloc",), ("free_requested", "free_completed"), ("segment_alloc", "alloc"),
                             ("segment_alloc",), ("segment_free",)}  # fmt: skip
    assert patterns[("free_requested", "free_completed")] > 0 and patterns[("segment_alloc", "alloc")] > 0
    if REAL.exists():
        with open(REAL, "rb") as f:
            real = sharing(pickle.load(f)["device_traces"][0])
        assert set(real) <= set(patterns) | {("segment_map", "alloc")}
    frame_dicts = {id(f) for e in entries for f in e["frames"]}
    frames_total = sum(len(e["frames"]) for e in entries)
    assert len(frame_dicts) < frames_total / 20  # frame dicts shared across the snapshot
    depths = {len(e["frames"]) for e in entries}
    assert min(depths) >= 12 and max(depths) <= 33


def test_memtrace_imports_the_synthetic_snapshot_exactly(synthetic):
    from memtrace.analysis.memory.curves import all_curves
    from memtrace.importers.snapshot import traces_from_snapshot

    (trace,) = traces_from_snapshot(synthetic)
    curves = all_curves(trace)
    assert curves.baseline.consistent and curves.baseline.reserved_bytes == 0  # the history adds up to the segments
    assert len(trace.stacks) <= snapshot_gen.N_STACKS and [p.name for p in trace.phases][0] == "init_device"
