"""A torch 1.9-era profiler trace (``Bytes`` alone: no ``Addr``, no totals) says what it cannot tell (who held
what) and shows only what it can (issue 41, item 3). The file: pytorch/kineto's
``tb_plugin/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz`` (BSD), cut down to what
memtrace reads by ``tests/data/snapshots/recipes/cut_kineto_trace.py`` (its report is the same as the whole
file's)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
from memtrace.analysis.memory import quantities as Q
from memtrace.cli import main
from memtrace.importers.kineto import traces_from_kineto_file
from memtrace.model import ROLE_SIZES_ONLY

from tests.testdata import analysed_rank

FILE = Path(__file__).resolve().parents[1] / "data" / "snapshots" / "kineto-1.9-sizes-only.pt.trace.json.gz"


def _cuda():
    return next(t for t in traces_from_kineto_file(FILE) if t.process.role != "host")


def test_the_peak_is_the_running_sum_of_the_sizes_and_nothing_reserved_is_claimed():
    with gzip.open(FILE, "rt") as f:
        mem = [e for e in json.load(f)["traceEvents"] if e.get("name") == "[memory]"]
    sizes = [e["args"]["Bytes"] for e in mem if e["args"]["Device Type"] == 1]
    assert not any("Addr" in e["args"] or "Total Reserved" in e["args"] for e in mem)
    t = _cuda()
    assert t.process.role == ROLE_SIZES_ONLY and not Q.holds_reserved(t.process)
    assert "addresses" not in t.facts["import"]  # the role is the one record of it: no fact that could disagree
    rank = analysed_rank(t)
    assert int(np.max(np.cumsum(sizes))) == rank.peak_allocated.bytes == 2_791_636_480
    assert rank.peak.state_us == rank.peak_allocated.time_us  # the moment shown is the allocated peak


def test_the_report_says_who_held_what_is_not_in_it_and_shows_no_holders(capsys):
    assert main(["report", str(FILE)]) == 0
    out = capsys.readouterr().out
    assert out.count("this trace cannot tell who held what") == 2  # the device's and the CPU's
    assert "Top holders" not in out and "present before recording began" not in out
    assert "do not add up to the final allocator state" not in out  # nothing is missing: it was never there
    assert "allocated peak 2.60 GiB at 0.12 s" in out and "reserved 0.00 GiB" not in out


def test_flame_refuses_in_one_line(tmp_path, capsys):
    out = tmp_path / "f.svg"
    assert main(["flame", str(FILE), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot tell who held what" in err and not out.exists()


def test_the_issue_bundle_has_the_timeline_and_says_why_it_has_no_flame_graph(tmp_path):
    out = tmp_path / "issue"
    assert main(["issue", str(FILE), "-o", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["issue.md", "timeline.png"]
    md = (out / "issue.md").read_text()
    assert "_No flame graph: rank 0's file cannot tell who held what (sizes without addresses)._" in md
    assert "flame.svg" not in md
