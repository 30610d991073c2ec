"""memtrace view at scale: a page too big to carry its events packs only the NVML columns (the event
columns are not built), and the overview read through views equals the one read event by event.
On the real vLLM start-up recorded on an H200 (tests/data/vllm-h200/startup)."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
from memtrace import load
from memtrace.analysis.holders.view_window import RankQueries
from memtrace.plots import view_data
from memtrace.plots.view_data import pack_rank
from testdata import analysed_rank, unpacked

STARTUP = unpacked(Path(__file__).resolve().parents[1] / "data" / "vllm-h200" / "startup")


def _columns(packed) -> dict[str, bytes]:
    raw = gzip.decompress(packed.blob)
    return {
        c["name"]: raw[c["offset"] : c["offset"] + c["length"] * np.dtype(c["dtype"]).itemsize] for c in packed.columns
    }


def test_a_page_without_events_packs_the_nvml_columns_alone_and_builds_no_event_column(monkeypatch):
    trace = load(STARTUP).traces[0]
    a = analysed_rank(trace)
    t0 = a.origin.t0_us
    full = _columns(pack_rank(a, t0))
    built = []
    at_allocs = view_data._at_allocs
    monkeypatch.setattr(view_data, "_at_allocs", lambda *args: built.append(1) or at_allocs(*args))
    bare = _columns(pack_rank(a, t0, with_events=False))
    assert list(bare) == ["dev_t", "dev_used", "dev_nontorch"] and not built
    assert all(bare[k] == full[k] for k in bare) and len(bare["dev_t"]) > 0
    assert set(full) == {
        name for name, _ in (*view_data.EVENT_COLUMNS, *view_data.PRE_COLUMNS, *view_data.DEVICE_COLUMNS)
    }


def test_the_envelope_of_the_whole_run_keeps_each_pixels_fullest_and_emptiest_moment():
    trace = load(STARTUP).traces[0]
    a = analysed_rank(trace)
    q = RankQueries(a, a.origin.t0_us)
    x0, x1 = q.t[0] / 1e6, q.t[-1] / 1e6
    w = q.window(x0, x1, 40)
    i0 = q.event_at(q.t[0] * 1.0)  # the window holds the events after i0 (several share the first time)
    assert not w["exact"] and w["events"] == len(trace.events) - i0 - 1 > 10_000
    total = np.array(w["data"][1][1:-1])  # the top of the stack: every category, i.e. allocated
    alloc = a.curves.allocated.bytes[i0 + 2 :]  # after each event of the window
    assert total.max() == alloc.max() and total.min() == alloc.min()
    assert set(total.tolist()) <= set(alloc.tolist())  # every point is a moment the curve held
