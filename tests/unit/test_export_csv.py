"""`memtrace export -f csv`: the curves, one row per change, replaying the analysed run's exact curves
(a real vLLM 0.25.1 start-up recorded on the H200)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
from memtrace import load
from memtrace.analysis.analysed.rank import TargetSpec
from memtrace.analysis.analysed.run import analyse
from memtrace.analysis.memory import quantities as Q
from memtrace.cli import main
from testdata import unpacked

RUN = unpacked(Path(__file__).resolve().parents[1] / "data" / "vllm-h200" / "startup-stacks")


def test_csv_rows_replay_every_curve_to_the_byte_and_sit_on_the_runs_origin(tmp_path, capsys):
    out = tmp_path / "curves.csv"
    assert main(["export", str(RUN), "-f", "csv", "-o", str(out)]) == 0
    assert capsys.readouterr().err.strip().endswith(f"wrote {out}")
    rows = list(csv.reader(out.open()))
    assert rows[0] == ["rank", "quantity", "time_us", "bytes"]
    run = analyse(load(RUN).traces, TargetSpec())
    rank = run.ranks[0]
    t0 = run.origin.t0_us
    for q in (Q.ALLOCATED, Q.RESERVED, Q.DEVICE_USED, Q.NON_TORCH):
        mine = [(int(r[2]), int(r[3])) for r in rows[1:] if r[1] == q.key]
        assert mine, q.key
        c = Q.curve(rank.curves, q)
        t = np.array([m[0] for m in mine]) + t0
        # a step function: the value in force at every recorded time equals the curve's own
        assert [c.at(int(x)) for x in t] == [m[1] for m in mine]
        assert max(m[1] for m in mine) == c.peak_bytes
    assert {r[1] for r in rows[1:]} <= {
        q.key for q in (Q.ALLOCATED, Q.RESERVED, Q.VMM, Q.HELD, Q.DEVICE_USED, Q.OTHERS, Q.NON_TORCH)
    }


def test_csv_default_name_and_suffix_come_from_the_format(tmp_path, capsys):
    run = tmp_path / "run"
    run.symlink_to(RUN, target_is_directory=True)
    assert main(["export", str(run), "-f", "csv", "-o", str(tmp_path / "x.json")]) == 2
    assert ".csv" in capsys.readouterr().err
