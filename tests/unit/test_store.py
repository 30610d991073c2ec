"""The SQLite store: round trips, crash-safety while writing, version handling, reading leaves no trace."""

from __future__ import annotations

import json
import sqlite3

import numpy as np
import pytest
from memtrace.errors import TraceFormatError
from memtrace.model import (
    ACTION_CODE,
    SAMPLE_DTYPE,
    Block,
    Frame,
    HookCall,
    Note,
    Phase,
    Process,
    Recording,
    Segment,
    Trace,
    empty_events,
)
from memtrace.store import TraceWriter, load_run, load_trace, save_trace

MiB = 1 << 20


def full_trace() -> Trace:
    ev = empty_events(3)
    ev[0] = (10, ACTION_CODE["segment_alloc"], 0x1000, 2 * MiB, 7, -1)
    ev[1] = (11, ACTION_CODE["alloc"], 0x1000, MiB + 1, 7, 1)
    ev[2] = (12, ACTION_CODE["oom"], 123456, 80 * MiB, 7, 0)
    return Trace(
        process=Process(pid=42, hostname="h", role="worker", rank=1, world_size=2, device_total_bytes=80 << 30),
        recording=Recording(start_us=9, end_us=20, max_entries=1000, drains=3, truncated=True, lost_events_min=5),
        events=ev,
        frames=[Frame("/a.py", 1, "f"), Frame("/b.py", 2, "g")],
        stacks=[(0,), (1, 0)],
        segments=[
            Segment(0x1000, 2 * MiB, 7, "large", "1,2", True, [Block(0x1000, 2 * MiB, MiB + 1, "active_allocated", 1)])
        ],
        phases=[Phase("outer", 9, 20, None, "vllm"), Phase("inner", 10, None, 0, "user")],
        samples=np.array([(9, 500 * MiB), (15, 510 * MiB)], dtype=SAMPLE_DTYPE),
        hook_calls=[HookCall("fi.alloc", 10, 11, {"n": 3, "dtype": "bf16"}, MiB, MiB + 1, 2 * MiB, None, None)],
        facts={"target_bytes": 123, "env": {"torch": "2.11"}},
        notes=[Note(10, "warning", "lost events")],
    )


def test_every_field_survives_a_save_and_load(tmp_path):
    t = full_trace()
    got = load_trace(save_trace(t, tmp_path / "t.memtrace"))
    assert got.process == t.process and got.recording == t.recording
    assert np.array_equal(got.events, t.events) and np.array_equal(got.samples, t.samples)
    assert (got.frames, got.stacks, got.segments) == (t.frames, t.stacks, t.segments)
    assert (got.phases, got.hook_calls, got.facts, got.notes) == (t.phases, t.hook_calls, t.facts, t.notes)
    assert got.path == str(tmp_path / "t.memtrace")


def test_events_appended_in_chunks_load_in_order_while_the_writer_is_still_open(tmp_path):
    w = TraceWriter(tmp_path / "live.memtrace")
    for start in range(0, 30, 10):
        ev = empty_events(10)
        ev["time_us"] = np.arange(start, start + 10)
        w.append_events(ev)
    try:
        got = load_trace(tmp_path / "live.memtrace")  # as after a SIGKILL: everything committed is there
        assert got.events["time_us"].tolist() == list(range(30))
    finally:
        w.close()


def test_reading_a_finished_trace_creates_no_files_beside_it(tmp_path):
    save_trace(full_trace(), tmp_path / "t.memtrace")
    before = sorted(p.name for p in tmp_path.iterdir())
    load_trace(tmp_path / "t.memtrace")
    assert sorted(p.name for p in tmp_path.iterdir()) == before == ["t.memtrace"]


def test_reading_one_document_of_a_shipped_trace_creates_no_files_beside_it(tmp_path):
    """A reader never writes beside the user's file: a recorded trace (WAL mode in its header) read for one
    document, as a watcher or the earlier-run check reads it."""
    import shutil

    from memtrace.store import read_document

    from tests.testdata import DATA

    shipped = DATA / "h200" / "startup-cap6g" / "vm-pid522.memtrace"
    copy = shutil.copy(shipped, tmp_path / shipped.name)
    assert read_document(copy, "recording")["end_us"] > 0
    assert read_document(copy, "process")["pid"] == 522
    assert sorted(p.name for p in tmp_path.iterdir()) == [shipped.name]


def test_a_path_with_uri_characters_loads(tmp_path):
    p = save_trace(full_trace(), tmp_path / "run #1 ?x%20.memtrace")
    assert load_trace(p).process.pid == 42


def test_writer_refuses_to_overwrite_without_force(tmp_path):
    save_trace(full_trace(), tmp_path / "t.memtrace")
    with pytest.raises(TraceFormatError, match="--force"):
        save_trace(full_trace(), tmp_path / "t.memtrace")
    save_trace(Trace(), tmp_path / "t.memtrace", overwrite=True)
    assert len(load_trace(tmp_path / "t.memtrace").events) == 0


def test_a_newer_minor_version_with_unknown_and_missing_fields_loads_with_defaults(tmp_path):
    p = save_trace(full_trace(), tmp_path / "t.memtrace")
    db = sqlite3.connect(p)
    with db:
        db.execute("UPDATE meta SET value='1.7' WHERE key='version'")
        db.execute("UPDATE meta SET value=? WHERE key='process'", (json.dumps({"pid": 5, "future_field": 1}),))
        db.execute("DELETE FROM meta WHERE key='recording'")
        db.execute("CREATE TABLE future_table(x)")
    db.close()
    got = load_trace(p)
    assert (got.process.pid, got.process.rank, got.recording.truncated) == (5, None, False)


def test_a_newer_major_version_is_refused_by_name(tmp_path):
    p = save_trace(full_trace(), tmp_path / "t.memtrace")
    db = sqlite3.connect(p)
    with db:
        db.execute("UPDATE meta SET value='2.0' WHERE key='version'")
    db.close()
    with pytest.raises(TraceFormatError, match="format 2.0, newer than the 1.x"):
        load_trace(p)


def test_a_run_directory_loads_every_trace_ordered_by_rank(tmp_path):
    for rank, pid in ((1, 10), (0, 20)):
        t = Trace(process=Process(pid=pid, rank=rank))
        save_trace(t, tmp_path / f"pid{pid}.memtrace")
    run = load_run(tmp_path)
    assert [t.process.rank for t in run.traces] == [0, 1]


def test_an_empty_run_directory_says_what_to_do(tmp_path):
    with pytest.raises(TraceFormatError, match="holds no .memtrace files"):
        load_run(tmp_path)
