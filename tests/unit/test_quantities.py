"""The memory vocabulary (issue 32): one definition per quantity, one home for the peak rule."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from memtrace.analysis.memory import quantities as Q
from memtrace.analysis.memory.curves import Curve
from testdata import unpacked

ROOT = Path(__file__).resolve().parents[2]
#: a peak found by hand: an argmax, or the maximum of a curve's bytes
_PEAK_RULE = re.compile(r"argmax|\bbytes(\[[^\]]*\])?\.max\(\)|np\.max\(")


def test_no_module_outside_quantities_finds_a_peak_itself():
    found = []
    for folder in ("tracer", "plots", "plugins"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name == "quantities.py" and path.parent.name == "memory":  # analysis/memory/quantities.py
                continue
            if path.name == "downsample.py":  # each pixel bucket's extremes for drawing, not a peak anyone reads
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if _PEAK_RULE.search(line.split("#", 1)[0]):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert found == []


def test_every_quantity_has_one_key_one_label_and_a_one_line_meaning():
    keys = [q.key for q in Q.QUANTITIES]
    labels = [q.label for q in Q.QUANTITIES]
    assert len(set(keys)) == len(keys) and len(set(labels)) == len(labels)
    assert all(q.meaning and "\n" not in q.meaning for q in Q.QUANTITIES)
    assert Q.ALLOCATED.label != Q.ALLOCATED_BLOCKS.label  # "PyTorch allocated" is two things: both named


def _curve(values, times=None) -> Curve:
    times = np.arange(len(values), dtype=np.int64) * 10 if times is None else np.asarray(times, np.int64)
    return Curve(times, np.asarray(values, dtype=np.int64))


def test_the_peak_is_the_first_maximum_and_an_empty_curve_has_none():
    c = _curve([0, 5, 9, 3, 9, 1])
    assert Q.peak(c) == Q.Point(2, 20, 9)
    assert Q.peak(_curve([])) == Q.Point(-1, 0, 0) and c.peak_index == 2 and c.peak_bytes == 9


def test_a_windows_peak_counts_the_value_in_force_at_its_start():
    c = _curve([4, 8, 2, 6])  # 4 from 0, 8 from 10, 2 from 20, 6 from 30
    assert Q.window_peak(c, 15, 35) == (8, 15)  # 8 in force at 15
    assert Q.window_peak(c, 20, 35) == (6, 30)
    assert Q.window_max(c, -5, 5) == 4  # before the first step the first value (the baseline) holds


def test_the_state_at_the_peak_is_the_fullest_moment_of_the_reserved_plateau():
    reserved = _curve([0, 10, 10, 10, 4])  # the segment arrives one event before the block that needed it
    allocated = _curve([0, 2, 9, 7, 3])
    assert Q.fullest_at_peak(allocated, reserved) == 2
    assert Q.window_fullest(allocated, 0, 40) == 2


def test_the_whole_device_peak_puts_other_processes_back():
    from memtrace.analysis.memory.curves import Baseline, Curves

    used = _curve([5, 7, 6], [0, 10, 20])
    others = _curve([90, 100], [5, 15])
    empty = _curve([])
    c = Curves(_curve([0]), _curve([0]), used, empty, Baseline(0, 0, True), others=others)
    assert Q.whole_device_peak(c) == 106  # 6 of ours at 20 while the neighbour held 100


def test_memory_present_before_recording_is_its_own_top_holder_in_report_and_flame(capsys, tmp_path):
    import json

    from memtrace.cli import main

    run = unpacked(ROOT / "tests" / "data" / "vllm-h200" / "startup")  # vLLM 0.25.1: 26 blocks older than the recording
    assert main(["report", str(run), "--json"]) == 0
    holders = json.loads(capsys.readouterr().out)["traces"][0]["holders"]
    before = [h for h in holders if h["before_recording"]]
    no_stack = [h for h in holders if h["frame"] is None and not h["before_recording"]]
    assert [(h["bytes"], h["count"]) for h in before] == [(33_923_632, 26)]
    assert [h["count"] for h in no_stack] == [132]
    assert main(["report", str(run)]) == 0
    text = capsys.readouterr().out
    assert "    0.03    0.0%      26       1  (present before recording began)" in text
    assert main(["flame", str(run), "-o", str(tmp_path / "f.folded")]) == 0
    folded = dict(line.rsplit(" ", 1) for line in (tmp_path / "f.folded").read_text().splitlines())
    assert int(folded["[present before recording began]"]) == before[0]["bytes"]
    assert sum(int(v) for k, v in folded.items() if k.startswith("[no stack recorded]")) == no_stack[0]["bytes"]


def test_a_program_that_is_not_vllm_is_reported_in_its_own_terms(capsys):
    from memtrace.cli import main

    snapshot = ROOT / "tests" / "data" / "snapshots" / "python-stacks.pickle"  # a training step, not vLLM
    assert main(["report", str(snapshot)]) == 0
    out = capsys.readouterr().out
    assert "vLLM's non-KV memory" not in out and "KV cache" not in out
    startup = ROOT / "tests" / "data" / "h200" / "startup-full"  # a vLLM-shaped start-up: vLLM's figures recorded
    assert main(["report", str(startup)]) == 0
    assert "non-KV" in capsys.readouterr().out


def _report_text(capsys, run) -> str:
    from memtrace.cli import main

    assert main(["report", str(run)]) == 0
    return " ".join(capsys.readouterr().out.split())  # unwrapped


def test_a_card_another_process_filled_is_said_to_be_full_not_98_gib_below_the_target(capsys):
    from vllm034_data import run_dir

    text = _report_text(capsys, run_dir("small-ext"))  # vLLM 0.34 beside a 96 GiB neighbour, target = the card
    assert "the peak device used by this process stays 98.29 GiB below it" in text
    assert (
        "with other processes' memory (up to 96.60 GiB) the card itself held up to 138.11 GiB, 1.69 GiB below it"
        in text
    )
    assert "the reserved peak stays 128.07 GiB below it" not in text  # the KV cache outside PyTorch counts
    assert "the peak held by this process" in text


def test_a_crossing_in_load_model_is_not_called_profiling_and_0_34_names_its_formula(capsys):
    from vllm034_data import run_dir

    text = _report_text(capsys, ROOT / "tests" / "data" / "vllm-h200" / "shared-gpu")
    assert "first crossed in load_model, before the KV cache was sized (at 3.56 s)" in text
    assert "while profiling" not in text
    text = _report_text(capsys, run_dir("moe-noext"))
    assert "(the formula of vLLM 0.32 and later, device memory from nvml)" in text and "vllm-0.33" not in text
