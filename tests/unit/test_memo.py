"""The per-trace memo: one computation per trace, never a stale or leaked result."""

from __future__ import annotations

import gc

import pytest
from memtrace.analysis import memo
from memtrace.analysis.curves import all_curves
from memtrace.analysis.live import lifetimes
from memtrace.importers.torch_snapshot import trace_from_snapshot

MiB = 1 << 20
SEG = 0x7F00_0000_0000


def entry(t, action, addr, size):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t, "frames": []}


def make_trace():
    return trace_from_snapshot(
        {"segments": [], "device_traces": [[entry(10, "alloc", SEG, MiB), entry(20, "free_completed", SEG, MiB)]]}
    )


def test_computed_once_per_trace_and_shared_read_only():
    tr = make_trace()
    assert all_curves(tr) is all_curves(tr)
    assert lifetimes(tr) is lifetimes(tr)
    with pytest.raises(ValueError):
        all_curves(tr).allocated.bytes[0] = 1
    assert all_curves(make_trace()) is not all_curves(tr)  # an equal trace is another trace


def test_replaced_columns_are_computed_afresh_and_in_place_edits_refused():
    tr = make_trace()
    assert all_curves(tr).allocated.peak_bytes == MiB
    with pytest.raises(ValueError):
        tr.events["size"][0] = 2 * MiB  # would make the memo stale: refused
    ev = tr.events.copy()
    ev["size"] = 2 * MiB
    tr.events = ev
    assert all_curves(tr).allocated.peak_bytes == 2 * MiB
    assert lifetimes(tr).size.tolist() == [2 * MiB]


def test_a_collected_trace_leaves_nothing_behind():
    tr = make_trace()
    all_curves(tr)
    key = id(tr)
    assert key in memo._MEMO
    del tr
    gc.collect()
    assert key not in memo._MEMO
