"""The store's writer side for samples (issue 10: all trace-file I/O through store.py; issue 11: the
other-processes series, format 1.1): the sidecar's second writer, whole-trace saving through public
methods, and old files loading with defaults."""

from __future__ import annotations

import re
from array import array
from pathlib import Path

import numpy as np
import pytest
from memtrace.model import FORMAT_VERSION, OTHERS_DTYPE, SAMPLE_DTYPE, Frame, Note
from memtrace.store import SampleAppender, TraceWriter, load_trace, save_trace
from testdata import real_traces

ROOT = Path(__file__).resolve().parents[2]


def test_the_sidecar_writer_and_the_traced_process_interleave_without_colliding(tmp_path):
    w = TraceWriter(tmp_path / "t.memtrace")
    side = SampleAppender(w.path)
    used = array("q", [10, 100, 11, 101])  # the sidecar's flat (time_us, value) pairs
    side.append_samples(used)
    w.append_samples(np.array([(12, 102)], dtype=SAMPLE_DTYPE))  # e.g. save_trace
    side.append_samples(array("q", [13, 103]))
    side.append_others(array("q", [10, 5 << 30, 20, 6 << 30]))
    side.add_note(Note(14, "warning", "NVML sample failed"))
    side.close()
    w.close()
    t = load_trace(w.path)
    assert t.samples.tolist() == [(10, 100), (11, 101), (12, 102), (13, 103)]
    assert t.others.dtype == OTHERS_DTYPE and t.others.tolist() == [(10, 5 << 30), (20, 6 << 30)]
    assert [n.text for n in t.notes] == ["NVML sample failed"]


def test_a_new_file_is_format_1_1_and_every_shipped_1_0_trace_loads_with_no_others():
    assert FORMAT_VERSION >= (1, 1)  # 1.2 added device_alloc_chunks (CUPTI)
    shipped = real_traces()
    assert shipped
    old = 0
    for path in shipped:
        t = load_trace(path)
        assert t.others.dtype == OTHERS_DTYPE, path
        if "others_method" not in (t.facts.get("sidecar") or {}):  # recorded before format 1.1
            old += 1
            assert len(t.others) == 0, path
    assert old >= 8


def test_save_trace_keeps_frame_and_stack_ids_through_public_methods(tmp_path):
    src = load_trace(real_traces()[0])
    back = load_trace(save_trace(src, tmp_path / "copy.memtrace"))
    assert back.frames == src.frames and back.stacks == src.stacks
    assert np.array_equal(back.events, src.events) and np.array_equal(back.samples, src.samples)


def test_put_interned_refuses_a_writer_that_already_interned(tmp_path):
    w = TraceWriter(tmp_path / "t.memtrace")
    w.intern_stack([("a.py", 1, "f")])
    with pytest.raises(ValueError):
        w.put_interned([Frame("b.py", 2, "g")], [(0,)])
    w.close()


def test_no_module_but_the_store_speaks_sql_to_a_trace_file():
    """SQLite is opened in store.py only (history_store.py keeps its own database of runs, not traces)."""
    sql = re.compile(r"\bsqlite3\b|\b(event_chunks|sample_chunks|other_chunks)\b|FROM meta\b")
    offenders = [
        str(p.relative_to(ROOT))
        for folder in ("tracer", "plugins")
        for p in (ROOT / folder).rglob("*.py")
        if p.name not in ("store.py", "history_store.py") and sql.search(p.read_text())
    ]
    assert offenders == []
