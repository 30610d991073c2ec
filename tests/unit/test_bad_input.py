"""Every bad input a user can hand to `memtrace report` / `memtrace import`: one line, exit 2, no
traceback, and the input file left exactly as it was."""

from __future__ import annotations

import hashlib
import os
import pickle
import sqlite3
from pathlib import Path

import pytest
from memtrace.cli import main
from memtrace.model import ACTION_CODE, Phase, Trace, empty_events
from memtrace.store import save_trace


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "-"


def good_trace(path: Path) -> Path:
    ev = empty_events(2000)
    ev["time_us"] = range(2000)
    ev["action"] = ACTION_CODE["segment_alloc"]
    ev["size"] = 1 << 20
    return save_trace(Trace(events=ev, phases=[Phase("load_model", 0, 1999)]), path)


def fails_cleanly(capsys, argv: list[str], path: Path, *expect: str) -> str:
    before = sha(path)
    code = main(argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if not ln.startswith("memtrace: warning:")]
    assert code == 2
    assert len(lines) == 1 and lines[0].startswith("memtrace: error: "), err
    assert "Traceback" not in err
    for word in expect:
        assert word in lines[0]
    assert sha(path) == before
    return lines[0]


def test_missing_path(capsys, tmp_path):
    p = tmp_path / "nope.memtrace"
    fails_cleanly(capsys, ["report", str(p)], p, "no such file", "pass a run directory")


def test_empty_file(capsys, tmp_path):
    p = tmp_path / "empty.memtrace"
    p.write_bytes(b"")
    fails_cleanly(capsys, ["report", str(p)], p, "is empty", "record the run again")


def test_empty_pickle(capsys, tmp_path):
    p = tmp_path / "empty.pickle"
    p.write_bytes(b"")
    fails_cleanly(capsys, ["report", str(p)], p, "is empty", "_dump_snapshot")


@pytest.mark.parametrize("damage", ["truncated", "garbled"])
def test_corrupt_sqlite(capsys, tmp_path, damage):
    p = good_trace(tmp_path / "t.memtrace")
    data = p.read_bytes()
    if damage == "truncated":
        p.write_bytes(data[: len(data) // 2])
    else:
        p.write_bytes(data[:100] + b"\xff" * 3996 + data[4096:])
    fails_cleanly(capsys, ["report", str(p)], p, "is corrupt", "record the run again")


def test_sqlite_file_that_is_not_a_memtrace_trace(capsys, tmp_path):
    p = tmp_path / "other.memtrace"
    db = sqlite3.connect(p)
    with db:
        db.execute("CREATE TABLE users(name TEXT)")
    db.close()
    fails_cleanly(capsys, ["report", str(p)], p, "not a memtrace trace")


def test_trace_from_a_future_major_version(capsys, tmp_path):
    p = good_trace(tmp_path / "t.memtrace")
    db = sqlite3.connect(p)
    with db:
        db.execute("UPDATE meta SET value='2.0' WHERE key='version'")
    db.close()
    fails_cleanly(capsys, ["report", str(p)], p, "format 2.0", "upgrade memtrace")


def test_pickle_that_is_not_a_snapshot(capsys, tmp_path):
    p = tmp_path / "list.pickle"
    p.write_bytes(pickle.dumps([1, 2, 3]))
    fails_cleanly(capsys, ["report", str(p)], p, "not a PyTorch memory snapshot", "_dump_snapshot")


class RunsCode:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_pickle_that_would_run_code_is_refused_without_running_it(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    p = tmp_path / "evil.pkl"
    p.write_bytes(pickle.dumps({"segments": [], "device_traces": [RunsCode()]}))
    fails_cleanly(capsys, ["report", str(p)], p, "not a readable PyTorch snapshot pickle", "system")
    assert not (tmp_path / "pwned").exists()


def test_truncated_pickle(capsys, tmp_path):
    p = tmp_path / "cut.pickle"
    p.write_bytes(pickle.dumps({"segments": [], "device_traces": [[{"action": "alloc"}] * 50]})[:40])
    fails_cleanly(capsys, ["report", str(p)], p, "not a readable PyTorch snapshot pickle")


def test_snapshot_with_no_events_is_one_moment_and_one_with_nothing_is_refused(capsys, tmp_path):
    p = tmp_path / "state.pickle"
    seg = {"address": 4096, "total_size": 2 << 20, "stream": 0, "blocks": []}
    p.write_bytes(pickle.dumps({"segments": [seg], "device_traces": [[]]}))
    assert main(["report", str(p)]) == 0
    out, err = capsys.readouterr()
    assert "one moment" in err and "reserved at least 2.00 MiB" in out  # its 2 MiB segment, no longer "0.00 GiB"
    p2 = tmp_path / "nothing.pickle"
    p2.write_bytes(pickle.dumps({"segments": [], "device_traces": []}))
    fails_cleanly(capsys, ["report", str(p2)], p2, "no allocator events", "_record_memory_history")


def test_pickle_without_the_pickle_suffix_needs_allow_pickle(capsys, tmp_path):
    p = tmp_path / "snapshot.bin"
    p.write_bytes(pickle.dumps({"segments": [], "device_traces": []}))
    fails_cleanly(capsys, ["report", str(p)], p, "not SQLite", "--allow-pickle")


def test_import_of_a_bad_snapshot_writes_nothing(capsys, tmp_path):
    p = tmp_path / "list.pickle"
    p.write_bytes(pickle.dumps("hello"))
    fails_cleanly(capsys, ["import", str(p), "-o", str(tmp_path / "out.memtrace")], p, "not a PyTorch memory snapshot")
    assert sorted(x.name for x in tmp_path.iterdir()) == ["list.pickle"]


def test_unknown_rank(capsys, tmp_path):
    p = good_trace(tmp_path / "t.memtrace")
    fails_cleanly(capsys, ["report", str(p), "--rank", "3"], p, "has no rank 3")


def test_bad_target_size(capsys, tmp_path):
    p = good_trace(tmp_path / "t.memtrace")
    fails_cleanly(capsys, ["report", str(p), "--target", "lots"], p, "cannot read size")
    fails_cleanly(capsys, ["report", str(p), "--util", "0.9"], p, "--total")
    fails_cleanly(capsys, ["report", str(p), "--total", "80GiB"], p, "--util")
