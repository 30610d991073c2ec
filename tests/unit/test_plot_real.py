"""`memtrace plot` on the real H200 traces says what happened: the target the report uses, the OOM
the run died of (and nothing after it), the crossing's moment apart from the excursion's maximum,
the curve named the same whatever the target, titles from the trace's facts, names from the run.

Real data only: tests/data/h200/* (the example start-up on mimicked cards, tests/data/h200/README.md)
and tests/data/vllm-h200/startup (vLLM 0.25.1 on the H200). Expected figures were read off the
recorder's own outcome (outcomes.json, the OOM observer's record), not off memtrace's output.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from memtrace import facts as F
from memtrace.analysis.memory.target import resolve_target
from memtrace.cli import main
from memtrace.plots.timeline import crossing_text, oom_text, render_timeline
from memtrace.plots.timeline_data import prepare_rank
from memtrace.store import load_run
from testdata import analysed_rank, unpacked

DATA = Path(__file__).resolve().parents[1] / "data"
H200, VLLM = DATA / "h200", unpacked(DATA / "vllm-h200" / "startup")
GiB = 1024**3
OUTCOMES = json.loads((H200 / "outcomes.json").read_text())


def _trace(run: Path):
    return load_run(run).traces[0]


def _draw(run: Path, tmp_path: Path, **target):
    trace = _trace(run)
    return render_timeline([prepare_rank(analysed_rank(trace, **target))], tmp_path / "t.png")


def test_plot_util_is_a_share_of_the_card_the_run_stood_for(tmp_path, capsys):
    """Defect 3: --util 0.5 on the 16 GiB card is 8.00 GiB (was 8.00 in plot, 69.90 in report)."""
    run = H200 / "startup-cap16g"
    assert resolve_target(_trace(run), util=0.5).target_bytes == 8 * GiB
    assert main(["plot", str(run), "--util", "0.5", "-o", str(tmp_path / "t.png")]) == 0
    err = capsys.readouterr().err
    assert "crossed 8.00 GiB at" in err
    assert _draw(run, tmp_path, util=0.5).ranks[0].target_bytes == 8 * GiB


@pytest.mark.parametrize("name", ["startup-cap16g", "startup-cap6g", "startup-cap20.75g"])
def test_the_oom_is_marked_with_its_request_and_free_memory(name, tmp_path):
    outcome = OUTCOMES[name]
    trace = _trace(H200 / name)
    record = trace.facts[F.OOM]
    drawn = render_timeline([prepare_rank(analysed_rank(trace))], tmp_path / "t.png").ranks[0]
    assert outcome["outcome"] == "oom"
    assert drawn.oom is not None and drawn.oom.time_us == record["time_us"]
    assert drawn.oom.phase_path.split("/")[-1] == outcome["phase"].split("/")[-1]
    r = record["requested_bytes"]
    asked = f"{r / GiB:.2f} GiB" if r > GiB else f"{r / 2**20:.2f} MiB"  # torch: "Tried to allocate 1024.00 MiB"
    assert f"{r / 2**20:.2f} MiB" in outcome["error"]
    free = f"{record['device_free_bytes'] / GiB:.2f} GiB"
    assert f"requested {asked}" in drawn.oom.text and f"device free {free}" in drawn.oom.text  # oom_text's words
    assert f"of which {free} is free" in outcome["error"]  # torch's own message
    assert "OUT OF MEMORY" in drawn.annotation


def test_nothing_after_the_oom_is_claimed_on_the_6_gib_card(tmp_path):
    """Defect 4: cap6g read "over the target for 4.80 s (until the end)"; the OOM was at 0.68 s."""
    drawn = _draw(H200 / "startup-cap6g", tmp_path).ranks[0]
    c = drawn.crossing
    assert c.until == "oom" and c.time_us <= drawn.oom.time_us
    assert c.duration_us == drawn.oom.time_us - c.time_us < 1_000  # microseconds, not 4.80 s
    assert "until the OOM" in c.text and "until the end" not in c.text
    assert c.max_us <= drawn.oom.time_us


def test_a_run_without_oom_marks_none(tmp_path):
    drawn = _draw(H200 / "startup-full", tmp_path).ranks[0]
    assert drawn.oom is None and "OUT OF MEMORY" not in drawn.annotation


def test_the_vllm_crossing_states_its_moment_and_the_excursion_maximum_apart(tmp_path):
    """Defect 5: "129.26 GiB, 0.65 GiB over at 124.057 s" mixed the crossing with the maximum at 124.618 s."""
    d = _draw(VLLM, tmp_path)
    c = d.ranks[0].crossing
    assert c.curve == "device_used"
    assert round(c.time_s, 3) == 124.057 and c.phase_path == "kv_cache_init"
    assert round((c.max_us - d.t0_us) / 1e6, 3) == 124.618
    assert c.at_cross_bytes < c.max_bytes
    lines = c.text.splitlines()
    assert lines[0] == "NVML device used crossed the 128.62 GiB target"
    assert lines[1] == f"at 124.057 s in kv_cache_init: {c.at_cross_bytes / GiB:.2f} GiB"
    assert lines[2] == "highest 129.26 GiB (+0.65 GiB) at 124.618 s"
    assert lines[3] == "above it for 3.74 s, until the end of the recording"
    assert lines[4] == "PyTorch reserved stayed below it (highest 128.52 GiB)"


def test_another_target_never_switches_the_curve_named(tmp_path):
    """Defect 5: with --target 88GiB the report switched to the reserved curve; device used stays named,
    the exact reserved crossing is the second line."""
    c = _draw(VLLM, tmp_path, target_bytes=88 * GiB).ranks[0].crossing
    assert c.curve == "device_used"
    second = c.text.splitlines()[4]
    assert second.startswith("PyTorch reserved crossed at 124.05") and "(+40.52 GiB)" in second


def test_titles_come_from_the_traces_facts(tmp_path):
    assert _draw(VLLM, tmp_path).title == "GPU memory during start-up: Qwen3MoeForCausalLM, vLLM 0.25.1, NVIDIA H200"
    cap16 = _draw(H200 / "startup-cap16g", tmp_path).title
    assert cap16 == "GPU memory during start-up: record_startup.py, NVIDIA H200 as a 16 GiB card"


def test_plot_of_a_dot_path_is_named_after_the_run(tmp_path, monkeypatch, capsys):
    """Defect 10: `memtrace plot RUN/.` wrote "-timeline.png"."""
    run = tmp_path / "cap16"
    shutil.copytree(H200 / "startup-cap16g", run)
    monkeypatch.chdir(tmp_path)
    assert main(["plot", "cap16/."]) == 0
    assert (tmp_path / "cap16-timeline.png").exists() and not (tmp_path / "-timeline.png").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-o", "t.jpg"], "this format writes .png or .svg or .pdf files"),
        (["-o", "/missing/deep/t.png"], "folder /missing/deep does not exist"),
        (["--target", "0"], "is not a line a start-up can stay under"),
    ],
)
def test_plot_refusals_are_one_line_and_leave_the_trace_alone(argv, message, tmp_path, capsys):
    run = tmp_path / "cap6"
    shutil.copytree(H200 / "startup-cap6g", run)
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    assert main(["plot", str(run), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and err.count("\n") == 0
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before
    assert not Path("/missing").exists()


def test_plot_refuses_its_input_as_output_even_with_force(tmp_path, capsys):
    run = tmp_path / "cap6"
    shutil.copytree(H200 / "startup-cap6g", run)
    target = run / "vm-pid522.memtrace"
    before = target.read_bytes()
    assert main(["plot", str(target), "-o", str(run), "--force"]) == 2
    assert main(["plot", str(target), "-o", str(target / "x.png"), "--force"]) == 2  # inside the trace file
    assert "input" in capsys.readouterr().err
    assert target.read_bytes() == before
    # a picture inside the run folder is no part of the run (``cd RUN && memtrace plot .``)
    assert main(["plot", str(run), "-o", str(run / "x.png")]) == 0
    assert [p.name for p in run.glob("*.memtrace")] == [target.name]


def _runs_with_events() -> list[Path]:
    return [*sorted(p for p in H200.glob("startup-*") if p.is_dir()), VLLM]


@pytest.mark.parametrize("run", _runs_with_events(), ids=lambda p: p.name)
@pytest.mark.parametrize(
    "given", [{}, {"util": 0.5}, {"target_bytes": 88 * GiB}, {"util": 0.9, "total_bytes": 8 * GiB}]
)
def test_plot_and_report_state_the_same_target_crossing_and_oom(run, given):
    """One answer everywhere: the figures the timeline annotates are the report's, to the byte."""
    from references import summarize

    trace = _trace(run)
    target = resolve_target(trace, **given)
    rank = prepare_rank(analysed_rank(trace, **given))  # what render_timeline annotates, without drawing it
    c, oom = crossing_text(rank, rank.start_us), oom_text(rank, rank.start_us)
    s = summarize(trace, target)
    assert rank.target_bytes == s.target.target_bytes and rank.capacity_bytes == s.target.capacity_bytes
    assert (oom.time_us if oom else None) == (s.oom.time_us if s.oom else None)
    if not s.crossing_list:
        assert c is None
        return
    first = s.crossing_list[0]
    assert (c.curve, c.time_us, c.phase_path, c.max_bytes, c.max_us, c.overshoot_bytes, c.duration_us) == (
        first.curve,
        first.time_us,
        first.phase_path,
        first.max_bytes,
        first.max_us,
        first.overshoot_bytes,
        first.duration_us,
    )


def test_a_shared_gpu_draws_the_other_processes_as_their_own_band(tmp_path):
    """Issue 11 item 2. CONSTRUCTED from the real startup-full trace (as tests/unit/test_capture_shared_gpu.py
    builds it): 128 GiB held by another process, in NVML's device-wide samples and in the per-process series."""
    import dataclasses

    import numpy as np
    from memtrace.model import OTHERS_DTYPE

    real = _trace(H200 / "startup-full")
    shared = dataclasses.replace(real, samples=real.samples.copy(), facts=dict(real.facts))
    shared.samples["used_bytes"] += 128 * GiB
    t = np.arange(real.samples["time_us"][0], real.samples["time_us"][-1] + 1, 10_000, dtype=np.int64)
    shared.others = np.zeros(len(t), dtype=OTHERS_DTYPE)
    shared.others["time_us"], shared.others["others_bytes"] = t, 128 * GiB
    alone = render_timeline([prepare_rank(analysed_rank(real))], tmp_path / "a.png")
    both = render_timeline([prepare_rank(analysed_rank(shared))], tmp_path / "s.png")
    # 128 GiB of others beside 131 GiB of this process: their band runs above this process's own scale (issue 41)
    assert "other processes on the GPU (NVML), above the scale" in both.legend
    assert "NVML device used (this process)" in both.legend
    assert not any(x.startswith("other processes") for x in alone.legend)
    assert both.ranks[0].crossing == alone.ranks[0].crossing  # the others' memory is not this process's
    assert "init_device" not in both.ranks[0].crossing.phase_path
