"""Memory present before recording began (``quantities.BEFORE_RECORDING``), stated by the report (text and
JSON), the issue bundle and the view, on real traces.

Begins mid-run: ``multi-device-oom.pickle``'s cuda:0, a public snapshot whose history was trimmed to its
last 800 of 6,445 entries (tests/data/snapshots/README.md), so its final segments hold memory no kept
event allocated; the same file's cuda:1 and ``stacks-all.pickle`` (whole files) begin with nothing held.
A vLLM start-up memtrace recorded on the H200 begins once vLLM's ``init_device`` returned: what that
allocated first is present before. ``python-stacks.pickle`` dumped without its segments (as converters
write it) has no allocator state: the figure is a lower bound, said so.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from memtrace.analysis.memory import quantities as Q
from memtrace.cli import main
from memtrace.importers.files import read_snapshot
from testdata import DATA, unpacked

SNAPS = DATA / "snapshots"
MULTI = SNAPS / "multi-device-oom.pickle"
WHOLE = SNAPS / "stacks-all.pickle"
PY = SNAPS / "python-stacks.pickle"
MOMENT = SNAPS / "state-only.pickle"
STARTUP = unpacked(DATA / "vllm-h200" / "startup")


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path.name} is not shipped")
    return path


def state_before_history(raw: dict, device: int) -> tuple[int, int]:
    """(reserved, allocated) before a snapshot's first kept entry, by hand: the final segments less every
    entry of the history (the independent replay of test_snapshot_table)."""
    segs = [s for s in raw["segments"] if s.get("device", 0) == device]
    reserved = sum(s["total_size"] for s in segs)
    held = sum(b.get("requested_size", b["size"]) for s in segs for b in s["blocks"] if b["state"].startswith("active"))
    sign = {"alloc": 1, "free_completed": -1}
    seg = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}
    history = raw["device_traces"][device]
    return (
        reserved - sum(e["size"] * seg.get(e["action"], 0) for e in history),
        held - sum(e["size"] * sign.get(e["action"], 0) for e in history),
    )


def report_json(capsys, path: Path) -> list[dict]:
    assert main(["report", "--json", "--allow-pickle", str(path)]) == 0
    return json.loads(capsys.readouterr().out)["traces"]


def report_text(capsys, path: Path) -> str:
    assert main(["report", "--allow-pickle", "--width", "200", str(path)]) == 0
    return capsys.readouterr().out


def test_a_snapshot_that_begins_mid_run_states_what_its_final_state_held_before_the_history(capsys):
    raw = read_snapshot(need(MULTI))
    reserved, allocated = state_before_history(raw, 0)
    assert (reserved, allocated) == (3_529_506_816, 2_684_467_204)  # 3.29 GiB / 2.50 GiB before the kept 800 entries
    by_label = {t["label"]: t for t in report_json(capsys, MULTI)}
    assert by_label["rank 0"]["before_recording"] == {
        "reserved_bytes": reserved,
        "allocated_bytes": allocated,
        "exact": True,
        "how": Q.FROM_STATE,
    }
    # cuda:1 began with nothing held: 0 B, exact, and the text says nothing
    assert by_label["rank 1"]["before_recording"] == {
        "reserved_bytes": 0,
        "allocated_bytes": 0,
        "exact": True,
        "how": Q.FROM_STATE,
    }
    text = report_text(capsys, MULTI)
    line = f"{Q.BEFORE_RECORDING.label}: {Q.RESERVED.label} 3.29 GiB, {Q.ALLOCATED.label} 2.50 GiB ({Q.FROM_STATE})"
    assert text.count(line) == 1  # rank 0 alone
    assert text.count(f"{Q.BEFORE_RECORDING.label}:") == 1


def test_a_history_recorded_from_its_start_says_nothing_was_there_before(capsys):
    (t,) = report_json(capsys, need(WHOLE))
    assert t["before_recording"] == {"reserved_bytes": 0, "allocated_bytes": 0, "exact": True, "how": Q.FROM_STATE}
    assert f"{Q.BEFORE_RECORDING.label}:" not in report_text(capsys, WHOLE)


def test_without_the_allocator_state_the_memory_before_is_a_lower_bound_and_said_so(capsys, tmp_path):
    raw = read_snapshot(need(PY))
    _, allocated = state_before_history(raw, 0)  # 7,497,963,528 B held before the kept 2,000 entries
    raw["segments"] = []  # derived: the same real history dumped without its segments
    bare = tmp_path / "no-segments.pickle"
    bare.write_bytes(pickle.dumps(raw, protocol=4))
    (t,) = report_json(capsys, bare)
    b = t["before_recording"]
    assert (b["exact"], b["how"]) == (False, Q.NO_STATE)
    assert 0 < b["allocated_bytes"] < allocated  # the least the events need: below what was really there
    # no segment event in this history: reserved is known from below only, at least what the tensors held
    assert b["reserved_bytes"] == b["allocated_bytes"]
    text = report_text(capsys, bare)
    assert f"{Q.BEFORE_RECORDING.label}: {Q.RESERVED.label} at least " in text
    assert f"({Q.NO_STATE})" in text


def test_a_snapshot_of_one_moment_recorded_nothing_so_nothing_came_before_it(capsys):
    (t,) = report_json(capsys, need(MOMENT))
    assert t["before_recording"] is None
    assert f"{Q.BEFORE_RECORDING.label}:" not in report_text(capsys, MOMENT)


def test_a_vllm_startup_states_what_init_device_allocated_before_recording_began(capsys, tmp_path):
    """memtrace starts recording when vLLM's init_device returns; the 34 MiB allocated by then are exact."""
    (t,) = report_json(capsys, STARTUP)
    assert t["before_recording"] == {
        "reserved_bytes": 35_651_584,
        "allocated_bytes": 33_923_632,
        "exact": True,
        "how": Q.FROM_STATE,
    }
    assert t["before_recording"]["reserved_bytes"] == t["baseline"]["reserved_bytes"]
    line = f"{Q.RESERVED.label} 0.03 GiB, {Q.ALLOCATED.label} 0.03 GiB ({Q.FROM_STATE})"
    assert f"{Q.BEFORE_RECORDING.label}: {line}" in report_text(capsys, STARTUP)
    # the issue bundle's first screen and the view say it in the same words
    assert main(["issue", str(STARTUP), "-o", str(tmp_path / "bundle")]) == 0
    first = (tmp_path / "bundle" / "issue.md").read_text().split("\n## ")[0]
    assert f"- **{Q.BEFORE_RECORDING.label.capitalize()}:** {line}." in first
    assert main(["view", str(STARTUP), "-o", str(tmp_path / "v.html")]) == 0
    html = (tmp_path / "v.html").read_text()
    assert json.dumps(f"{Q.BEFORE_RECORDING.label}: {line}")[1:-1] in html


def test_the_issue_bundle_of_a_run_that_began_with_nothing_held_says_nothing_of_it(tmp_path, capsys):
    assert main(["issue", "--allow-pickle", str(need(WHOLE)), "-o", str(tmp_path / "b")]) == 0
    capsys.readouterr()
    first = (tmp_path / "b" / "issue.md").read_text().split("\n## ")[0]
    assert Q.BEFORE_RECORDING.label.capitalize() not in first
