"""One run in time, one door to figures (issue 40, cases 5-7) and the timeline's pictures (issue 41, item 8), on
real traces recorded on the lent H200 and H100 (tests/data/vllm-h200-034-serving/oom, vllm-h100-034-serving/oom-held,
vllm-h200-034/moe-ext, vllm-h200-034-grid/small-rescue-p2048, h200/startup-full, vllm-h200/shared-gpu) and a public
allocator snapshot of one moment (tests/data/snapshots/state-only.pickle).

Each test failed on the code before this change: the serving window lay outside the run's quantities (other
processes "up to 115.88 GiB" beside the serving section's 117.41 GiB, exports stopping at 13.74 s), each renderer
chose its own peak (the flame at the reserved peak, 11.43 GiB, beside a headline of 137.35 GiB), and a crossing's
highest covered its first excursion only (12.13 GiB where device used reached 12.50 GiB).
"""

from __future__ import annotations

import csv
import json
import pickle
from functools import cache
from pathlib import Path

import pytest
from memtrace.analysis.analysed.run import analyse
from memtrace.analysis.analysed.summary import summary_doc
from memtrace.analysis.holders.moment import flame_for
from memtrace.cli import main
from memtrace.importers.files import traces_from_snapshot_file
from memtrace.store import load_run

DATA = Path(__file__).resolve().parents[1] / "data"
H200_OOM = DATA / "vllm-h200-034-serving" / "oom"
H100_OOM = DATA / "vllm-h100-034-serving" / "oom-held"
MOE_EXT = DATA / "vllm-h200-034" / "moe-ext"
RESCUE = DATA / "vllm-h200-034-grid" / "small-rescue-p2048"
GiB, MiB = 1 << 30, 1 << 20


@cache
def _run(path: Path):
    if not path.exists():
        pytest.skip(f"{path} is not shipped")
    return analyse(load_run(str(path)).traces, path=str(path))


# -- case 5: the serving window is part of the run's timeline ----------------------------------------------------


@pytest.mark.parametrize("path", [H200_OOM, H100_OOM], ids=["h200", "h100"])
def test_every_quantity_covers_start_up_and_the_serving_window(path):
    r = _run(path).ranks[0]
    w, d = r.startup.window, r.window.device
    assert (
        r.span[1] >= w.end_us and summary_doc(r)["end_us"] == r.span[1]
    )  # the recording's extent: to the window's end
    assert r.n_events == len(r.startup.events) + len(w.events)
    # other processes: the report's peak is the serving section's figure at the OOM, the highest of the run
    assert r.peak_others.bytes == d.end.others_bytes and r.peak_others.bytes > d.startup_end.others_bytes
    # the card itself: full at the OOM (CUDA's free bytes there), as the serving section says
    assert r.whole_device_peak_bytes == r.trace.process.device_total_bytes - r.oom.free_bytes
    # held: the run's peak is at least what was held at the OOM, in the window
    assert r.peak_held.time_us >= w.start_us and r.headline.point.bytes == r.peak_held.bytes


def test_the_reports_peak_target_and_recording_lines_say_the_serving_sections_figures(capsys):
    assert main(["report", str(H200_OOM)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "other processes on this GPU held up to 117.41 GiB" in text  # was 115.88 GiB, start-up's alone
    assert "other processes 117.41 GiB†" in text  # the serving section: one answer
    assert "over 29.14 s" in text and "over 13.76 s" not in text
    assert "the card itself held up to 139.78 GiB, 0.02 GiB below it" in text  # was "1.69 GiB below it"


def test_the_flames_most_held_is_at_least_what_the_oom_shows():
    r = _run(H200_OOM).ranks[0]
    peak, at_peak = flame_for(r, "peak")
    oom, at_oom = flame_for(r, "oom")
    assert peak.time_us == r.headline.point.time_us and peak.time_us >= r.startup.window.start_us
    assert round(at_oom.total_bytes / GiB, 2) == 21.59  # PyTorch 11.17 GiB + the KV cache 10.42 GiB, at the OOM
    assert r.headline.point.bytes >= at_oom.total_bytes  # was: "the most held was 21.49 GiB"


def test_the_exports_include_the_serving_window(tmp_path, capsys):
    r = _run(H200_OOM).ranks[0]
    oom_s = r.seconds(r.oom.time_us)
    assert main(["export", str(H200_OOM), "-f", "csv", "-o", str(tmp_path / "c.csv")]) == 0
    rows = list(csv.DictReader((tmp_path / "c.csv").open()))
    assert max(int(x["time_us"]) for x in rows) / 1e6 == pytest.approx(oom_s, abs=1e-3)  # was 13.74 s
    assert main(["export", str(H200_OOM), "-f", "perfetto", "-o", str(tmp_path / "p.json")]) == 0
    doc = json.loads((tmp_path / "p.json").read_text())
    assert max(e.get("ts", 0) for e in doc["traceEvents"]) / 1e6 == pytest.approx(oom_s, abs=1e-3)
    assert main(["export", str(H200_OOM), "-f", "memory-viz", "-o", str(tmp_path / "s.pickle")]) == 0
    snap = pickle.loads((tmp_path / "s.pickle").read_bytes())
    assert len(snap["device_traces"][0]) == len(r.trace.events) == 265_580  # 5,106 start-up + 260,474 window
    capsys.readouterr()


def test_the_plot_gives_the_window_its_width_its_categories_and_a_zoom_where_the_request_shows(tmp_path):
    from memtrace.analysis.memory.categories import CATEGORIES
    from memtrace.plots.timeline import render_timeline
    from memtrace.plots.timeline_data import prepare_rank

    r = _run(H200_OOM).ranks[0]
    t = prepare_rank(r)
    assert t.serving is None and t.window_us == (r.startup.window.start_us, r.startup.window.end_us)
    # weights stay weights after start-up (was: grey "other PyTorch" from 13.76 s on)
    last = t.categories.at([len(r.trace.events)])
    assert last[CATEGORIES.index("weights")][0] > 10 * GiB
    drawn = render_timeline([t], tmp_path / "t.png", t0_us=r.origin.t0_us)
    w0, w1 = (x - r.origin.t0_us for x in t.window_us)
    scale = drawn.scale
    assert scale.fraction(w1 / 1e6) - scale.fraction(w0 / 1e6) > 0.4  # was ~5 % of the width
    # the zoom: the device's last MiBs, where the 22 MiB request is seen not to fit (was ±2 ms on 0-170 GiB)
    assert drawn.ranks[0].zoom_title == "zoom: the OOM, in MiB"


def test_the_view_draws_the_neighbours_band_and_one_part():
    from memtrace.plots.view_data import OTHERS_COLUMNS, pack_rank

    r = _run(H200_OOM).ranks[0]
    packed = pack_rank(r, r.origin.t0_us)
    assert packed.window is None  # one part: start-up and the window on one timeline
    assert packed.meta["others"]["peak_bytes"] == r.peak_others.bytes
    names = [c["name"] for c in packed.columns]
    assert [n for n, _ in OTHERS_COLUMNS] == [n for n in names if n.startswith("oth_")]


def test_a_serving_ooms_issue_bundle_answers_the_serving_question(tmp_path, capsys):
    assert main(["issue", str(H200_OOM), "-o", str(tmp_path / "b")]) == 0
    capsys.readouterr()
    md = (tmp_path / "b" / "issue.md").read_text()
    assert "## What would make it boot" not in md and "BOOTS" not in md  # start-up's question, not asked here
    assert "## What would have left room (serving)" in md
    assert "needed 2.06 MiB more than the 19.94 MiB free" in md
    assert "other processes +1.53 GiB†, device used by this process +142.00 MiB†" in md
    assert "`--gpu-memory-utilization 0.99` (recorded 1)" in md


# -- case 6: one headline, read by every output -------------------------------------------------------------------


def test_the_headline_is_the_peak_held_in_the_report_the_view_and_the_issues_flame(tmp_path, capsys):
    from memtrace.plots.issue_md import render_issue
    from memtrace.plots.view_data import rank_meta

    run = _run(MOE_EXT)
    r = run.ranks[0]
    assert r.headline.quantity == "held" and round(r.headline.point.bytes / GiB, 2) == 137.35
    assert main(["report", str(MOE_EXT)]) == 0
    out = capsys.readouterr().out
    peak_section = out.split("\nPeak\n----\n", 1)[1].split("\n\n", 1)[0]
    assert peak_section.lstrip().startswith("held by this process 137.35 GiB at 179.24 s in kv_cache_extend")
    meta = rank_meta(r, run.origin.t0_us)
    assert meta["peak_mark"]["bytes"] == r.headline.point.bytes  # was the reserved peak, 11.73 GiB
    assert [m["bytes"] for m in meta["landmarks"] if m["name"] == "peak"] == [r.headline.point.bytes]
    moment, flame = flame_for(r, "peak")  # the issue bundle's flame: --at peak
    assert moment.time_us == r.headline.point.time_us and flame.total_bytes > 137 * GiB  # was 11.43 GiB
    assert "## What held memory at the peak held" in render_issue(run)


def test_the_top_holders_are_the_headline_peaks_with_the_kv_cache_outside_pytorch(tmp_path, capsys):
    """Every output that names holders "at the peak" reads the run's headline: on moe-ext the peak held at 179.24 s,
    where vLLM's KV cache (126.23 GiB committed outside PyTorch) held most (was: reserved's peak at 168.97 s, 11.35
    GiB of PyTorch's blocks, the KV cache nowhere)."""
    from memtrace.plots.issue_md import render_issue

    run = _run(MOE_EXT)
    r = run.ranks[0]
    moment, flame = flame_for(r, "peak")
    top = r.holders[0]
    assert top.bytes == flame.vmm_bytes == 135_543_128_064 and top.frame.name == "_map_chunk_at"
    assert sum(h.bytes for h in r.holders) <= flame.total_bytes and sum(h.share for h in r.holders) <= 1
    assert main(["report", str(MOE_EXT)]) == 0
    text = capsys.readouterr().out
    assert "Top holders at the peak held (179.24 s): PyTorch's and the KV cache outside it, by allocating site" in text
    assert main(["report", str(MOE_EXT), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["traces"][0]["holders"][0]["bytes"] == 135_543_128_064
    who = render_issue(run).split("**Who held it** at the peak: ", 1)[1].split("\n", 1)[0]
    assert who.startswith("126.23 GiB (92 %) `utils/extensible_tensor.py:119 _map_chunk_at`")


def test_a_joined_run_is_decided_once_and_keeps_no_window_apart():
    """With the serving window joined into the run's timeline nothing holds the window a second time: no window rank,
    so the view counts each of the run's 265,580 events once against --max-events (it counted the window's 260,474
    twice and gave an overview without events) and the server builds no queries nobody asks."""
    from memtrace.plots.view_html import build_page

    run = _run(H200_OOM)
    r = run.ranks[0]
    assert r.serving is None  # was the window again, as a rank of its own
    page = build_page(run, max_events=len(r.trace.events), api=False)
    assert '"overview"' not in page
    assert r.joined and not r.boot_rank.joined and r.boot_rank.serving is not None  # start-up alone: the window apart


# -- case 7: a crossing's highest is the highest of all its excursions ------------------------------------------


def test_a_crossings_highest_covers_every_excursion_and_ended_above_says_the_end(capsys):
    r = _run(RESCUE).ranks[0]
    c = r.crossings
    used, target = r.curves.device_used, r.target.target_bytes
    assert c.device_used.excursions == 2 and c.device_used.max_bytes == used.peak_bytes
    assert round(c.device_used.max_bytes / GiB, 2) == 12.50  # was 12.13 GiB, the first excursion's
    for e, curve in ((c.device_used, used), (c.reserved, r.curves.reserved)):
        assert e.ended_above == (int(curve.bytes[-1]) > target)
    assert main(["report", str(RESCUE), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["traces"][0]["crossings"]
    assert [x["ended_above"] for x in doc] == [True, True]  # was false for device used
    assert main(["report", str(RESCUE)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "2 excursions above in all, above it at the recording's end; highest 12.50 GiB (+0.83 GiB over)" in text


# -- issue 41 item 8: pictures --------------------------------------------------------------------------------------


def _drawn(run, tmp_path, capacities=()):
    from memtrace.plots.timeline import render_timeline
    from memtrace.plots.timeline_data import prepare_rank

    return render_timeline([prepare_rank(r) for r in run.ranks], tmp_path / "t.png", capacities=capacities,
                           t0_us=run.origin.t0_us)  # fmt: skip


def test_a_snapshot_of_one_moment_says_so_with_no_time_axis_and_no_zoom(tmp_path):
    path = DATA / "snapshots" / "state-only.pickle"
    if not path.exists():
        pytest.skip("state-only.pickle is not shipped")
    drawn = _drawn(analyse(traces_from_snapshot_file(path), path=str(path)), tmp_path)
    rank = drawn.ranks[0]
    assert rank.panels == 1 and rank.zoom_title == ""
    assert rank.x_label.startswith("one moment") and "seconds" not in rank.x_label
    assert rank.lane_label == ""  # no phases: no empty "phases" label


def test_a_shared_gpu_plot_keeps_this_processs_own_scale(tmp_path):
    run = _run(DATA / "vllm-h200" / "shared-gpu")
    drawn = _drawn(run, tmp_path)
    assert drawn.ranks[0].y_top < 30  # GiB: the crossing of 9.79 GiB readable (was 0-150 GiB, the card)
    assert "other processes on the GPU (NVML), above the scale" in drawn.legend


def test_start_up_full_keeps_its_y_axis_near_the_card(tmp_path):
    drawn = _drawn(_run(DATA / "h200" / "startup-full"), tmp_path)
    assert drawn.ranks[0].y_top < 160  # GiB, on a 139.80 GiB card (was ~210 GiB)


def test_moe_ext_phase_labels_stack_at_most_three_rows_above_the_lane(tmp_path):
    drawn = _drawn(_run(MOE_EXT), tmp_path)
    rows = {lab.row for lab in drawn.ranks[0].phase_labels if lab.where == "above"}
    assert max(rows) + 1 <= 3  # was six


def test_capacity_lines_are_card_sizes_not_what_ifs_of_the_recorded_curve(tmp_path):
    drawn = _drawn(_run(DATA / "h200" / "startup-full"), tmp_path, capacities=[16 * GiB, 32 * GiB])
    assert "--capacity card (fits says if it boots)" in drawn.legend
    assert not any("what-if" in x for x in drawn.legend)


def test_the_what_if_of_a_serving_run_asks_start_up_alone_as_plain_fits_does():
    """``fits --what-if`` / ``--suggest`` answer through ``rank.boot``: on a rank with its serving window joined, that
    is start-up's answer, the same object plain ``fits`` reads (it read the joined trace: two answers)."""
    rank = _run(H200_OOM).ranks[0]
    assert rank.joined  # the window is joined
    assert rank.boot() is rank.boot_rank.boot() and rank.boot().rank is rank.boot_rank
