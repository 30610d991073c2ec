"""The serving window in the outputs: the plot draws start-up, the gap as a gap, then the window with the OOM;
``flame --at oom`` shows what was live in the window at the OOM. On the fake serving trace (``serving_fakes``:
an H200 start-up's history replayed, an OOM an hour into serving)."""

from __future__ import annotations

import pytest
from memtrace.analysis.analysed.run import analyse
from memtrace.cli import main
from serving_fakes import GAP_S, REQUESTED_BYTES, write_fake_serving


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    path = tmp_path_factory.mktemp("fake-serving") / "fake.memtrace"
    with pytest.MonkeyPatch.context() as mp:
        return write_fake_serving(path, mp)


def test_the_window_analysed_alone_starts_from_the_exact_state_the_ring_carried(fake):
    rank = analyse([fake]).ranks[0]
    win = rank.serving
    assert win.trace.recording.start_us == fake.window.start_us
    assert int(win.curves.allocated.bytes[0]) == fake.window.start_state["allocated_bytes"]
    assert int(win.curves.reserved.bytes[0]) == fake.window.start_state["reserved_bytes"]
    assert int(win.curves.allocated.bytes[-1]) == rank.window.end_allocated_bytes
    assert win.oom.requested_bytes == REQUESTED_BYTES and win.oom.phase_path == "serving"


def test_the_plot_breaks_the_axis_at_the_gap_and_draws_the_window_after_it(fake, tmp_path):
    from memtrace.plots.timeline import render_timeline
    from memtrace.plots.timeline_data import prepare_rank

    rank = analyse([fake]).ranks[0]
    w = fake.window
    t0 = rank.span[0]
    drawn = render_timeline([prepare_rank(rank)], tmp_path / "serving.png", t0_us=t0)
    assert drawn.scale.gaps == (((w.startup_end_us - t0) / 1e6, (w.start_us - t0) / 1e6),)
    assert drawn.scale.gaps[0] in drawn.breaks and w.gap_us > (GAP_S - 1) * 1_000_000
    # the window (0.3 s after an hour) is drawn at least a fifth of the axis wide, not a sliver
    assert drawn.scale.fraction((w.end_us - t0) / 1e6) - drawn.scale.fraction((w.start_us - t0) / 1e6) > 0.2
    assert drawn.ranks[0].oom.time_us == fake.facts["oom"]["time_us"]
    assert "gap: not recorded (dropped from the serving ring)" in drawn.legend
    assert drawn.title.startswith("GPU memory during start-up and serving")


def test_the_plots_phase_lane_has_a_serving_bar_over_the_window_named_in_its_row(fake, tmp_path):
    from memtrace.plots.timeline import render_timeline
    from memtrace.plots.timeline_data import prepare_rank

    rank = analyse([fake]).ranks[0]
    drawn = render_timeline([prepare_rank(rank)], tmp_path / "serving.png", t0_us=rank.span[0])
    labels = {lab.path: lab for lab in drawn.ranks[0].phase_labels}
    assert set(labels) == {"load_model", "profile_run", "serving"}
    serving = labels["serving"]
    assert serving.where == "inside" and serving.depth == 0  # named inside its bar
    bar = prepare_rank(rank).lane_phases[-1]
    assert (bar.start_us, bar.end_us) == (fake.window.start_us, fake.window.end_us)  # the window, not the gap


def test_flame_at_oom_adds_up_to_what_the_window_held_at_the_oom(fake, tmp_path, capsys):
    out = tmp_path / "oom.folded"
    assert main(["flame", fake.path, "--at", "oom", "-o", str(out)]) == 0
    total = sum(int(line.rsplit(" ", 1)[1]) for line in out.read_text().splitlines())
    assert total == sum(s.requested_bytes for s in fake.window.segments)  # the allocator's own state at the OOM
    assert "2.88 GiB live at the OOM (3609.846 s)" in capsys.readouterr().err


def test_flame_at_a_time_in_the_gap_is_one_clear_error(fake, tmp_path, capsys):
    assert main(["flame", fake.path, "--at", "1000s", "-o", str(tmp_path / "gap.svg")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("memtrace: error: --at 1000s: the gap between start-up (9.427 s) and the serving window")
    assert len(err.splitlines()) == 1 and not (tmp_path / "gap.svg").exists()


def test_flame_at_a_time_in_the_window_reads_the_window(fake, tmp_path, capsys):
    assert main(["flame", fake.path, "--at", "3609.7", "-f", "folded", "-o", str(tmp_path / "w.folded")]) == 0
    assert "128.21 GiB live at 3609.700 s" in capsys.readouterr().err


def test_the_issue_bundle_states_the_window_first_and_draws_the_flame_at_the_oom(fake, tmp_path):
    from memtrace.analysis.memory import quantities as Q

    out = tmp_path / "bundle"
    assert main(["issue", fake.path, "-o", str(out)]) == 0
    md = (out / "issue.md").read_text()
    first_screen = "\n".join(md.splitlines()[:30])
    assert (
        "- **Failed allocation at 3609.85 s in serving:** requested 3.00 GiB (3,221,225,472 B), device free 1024.00 MiB"
    ) in first_screen
    assert "after a GAP of 3600.13 s that was not recorded (1,630 allocator events" in first_screen
    assert f"{Q.RESERVED_UNUSED.label} 125.41 GiB" in first_screen  # less the private pools' 604.00 MiB cached
    assert "examples/record_startup.py:114 forward +96.0 MiB (3)" in first_screen  # the window's growth by stack
    assert (
        "- **Step at the OOM:** the OOM happened during the scheduler step that began at 3609.85 s with 8 requests "
        "/ 5,489 tokens."
    ) in first_screen
    assert "## What held memory at the OOM, in the serving window" in md
    total = sum(int(line.rsplit(" ", 1)[1]) for line in (out / "flame.folded").read_text().splitlines())
    assert total == sum(s.requested_bytes for s in fake.window.segments)


def test_the_view_packs_the_window_as_its_own_part_after_a_gap_squeezed_as_the_plot_squeezes_it(fake, tmp_path):
    from memtrace.plots.serving_text import window_lines
    from memtrace.plots.timeline import render_timeline
    from memtrace.plots.timeline_data import prepare_rank
    from memtrace.plots.view_data import pack_rank, time_axis

    rank = analyse([fake]).ranks[0]
    t0, w = rank.origin.t0_us, fake.window
    packed = pack_rank(rank, t0)
    meta, win = packed.meta, packed.window.meta
    assert meta["serving"] == window_lines(rank.window, t0) and len(meta["serving"]) == 7
    assert meta["end_us"] == w.startup_end_us - t0  # start-up's part stops where start-up ended...
    assert (win["start_us"], win["end_us"]) == (w.start_us - t0, w.end_us - t0)  # ...the window's is its own
    assert win["n_events"] == len(w.events) and win["baseline"]["allocated"] == w.start_state["allocated_bytes"]
    assert win["gap"] == {
        "start_us": w.startup_end_us - t0,
        "end_us": w.start_us - t0,
        "events_dropped": 1630,
        "samples_dropped": 0,
        "steps_dropped": 0,
        "label": ["GAP 3600 s", "not recorded; dropped:", "1,630 events, 0 samples, 0 steps"],
        "edge": "#BBBBBB",
    }
    assert [p["name"] for p in win["phases"]] == ["serving"]
    assert "OOM" not in [lm["name"] for lm in meta["landmarks"]]  # the OOM is the window's landmark
    assert [lm["name"] for lm in win["landmarks"]] == ["serving peak", "OOM", "end serving"]
    # the page squeezes the gap as the plot does (which breaks no flat stretch here): the same knots
    axis = time_axis([packed])
    scale = render_timeline([prepare_rank(rank)], tmp_path / "t.png", t0_us=t0).scale
    assert axis["gaps_us"] == [[w.startup_end_us - t0, w.start_us - t0]]
    assert axis["knots_us"] == [round(k * 1e6) for k in scale.knots_s]
    assert axis["drawn_us"] == [round(k * 1e6) for k in scale.knots_drawn]


def test_report_states_memtraces_cost_while_serving_in_text_and_json(fake, capsys):
    import json

    assert main(["report", fake.path]) == 0
    text = capsys.readouterr().out
    assert "memtrace while serving: " in text and "since serving began" in text
    assert "the events held in PyTorch's own history ring (at most 3,000 entries" in text
    assert main(["report", "--json", fake.path]) == 0
    w = json.loads(capsys.readouterr().out)["traces"][0]["window"]
    assert w["cost"]["allocs"] == fake.window.cost["allocs"] and w["bounds"]["events_in"] == "torch"
    assert w["cost"]["span_us"] == fake.window.cost["until_us"] - fake.window.cost["since_us"]
    assert w["cost"]["total_ns"] == fake.window.cost["total_ns"]  # no calibration here: nothing of PyTorch's added
