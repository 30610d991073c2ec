"""The timeline's broken time axis and its phase names, on the real vLLM start-ups (issue 34, item 6).

Before: the 0.25.1 start-up's last 3.8 s (the KV cache, warm-up, CUDA-graph capture) were the last 2.7 % of a
139 s axis, its phase names hung on slanted leader lines, and the 0.34 timeline named neither
kv_cache_extend (where its 138.10 GiB device peak is), kv_cache_sizing_warmup nor capture_model.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from memtrace.analysis.analysed.run import analyse
from memtrace.plots.phase_lane import PhaseBar, place_labels
from memtrace.plots.timeline import render
from memtrace.plots.timeline_data import landmark_times_us, phases_at, prepare_rank
from memtrace.plots.timeline_scale import identity, quiet_stretches, time_scale
from memtrace.store import load_run
from testdata import unpacked
from vllm034_data import run_dir

DATA = Path(__file__).resolve().parents[1] / "data"


def _drawn(path: Path, tmp_path: Path):
    from memtrace.plots.timeline import render_timeline

    run = analyse(load_run(path).traces, path=str(path))
    ranks = [prepare_rank(r) for r in run.ranks]
    return ranks, render_timeline(ranks, tmp_path / "t.png", t0_us=run.origin.t0_us)


def test_the_busy_last_seconds_of_the_0251_start_up_get_a_quarter_of_the_axis(tmp_path):
    ranks, drawn = _drawn(unpacked(DATA / "vllm-h200" / "startup-stacks"), tmp_path)
    s = drawn.scale
    kv_init = next(p for p in ranks[0].phases if p.name == "kv_cache_init")
    start = (kv_init.start_us - drawn.t0_us) / 1e6
    assert start == pytest.approx(134.284, abs=1e-3)
    assert 1.0 - s.fraction(start) > 0.2  # 25 %; was 1 - 134.284 / 139.075 = 3.4 %
    # the squeezed stretches are inside profile_run, where memory stayed flat; together most of the run
    profile = next(p for p in ranks[0].phases if p.name == "profile_run")
    lo, hi = (profile.start_us - drawn.t0_us) / 1e6, (profile.end_us - drawn.t0_us) / 1e6
    assert drawn.breaks and all(lo < a < b < hi for a, b in drawn.breaks)
    assert sum(b - a for a, b in drawn.breaks) > 100
    assert "time axis squeezed: memory flat there" in drawn.legend


def test_a_squeezed_stretch_holds_no_landmark_and_no_phase_edge(tmp_path):
    ranks, drawn = _drawn(run_dir("moe-ext"), tmp_path)
    marks = [(t - drawn.t0_us) / 1e6 for t in landmark_times_us(ranks[0])]
    marks += [(t - drawn.t0_us) / 1e6 for p in ranks[0].phases for t in (p.start_us, p.end_us)]
    assert drawn.breaks
    for a, b in drawn.breaks:
        assert not any(a <= m <= b for m in marks)


def test_every_phase_a_peak_or_crossing_falls_in_is_named_in_full_on_the_034_timeline(tmp_path):
    ranks, drawn = _drawn(run_dir("moe-ext"), tmp_path)
    names = {lab.path.rsplit("/", 1)[-1]: lab.text.removeprefix("← ") for lab in drawn.ranks[0].phase_labels}
    must = phases_at(ranks[0], landmark_times_us(ranks[0]))
    assert "kv_cache_extend" in must  # the device-used peak, 138.10 GiB, is there
    for path in must:
        assert names[path.rsplit("/", 1)[-1]] == path.rsplit("/", 1)[-1]
    for name in ("kv_cache_extend", "kv_cache_sizing_warmup", "capture_model"):
        assert names[name] == name
    # at most three overflow rows above the lane (issue 41 item 8: six stacked high); a phase no landmark falls in
    # may stay unnamed when its row and those three are full
    assert max(lab.row for lab in drawn.ranks[0].phase_labels if lab.where == "above") < 3


def test_overflow_names_sit_at_their_bar_and_no_tick_runs_through_a_name(tmp_path):
    _, drawn = _drawn(run_dir("moe-ext"), tmp_path)
    r = drawn.ranks[0]
    above = [lab for lab in r.phase_labels if lab.where == "above"]
    assert above
    for lab in above:
        w = len(lab.text) * r.lane_char_px / r.lane_px_per_s
        gap = abs(
            lab.x_s - lab.anchor_s if lab.x_s >= lab.anchor_s else lab.x_s + w + 6 / r.lane_px_per_s - lab.anchor_s
        )
        assert gap * r.lane_px_per_s < 10  # the name starts (or ends) at its tick: no slanted leader
        for other in above:
            ow = (len(other.text) * r.lane_char_px + 6) / r.lane_px_per_s
            if other is not lab and other.x_s <= lab.anchor_s <= other.x_s + ow:
                assert other.row > lab.row  # a tick only rises through rows below its own name


def test_right_to_left_staircase_names_a_cluster_of_short_phases():
    bars = [PhaseBar(n, n, 0, 10.0 + i * 0.01, 10.0 + i * 0.01 + 0.005) for i, n in enumerate(("aaaa", "bbbb", "cccc"))]
    bars += [PhaseBar("long", "long", 0, 0.0, 9.9), PhaseBar("next", "next", 0, 10.03, 20.0)]
    labels = {lab.path: lab for lab in place_labels(bars, px_per_s=20, char_px=7, x_max=100)}
    assert {labels[n].where for n in ("aaaa", "bbbb", "cccc")} == {"above"}
    assert [labels[n].row for n in ("cccc", "bbbb", "aaaa")] == [0, 1, 2]


def test_without_a_long_flat_stretch_the_axis_is_not_broken():
    import numpy as np

    t = np.arange(0, 10_000_000, 100_000, dtype=np.int64)
    b = (t // 1000).astype(np.int64)  # a steady ramp: never flat
    quiet = quiet_stretches([(t, b)], [], 0, 10_000_000, flat_bytes=100, min_us=400_000)
    assert quiet == [] and time_scale(quiet, 0, 10_000_000) == identity(10.0)


def test_the_overlapping_gaps_of_two_served_ranks_are_squeezed_where_neither_recorded():
    """Two ranks' start-ups end 0.2 s apart and their windows begin 0.3 s apart: one gap, squeezed where the
    two overlap, and an axis that runs forward (squeezing each gap on its own folded the axis back)."""
    import numpy as np

    scale = time_scale([], 0, 3_620_000_000, [(9_400_000, 3_609_500_000), (9_600_000, 3_609_200_000)])
    assert scale.gaps == ((9.6, 3609.2),)
    assert np.all(np.diff(scale.knots_s) > 0) and np.all(np.diff(scale.knots_drawn) > 0)


def test_render_of_the_analysed_run_breaks_the_axis_the_same_way(tmp_path):
    run = analyse(load_run(unpacked(DATA / "vllm-h200" / "startup-stacks")).traces)
    render(run, tmp_path / "a.png")
    _, drawn = _drawn(unpacked(DATA / "vllm-h200" / "startup-stacks"), tmp_path)
    assert (tmp_path / "a.png").stat().st_size > 50_000 and drawn.breaks


def test_a_short_start_up_busy_throughout_keeps_its_linear_axis(tmp_path):
    """moe-noext (34 s, compile cache warm): its flat stretches (7 s, 6.6 s, 6.1 s) add to under half the run;
    squeezing them chopped the axis into eight pieces."""
    _, drawn = _drawn(run_dir("moe-noext"), tmp_path)
    assert drawn.breaks == () and drawn.scale.forward(17.0) == pytest.approx(17.0)


def test_each_bins_range_is_the_lowest_and_highest_the_curve_takes_in_it():
    """The time axis's flat-stretch finder reads each bin's range of a curve in time order at once (1M events:
    0.15 s -> 0.02 s); checked against a plain walk of the bins on a real start-up's reserved curve."""
    import numpy as np
    from memtrace.plots.timeline_scale import _bin_ranges

    (rank,) = analyse(load_run(run_dir("moe-noext")).traces).ranks
    c = rank.curves.reserved
    t, b = c.time_us, c.bytes
    edges = np.linspace(t[0] + 1_000, t[-1] - 1_000, 301)
    lo, hi = _bin_ranges(t, b, edges)
    for i in range(300):
        start = max(int(np.searchsorted(t, edges[i], side="right")) - 1, 0)
        inside = b[(t >= edges[i]) & (t < edges[i + 1] if i < 299 else t <= edges[i + 1])]
        assert lo[i] == min([b[start], *inside]) and hi[i] == max([b[start], *inside])
