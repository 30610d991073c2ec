"""An allocator-state snapshot (one moment, no history) is said to be one moment in the main text of fits and
diff, and its peak is "at least" (a lower bound) in the report's text, JSON, issue bundle and view, in the
words of ``analysis.quantities``. Real files: tests/data/snapshots/state-only.pickle (one moment, 176
segments) and stacks-all.pickle (a history: exact, none of these words)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from memtrace.analysis.analysed.run import analyse
from memtrace.analysis.memory.quantities import AT_ONE_MOMENT, ONE_MOMENT, peak_bound
from memtrace.cli import main
from memtrace.importers.files import traces_from_snapshot_file
from memtrace.plots.issue_md import answer
from memtrace.plots.view_data import rank_meta

SNAPS = Path(__file__).resolve().parents[1] / "data" / "snapshots"
STATE = SNAPS / "state-only.pickle"
HISTORY = SNAPS / "stacks-all.pickle"


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path.name} is not shipped")
    return path


def _run(path: Path):
    return analyse(traces_from_snapshot_file(need(path)), path=str(path))


def test_the_report_peak_of_one_moment_is_at_least_in_text_and_json(capsys):
    assert main(["report", str(need(STATE))]) == 0
    out = capsys.readouterr().out
    assert "reserved at least 11.03 GiB at 0.00 s" in out
    assert "allocated peak at least 11.03 GiB" in out
    assert f"a lower bound: this trace is {ONE_MOMENT[:40]}" in " ".join(out.split())
    assert main(["report", "--json", str(STATE)]) == 0
    (doc,) = json.loads(capsys.readouterr().out)["traces"]
    assert doc["peak_bound"] == {"lower_bound": True, "why": ONE_MOMENT}
    assert doc["peak"]["reserved_bytes"] == 11_844_714_496


def test_a_history_peak_is_exact_and_says_no_bound(capsys):
    assert main(["report", str(need(HISTORY))]) == 0
    out = capsys.readouterr().out
    assert "at least" not in out and "a lower bound" not in out
    assert main(["report", "--json", str(HISTORY)]) == 0
    assert json.loads(capsys.readouterr().out)["traces"][0]["peak_bound"] == {"lower_bound": False, "why": ""}


def test_the_issue_bundle_and_the_view_say_at_least_for_one_moment():
    run = _run(STATE)
    peak = next(line for line in answer(run) if line.startswith("- **Peak"))
    assert "PyTorch reserved at least 11.03 GiB" in peak and "(a lower bound: one moment:" in peak
    assert rank_meta(run.ranks[0], run.origin.t0_us)["peak_bound"]["lower_bound"] is True
    exact = _run(HISTORY)
    assert "at least" not in next(line for line in answer(exact) if line.startswith("- **Peak"))
    assert rank_meta(exact.ranks[0], exact.origin.t0_us)["peak_bound"]["lower_bound"] is False


def test_fits_says_first_that_its_input_is_one_moment_and_answers_for_it(capsys):
    assert main(["fits", str(need(STATE)), "--capacity", "24GiB"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("The input is one moment: the allocator's state when the snapshot was taken")
    text = " ".join(" ".join(lines).split())
    assert "fits answers for that moment alone" in text
    assert "FITS at the snapshot's one moment: what was held then fits, 12.97 GiB to spare" in text
    assert "whole recording" not in text and "Smallest card that moment fits on" in text
    assert main(["fits", str(STATE), "--capacity", "8GiB", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["peak_bound"]["why"] == ONE_MOMENT


def test_fits_rows_of_one_moment_speak_of_that_moment_not_of_a_phase(capsys):
    assert main(["fits", str(need(STATE)), "--capacity", "8GiB,16GiB"]) == 1
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.lstrip().startswith(("8.00 GiB", "16.00 GiB"))]
    assert rows == [
        f"    8.00 GiB  OOM {AT_ONE_MOMENT}: what was held then is 3.03 GiB more than the card",
        f"   16.00 GiB  fits {AT_ONE_MOMENT}, 4.97 GiB to spare",
    ]
    assert "phase" not in out.split("fits answers for that moment alone")[1].replace("phases are not in it", "")
    assert "KV" not in out.split("not in it")[-1] and "--gpu-memory-utilization" not in out
    assert main(["fits", str(STATE), "--capacity", "8GiB"]) == 1
    out = capsys.readouterr().out
    assert f"DIES {AT_ONE_MOMENT}: what was held then, 11.03 GiB, is 3.03 GiB more than the card" in out
    assert main(["fits", str(STATE), "--capacity", "8GiB", "--json"]) == 1
    (row,) = json.loads(capsys.readouterr().out)["fits"]
    assert (row["verdict"], row["phase"], row["overshoot_bytes"]) == ("dies", "", 11_844_714_496 - (8 << 30))


def test_fits_of_a_history_has_no_moment_words(capsys):
    main(["fits", str(need(HISTORY)), "--capacity", "24GiB"])
    out = capsys.readouterr().out
    assert "one moment" not in out and "whole recording fits" in out


def test_diff_says_which_input_is_one_moment_before_any_figure(capsys):
    assert main(["diff", str(need(STATE)), str(STATE)]) == 0
    out = capsys.readouterr().out
    assert out.index("Both inputs are one moment") < out.index("peak reserved")
    assert "compares two states" in " ".join(out.split())
    main(["diff", str(need(HISTORY)), str(STATE)])
    out = " ".join(capsys.readouterr().out.split())
    assert "The new input is one moment" in out and "that moment's state with the other run's peak" in out
    main(["diff", str(HISTORY), str(STATE), "--json"])
    assert json.loads(capsys.readouterr().out)["traces"][0]["one_moment"] == "new"
    main(["diff", str(HISTORY), str(HISTORY)])
    assert "one moment" not in capsys.readouterr().out


def test_peak_bound_of_an_import_without_state_is_a_lower_bound_too():
    assert peak_bound({"import": {"state": "missing"}}).words == "at least "
    assert peak_bound({"import": {"state": "recorded"}}).lower_bound is False
    assert peak_bound({}).words == ""
