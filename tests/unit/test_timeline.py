"""The timeline marks the first crossing at the right time and phase, keeps every peak when it
thins a curve, lays phase labels out without overlaps, draws one panel per rank, and `memtrace plot`
refuses bad input with one line and exit 2.

SYNTHETIC data from tests/synthetic_startup.py; real H200 traces under tests/data when present.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import struct
from pathlib import Path

import numpy as np
import pytest
import synthetic_startup
from memtrace import facts as F
from memtrace.analysis.memory.curves import all_curves
from memtrace.analysis.memory.phases import phase_stats
from memtrace.cli import main
from memtrace.model import Trace
from memtrace.plots.downsample import bucket_indices
from memtrace.plots.phase_lane import PhaseBar, place_labels
from memtrace.plots.timeline import render_timeline
from memtrace.plots.timeline_data import prepare_rank
from memtrace.store import save_trace
from testdata import analysed_rank, data_name, unpacked
from testdata import real_traces as _real_traces

TESTS = Path(__file__).resolve().parents[1]
GiB, MiB = 1024**3, 1024**2


def _synthetic():
    return synthetic_startup


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


@pytest.fixture(scope="module")
def startup():
    return _synthetic().synthetic_startup()


@pytest.fixture(scope="module")
def drawn(startup, tmp_path_factory):
    out = tmp_path_factory.mktemp("timeline") / "t.png"
    return render_timeline([prepare_rank(analysed_rank(startup))], out, capacities=[32 * GiB])


def test_crossing_is_annotated_at_its_time_phase_peak_and_overshoot(drawn):
    c = drawn.ranks[0].crossing
    assert c.curve == "device_used"  # sampled: what the card sees is named first
    assert c.time_s == pytest.approx(18.0)
    assert c.phase_path == "determine_available_memory/profile_run"
    target = int(48 * GiB * 0.92)
    assert c.overshoot_bytes == c.max_bytes - target
    assert c.duration_us == 35_000 and c.until == "dropped"
    reserved = 24 * GiB + 4 * GiB + 14 * GiB + 2560 * MiB + 20 * MiB  # + 40 cached 64 MiB segments
    assert c.text.splitlines() == [
        "NVML device used crossed the 44.16 GiB target",
        "at 18.000 s in determine_available_memory/profile_run: 45.35 GiB",
        "highest 45.35 GiB (+1.19 GiB) at 18.000 s",
        "above it for 35 ms (the first of 2 excursions)",
        f"PyTorch reserved crossed at 18.000 s, highest 44.52 GiB (+{(reserved - target) / GiB:.2f} GiB)",
    ]


def test_a_crossing_of_milliseconds_gets_a_zoom_window_of_milliseconds(drawn):
    c = drawn.ranks[0].crossing
    lo, hi = drawn.ranks[0].zoom_us
    assert lo < c.time_us < c.time_us + c.duration_us < hi
    assert hi - lo < 200_000  # the main axis spans ~60 s; the zoom about 0.14 s


def test_the_target_defaults_to_the_recorded_one(drawn):
    assert drawn.ranks[0].target_bytes == int(48 * GiB * 0.92)
    assert drawn.ranks[0].capacity_bytes == 48 * GiB


def test_the_png_is_issue_sized(drawn):
    width, height = _png_size(drawn.path)
    assert 1200 <= width <= 1600 and 500 <= height <= 900


def test_every_phase_gets_a_label_and_no_two_labels_of_a_row_overlap(drawn, startup):
    labels = drawn.ranks[0].phase_labels
    assert {lab.path for lab in labels} == {p.path for p in phase_stats(startup, all_curves(startup))}
    _assert_no_overlap(labels, drawn.ranks[0].lane_px_per_s, drawn.ranks[0].lane_char_px)


def _assert_no_overlap(labels, px_per_s, char_px):
    rows: dict[object, list[tuple[float, float]]] = {}
    for lab in labels:
        w = len(lab.text) * char_px / px_per_s
        lo = lab.x_s - w / 2 if lab.inside else lab.x_s
        rows.setdefault(("above", lab.row) if lab.where == "above" else lab.depth, []).append((lo, lo + w))
    for spans in rows.values():
        spans.sort()
        for (_, a_hi), (b_lo, _) in zip(spans, spans[1:], strict=False):
            assert a_hi <= b_lo + 1e-9


def test_labels_that_do_not_fit_go_right_then_above():
    bars = [
        PhaseBar("load_model", "load_model", 0, 0.0, 10.0),
        PhaseBar("init_device", "init_device", 0, 10.0, 10.5),
        PhaseBar("compile_or_warm_up_model", "compile_or_warm_up_model", 0, 10.5, 12.0),
    ]
    labels = {lab.path: lab for lab in place_labels(bars, px_per_s=20, char_px=7)}
    assert labels["load_model"].where == "inside" and labels["load_model"].text == "load_model"
    assert labels["init_device"].where == "above"  # no room inside, the next bar is right beside it
    assert labels["compile_or_warm_up_model"].text == "← compile_or_warm_up_model"  # empty space to its right


def test_thinning_keeps_the_maximum_and_minimum_of_a_million_steps():
    rng = np.random.default_rng(1)
    t = np.cumsum(rng.integers(1, 100, 1_000_000)).astype(np.int64)
    v = rng.integers(0, 10**9, 1_000_000).astype(np.int64)
    v[777_777] = 5 * 10**9
    v[123_456] = -1
    keep = bucket_indices(t, v, int(t[0]), int(t[-1]), 2000)
    tt, vv = t[keep], v[keep]
    assert len(tt) <= 4 * 2000 and vv.max() == 5 * 10**9 and vv.min() == -1
    assert np.all(np.diff(tt) >= 0)


def test_short_curves_are_not_thinned():
    t = np.arange(10, dtype=np.int64)
    assert bucket_indices(t, t, 0, 9, 100).tolist() == list(range(10))


def test_no_crossing_when_the_target_is_above_everything(startup, tmp_path):
    d = render_timeline([prepare_rank(analysed_rank(startup, target_bytes=100 * GiB))], tmp_path / "t.png")
    assert d.ranks[0].crossing is None and d.ranks[0].annotation_corner == ""
    lo, hi = d.ranks[0].zoom_us
    assert lo <= _synthetic().T0 + 18_000_000 <= hi  # zoomed on the reserved peak instead


def test_two_ranks_share_one_time_axis(startup, tmp_path):
    later = dataclasses.replace(startup, process=dataclasses.replace(startup.process, rank=1))
    d = render_timeline([prepare_rank(analysed_rank(startup)), prepare_rank(analysed_rank(later))], tmp_path / "t.svg")
    assert [r.label for r in d.ranks] == ["rank 0", "rank 1"]
    assert d.t0_us == _synthetic().T0
    assert (tmp_path / "t.svg").read_text().lstrip().startswith("<?xml")


@pytest.fixture()
def run_dir(tmp_path, startup):
    save_trace(startup, tmp_path / "synth" / "rank0.memtrace")
    return tmp_path / "synth"


def test_plot_cli_default_name_no_overwrite_then_force(run_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["plot", str(run_dir)]) == 0
    err = capsys.readouterr().err
    assert "crossed 44.16 GiB at 18.000 s in determine_available_memory/profile_run" in err
    assert (tmp_path / "synth-timeline.png").exists()
    assert main(["plot", str(run_dir)]) == 2
    assert "exists; pass --force" in capsys.readouterr().err
    assert main(["plot", str(run_dir), "--force", "--util", "0.8", "--capacity", "16GiB,32GiB"]) == 0
    assert "crossed 38.40 GiB" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rank", "5"], "has no rank 5"),
        (["--target", "lots"], "cannot read size"),
        (["--capacity", "16GiB,x"], "cannot read size"),
        (["-o", "t.jpg"], "this format writes .png or .svg or .pdf files"),
        (["-o", "missing/deep/t.png"], "folder missing/deep does not exist"),
    ],
)
def test_plot_cli_bad_input_is_one_line_exit_2(run_dir, tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    assert main(["plot", str(run_dir), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and err.count("\n") == 0


def test_plot_cli_on_a_run_without_events_is_exit_2(tmp_path, capsys):
    save_trace(Trace(), tmp_path / "empty.memtrace")
    assert main(["plot", str(tmp_path / "empty.memtrace"), "-o", str(tmp_path / "e.png")]) == 2
    assert "no allocator events" in capsys.readouterr().err
    assert not (tmp_path / "e.png").exists()


@pytest.mark.parametrize("path", _real_traces(), ids=data_name)
def test_real_trace_crossing_annotation_is_the_shared_definition(path, tmp_path):
    from memtrace.analysis.memory.crossing import crossings
    from memtrace.analysis.memory.curves import all_curves
    from memtrace.analysis.memory.oom import find_oom
    from memtrace.analysis.memory.target import resolve_target
    from memtrace.store import load_trace

    trace = load_trace(path)
    if not len(trace.events):
        pytest.skip("no allocator events (CPU-only worker)")
    d = render_timeline([prepare_rank(analysed_rank(trace))], tmp_path / "t.png")
    oom = find_oom(trace)
    cr = crossings(trace, all_curves(trace), resolve_target(trace).target_bytes, oom_us=oom.time_us if oom else None)
    c = d.ranks[0].crossing
    if cr is None or cr.first is None:
        assert c is None
        return
    first = cr.first
    assert (c.curve, c.time_us, c.phase_path, c.max_bytes, c.max_us, c.overshoot_bytes) == (
        first.curve,
        first.time_us,
        first.phase_path,
        first.max_bytes,
        first.max_us,
        first.overshoot_bytes,
    )
    assert c.curve == ("device_used" if len(trace.samples) and cr.device_used else "reserved")
    lo, hi = d.ranks[0].zoom_us
    assert lo <= c.time_us <= hi
    _assert_no_overlap(d.ranks[0].phase_labels, d.ranks[0].lane_px_per_s, d.ranks[0].lane_char_px)


def test_render_figures_example_writes_timeline_flame_and_folded(run_dir, tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("render_figures", TESTS.parent / "examples" / "render_figures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main([str(run_dir), "--out", str(tmp_path / "docs")]) == 0
    out = capsys.readouterr().out
    assert "crossing at 18.000 s in determine_available_memory/profile_run" in out
    assert "24.00 GiB  create_weights" in out
    assert {p.name for p in (tmp_path / "docs").iterdir()} == {"timeline.png", "flame.svg", "flame.folded"}
    with pytest.raises(SystemExit):  # never overwrites without --force
        mod.main([str(run_dir), "--out", str(tmp_path / "docs")])


def _h200_runs() -> list[Path]:
    return sorted((TESTS / "data" / "h200").glob("startup-*"))


@pytest.mark.parametrize("run", _h200_runs(), ids=lambda p: p.name)
def test_real_h200_crossing_is_in_the_phase_the_run_died_in_and_not_after_the_oom(run, tmp_path):
    """Independent check: the recorder's own outcome (facts["died_in"], the OOM observer's time)."""
    from memtrace.store import load_run

    trace = load_run(run).traces[0]
    drawn = render_timeline([prepare_rank(analysed_rank(trace))], tmp_path / "t.png")
    c = drawn.ranks[0].crossing
    assert c is not None  # every recorded start-up went over its 0.92 target at some point
    died = trace.facts.get(F.DIED_IN)
    if died:
        assert c.phase_path.split("/")[-1] == died.split("/")[-1]
        assert c.time_us <= trace.facts[F.OOM]["time_us"]
    capacity = trace.facts[F.CAPACITY_BYTES]
    assert drawn.ranks[0].capacity_bytes == capacity
    assert drawn.ranks[0].target_bytes == trace.facts[F.TARGET_BYTES]


def test_plot_cli_skips_processes_without_events_and_says_so(run_dir, tmp_path, capsys):
    save_trace(Trace(process=dataclasses.replace(Trace().process, pid=99, rank=1)), run_dir / "rank1.memtrace")
    assert main(["plot", str(run_dir), "-o", str(tmp_path / "t.png")]) == 0
    assert "skipping rank 1: no allocator events" in capsys.readouterr().err
    assert main(["plot", str(run_dir), "--rank", "1", "-o", str(tmp_path / "u.png")]) == 2
    assert "rank 1 recorded no allocator events" in capsys.readouterr().err


def test_overflow_labels_never_end_past_the_figure_edge():
    from memtrace.plots.phase_lane import PhaseBar, place_labels

    # three narrow bars at the right end of the axis: their names only fit in the overflow row
    bars = [
        PhaseBar(f"p{i}", name, 0, 99.0 + 0.2 * i, 99.1 + 0.2 * i)
        for i, name in enumerate(["alpha_phase", "beta_phase", "gamma_phase"])
    ]
    labels = place_labels(bars, px_per_s=10.0, char_px=7.0, x_min=0.0, x_max=105.0)
    for lab in labels:
        assert lab.x_s + len(lab.text) * 7.0 / 10.0 <= 105.0
    assert [lab.text for lab in labels if lab.where == "above"]  # at least one still placed, at the edge


def _crosses(p: tuple, q: tuple) -> bool:
    """Whether two segments ((x, y), (x, y)) cross (touching ends do not count)."""

    def side(a, b, c) -> float:
        return (b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0])

    (a, b), (c, d) = p, q
    return side(a, b, c) * side(a, b, d) < 0 and side(c, d, a) * side(c, d, b) < 0


@pytest.mark.parametrize("run", ["vllm-h200/startup", "h200/startup-full", "h200/startup-cap16g"])
def test_the_phase_strip_shows_recorded_names_and_leader_lines_never_cross(run, tmp_path):
    """Issue 21: labels were made-up short forms ("kwarmup", "warm-up") and overflow leaders crossed."""
    from memtrace.store import load_run

    trace = load_run(unpacked(TESTS / "data" / run)).traces[0]
    drawn = render_timeline([prepare_rank(analysed_rank(trace))], tmp_path / "t.png").ranks[0]
    names = {p.name for p in trace.phases}
    for lab in drawn.phase_labels:
        text = lab.text.removeprefix("← ")
        assert text in names or (text.endswith("…") and any(n.startswith(text[:-1]) for n in names)), text
    rows = max(p.depth for p in prepare_rank(analysed_rank(trace)).phases) + 1
    lines = []
    for lab in (lab for lab in drawn.phase_labels if lab.where == "above"):
        x_top = x_label = lab.anchor_s  # the tick is one vertical line at the bar's middle (timeline_lane)
        bar_top = rows - lab.depth - 0.08
        lines += [((x_top, bar_top), (x_top, rows)), ((x_top, rows), (x_label, rows + 0.18))]
    assert any(lab.where == "above" for lab in drawn.phase_labels) or run != "vllm-h200/startup"
    for i, p in enumerate(lines):
        for q in lines[i + 1 :]:
            assert not _crosses(p, q)


def test_render_figures_draws_the_readmes_figures_from_their_source_by_default(tmp_path, capsys):
    """Issue 21: the example's docstring named other traces and its default drew seed-b12x-0613."""
    import re

    spec = importlib.util.spec_from_file_location("render_figures", TESTS.parent / "examples" / "render_figures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.default_run() == TESTS / "data" / "vllm-h200" / "startup-stacks"
    assert "tests/data/vllm-h200/startup-stacks" in mod.__doc__ and "seed-b12x" not in mod.__doc__
    assert mod.main(["--out", str(tmp_path / "docs"), "--added", "profile_run"]) == 0
    capsys.readouterr()
    docs = TESTS.parent / "docs"

    def titles(svg: Path) -> list[str]:
        return re.findall(r'<text x="10" y="(?:24|44)"[^>]*>([^<]*)</text>', svg.read_text())

    for name in ("flame.svg", "flame-profile_run.svg"):  # what the README shows is what the example draws
        assert titles(tmp_path / "docs" / name)[0] == titles(docs / name)[0]
