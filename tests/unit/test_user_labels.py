"""torch's user annotations on a real H200 snapshot (tests/data/snapshots/h200-torch214/history.pickle, torch
2.14: ``_set_memory_metadata("step=i")`` per step, ``record_function`` ranges with global_record_annotations):
each label is a landmark with its events counted as the raw pickle counts them, shown in the report and
the view; the ranges are phases."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from memtrace.analysis.analysed.run import analyse
from memtrace.analysis.memory.user_metadata import metadata_spans
from memtrace.cli import main
from memtrace.importers.files import read_snapshot, traces_from_snapshot_file
from memtrace.plots.view_data import rank_meta

H214 = Path(__file__).resolve().parents[1] / "data" / "snapshots" / "h200-torch214" / "history.pickle"


def _raw_labels():
    """An independent count from the pickle itself: per label, entries, allocs and bytes allocs asked."""
    entries = read_snapshot(H214)["device_traces"][0]
    count = Counter(e["user_metadata"] for e in entries if e.get("user_metadata"))
    allocs = Counter(e["user_metadata"] for e in entries if e.get("user_metadata") and e["action"] == "alloc")
    asked = Counter()
    for e in entries:
        if e.get("user_metadata") and e["action"] == "alloc":
            asked[e["user_metadata"]] += e["size"]
    return count, allocs, asked


@pytest.fixture(scope="module")
def device_trace():
    if not H214.exists():
        pytest.skip("h200-torch214/history.pickle is not shipped")
    return next(t for t in traces_from_snapshot_file(H214) if t.process.device_index == 0)


def test_each_label_is_counted_as_the_raw_pickle_counts_it(device_trace):
    count, allocs, asked = _raw_labels()
    spans = metadata_spans(device_trace)
    assert [s.value for s in spans] == ["step=0", "step=1", "step=2"]
    assert {s.value: s.events for s in spans} == dict(count) == {"step=0": 487, "step=1": 373, "step=2": 370}
    assert {s.value: s.allocs for s in spans} == dict(allocs)
    assert {s.value: s.alloc_bytes for s in spans} == dict(asked)
    assert spans[0].alloc_bytes == 579_527_244
    assert all(a.last_us < b.first_us for a, b in zip(spans, spans[1:], strict=False))  # one step after another


def test_the_report_and_the_view_show_the_labels(device_trace, capsys):
    assert main(["report", str(H214)]) == 0
    out = capsys.readouterr().out
    section = out[out.index("User labels (torch.cuda.memory._set_memory_metadata)") :]
    assert "step=0     0.00    0.50     487     231       0.54" in section
    assert "step_1" in out and "forward" in out  # the record_function ranges: phases
    run = analyse([device_trace], path=str(H214))
    names = [m["name"] for m in rank_meta(run.ranks[0], run.origin.t0_us)["landmarks"]]
    assert ["label step=0", "label step=1", "label step=2"] == [n for n in names if n.startswith("label ")]


def test_a_trace_without_labels_has_no_section(capsys):
    plain = H214.parents[1] / "stacks-all.pickle"
    assert main(["report", str(plain)]) == 0
    assert "User labels" not in capsys.readouterr().out
