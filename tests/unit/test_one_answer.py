"""One answer everywhere (issue 10): every output states the same target, peak, crossing and OOM, to the byte.

For every run shipped under tests/data (real H200 start-ups, the real vLLM runs, the FlashInfer runs, and
PyTorch snapshots other people recorded) and every way of giving the target, ``report --json`` is the
reference; the Perfetto export (its target counter, peak and crossing instants, OOM slice), ``fits --json``
on the run's own card, ``diff`` of the run against itself and the issue bundle must say the same thing.
(The timeline's annotations are checked against the report in test_plot_real.py, the view's page in
test_view.py.)
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from memtrace.cli import main
from memtrace.units import format_gib
from testdata import unpacked

DATA = Path(__file__).resolve().parents[1] / "data"
RUNS = [
    unpacked(p)
    for p in sorted(
        [p for p in (DATA / "h200").iterdir() if p.is_dir()]
        + [p for p in (DATA / "vllm-h200").iterdir() if p.is_dir()]
        + [p for p in (DATA / "snapshots").glob("*.pickle") if "state-only" not in p.name]
    )
]
GiB = 1 << 30
TARGETS = {
    "recorded": [],
    "bytes": ["--target", "9GiB"],
    "util": ["--util", "0.5"],
    "util-total": ["--util", "0.9", "--total", "8GiB"],
}


def _cli(capsys, *argv) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().out


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("one-answer")


def _report(capsys, run: Path, given: list[str]) -> list[dict]:
    code, out = _cli(capsys, "report", run, *given, "--json")
    assert code == 0
    return json.loads(out)["traces"]


def _perfetto(capsys, run: Path, given: list[str], out: Path) -> dict[str, dict]:
    """The Perfetto figures per process label: target, peak, first crossing, OOM."""
    assert main(["export", str(run), *given, "-f", "perfetto", "-o", str(out), "--force"]) == 0
    capsys.readouterr()
    events = json.loads(out.read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    found: dict[str, dict] = {label: {} for label in names.values()}
    for e in events:
        fig = found.get(names.get(e["pid"], ""))
        if fig is None:
            continue
        if e["ph"] == "C" and e["name"] == "target":
            fig["target"] = e["args"]["bytes"]
        elif e["name"] == "peak reserved":
            fig["peak"] = e["args"]["reserved_bytes"]
        elif e["name"] == "first crossing of the target":
            fig["crossing"] = (e["args"]["curve"], e["args"]["target_bytes"])
        elif e["name"] == "CUDA OOM":
            fig["oom"] = (e["args"]["requested_bytes"], e["args"].get("free_bytes"))
    return found


@pytest.mark.parametrize("way", sorted(TARGETS))
@pytest.mark.parametrize("run", RUNS, ids=lambda p: p.name)
def test_every_output_states_the_reports_target_peak_crossing_and_oom(run, way, capsys, tmp):
    given = TARGETS[way]
    code, out = _cli(capsys, "report", run, *given, "--json")
    if code == 2:  # --util on a snapshot that recorded no capacity: every command refuses it alike
        err = capsys.readouterr().err
        assert main(["export", str(run), *given, "-o", str(tmp / "refused.json")]) == 2
        assert main(["plot", str(run), *given, "-o", str(tmp / "refused.png")]) == 2
        assert not (tmp / "refused.json").exists() and not (tmp / "refused.png").exists()
        assert "capacity" in err + capsys.readouterr().err
        return
    assert code == 0
    reports = json.loads(out)["traces"]
    perfetto = _perfetto(capsys, run, given, tmp / f"{run.name}-{way}.json")
    for r in reports:
        label = r["label"] if r["process"]["rank"] is None else f"{r['label']} (pid {r['process']['pid']})"
        p = perfetto[label]
        target = r["target"]["target_bytes"]
        assert p.get("target") == target
        if r["n_events"]:
            assert p["peak"] == r["peak"]["reserved_bytes"]
        first = r["crossings"][0] if r["crossings"] else None
        assert p.get("crossing") == ((first["curve"], target) if first else None)
        oom = r["oom"]
        assert p.get("oom") == ((oom["requested_bytes"], oom["free_bytes"]) if oom else None)


@pytest.mark.parametrize("run", RUNS, ids=lambda p: p.name)
def test_diff_of_a_run_against_itself_passes_and_gates_the_reports_peaks(run, capsys):
    reports = _report(capsys, run, [])
    code, out = _cli(capsys, "diff", run, run, "--json")
    assert code == 0
    doc = json.loads(out)
    for r, d in zip(reports, doc["traces"], strict=True):
        headline = {c["label"]: c for c in d["headline"]}
        if r["n_events"]:
            peak = headline["peak reserved"]
            assert peak["base_bytes"] == peak["new_bytes"] == r["peak"]["reserved_bytes"]
            assert headline["peak allocated"]["new_bytes"] == r["peak_allocated"]["bytes"]
        assert not d["new_empty"]


@pytest.mark.parametrize("run", [p for p in RUNS if p.is_dir()], ids=lambda p: p.name)
def test_fits_on_the_runs_own_card_uses_the_reports_target(run, capsys):
    r = _report(capsys, run, [])[0]
    if not r["n_events"]:
        pytest.skip("no allocator events: nothing to predict")
    t = r["target"]
    card, util = t["capacity_bytes"], t["util"] or 0.9
    code, out = _cli(capsys, "fits", run, "--capacity", card, "--util", util, "--json")
    fit = json.loads(out)["fits"][0]
    assert fit["target_bytes"] == math.ceil(util * card)
    if t["source"] in ("recorded", "recorded util x card") and t["util"] is not None:
        assert fit["target_bytes"] == t["target_bytes"]
    if r["oom"] is not None:  # a run that died never fits on its own card; alone on it (neighbours left out)
        # unknown past the OOM, unless vLLM's own KV sizing refuses whatever came next (shared-gpu's util 0.07)
        past = (("unknown", "beyond the recording"), ("refuses", "KV sizing"))
        alone = past if fit["others_left_out_bytes"] else (("dies", "recorded OOM"),)
        assert code == 1 and (fit["verdict"], fit["stage"]) in alone


@pytest.mark.parametrize("way", ["recorded", "util"])
@pytest.mark.parametrize(
    "run", [DATA / "h200" / "startup-cap16g", DATA / "vllm-h200" / "shared-gpu", DATA / "h200" / "startup-full"]
)
def test_issue_bundle_states_the_reports_target_and_oom(run, way, capsys, tmp):
    r = _report(capsys, run, TARGETS[way])[0]
    out = tmp / f"issue-{run.name}-{way}"
    assert main(["issue", str(run), "-o", str(out), *TARGETS[way]]) == 0
    md = (out / "issue.md").read_text()
    assert f"- **Target:** {format_gib(r['target']['target_bytes'])} (from " in md
    if r["oom"]:
        assert re.search(
            rf"\n\*\*DIED: the process ran out of CUDA memory at [\d.]+ s in {r['oom']['phase_path']} ", md
        )
    else:
        assert "DIED" not in md


# -- multi-rank runs (issue 21): one worst rank, one OOM at one time on one origin, one target -----------------

SNAPSHOT = DATA / "snapshots" / "multi-device-oom.pickle"


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> Path:
    """One run of two real H200 processes made ranks 0 and 1, recorded from the same moment: the full start-up
    (crossed its target) and the 16 GiB-card one (died). (Copied into one folder as they were recorded, 27 s
    apart and without ranks, they are two runs, refused: issue 32 defect 10.)"""
    import dataclasses

    from memtrace.analysis.analysed.origin import shifted
    from memtrace.analysis.memory.phases import recording_span
    from memtrace.store import load_run, save_trace

    folder = tmp_path_factory.mktemp("two-h200") / "run"
    folder.mkdir()
    (full,), (died,) = (load_run(DATA / "h200" / name).traces for name in ("startup-full", "startup-cap16g"))
    died = shifted(died, recording_span(full)[0] - recording_span(died)[0])
    for rank, t in enumerate((full, died)):
        t = dataclasses.replace(t, process=dataclasses.replace(t.process, rank=rank))
        save_trace(t, folder / f"vm-pid{t.process.pid}-rank{rank}.memtrace")
    return folder


def _everything(capsys, run: Path, out: Path) -> dict:
    """What each output says about the worst rank, its OOM and the time origin."""
    said: dict = {}
    code, text = _cli(capsys, "report", run, "--json")
    doc = json.loads(text)
    said["report"] = doc
    _, said["report_text"] = _cli(capsys, "report", run)
    assert main(["plot", str(run), "-o", str(out / "t.png"), "--force"]) == 0
    said["plot"] = capsys.readouterr().err
    assert main(["issue", str(run), "-o", str(out / "issue"), "--force"]) == 0
    capsys.readouterr()
    said["issue"] = (out / "issue" / "issue.md").read_text()
    assert main(["export", str(run), "-o", str(out / "p.json"), "--force"]) == 0
    capsys.readouterr()
    said["perfetto"] = json.loads((out / "p.json").read_text())
    assert main(["view", str(run), "-o", str(out / "v.html"), "--force"]) == 0
    capsys.readouterr()
    page = (out / "v.html").read_text()
    said["view"] = json.loads(page.split('id="mt-doc">', 1)[1].split("</script>", 1)[0])
    assert main(["flame", str(run), "-o", str(out / "f.svg"), "--force"]) == 0
    said["flame"] = capsys.readouterr().err
    code, text = _cli(capsys, "fits", run, "--capacity", "16GiB", "--json")
    said["fits"] = json.loads(text)
    return said


@pytest.mark.parametrize("which", ["snapshot", "two-h200"])
def test_every_output_names_the_same_worst_rank_and_its_oom_at_the_same_time(which, two_runs, capsys, tmp_path):
    run = SNAPSHOT if which == "snapshot" else two_runs
    said = _everything(capsys, run, tmp_path)
    doc = said["report"]
    worst = "rank 1"  # the rank that died, whatever peaked highest
    assert doc["worst"] == worst and doc["verdict"] == "died"
    (died,) = [t for t in doc["traces"] if t["oom"]]
    assert died["label"] == worst
    t0, oom = doc["time_origin"]["t0_us"], died["oom"]
    at = f"{(oom['time_us'] - t0) / 1e6:.3f} s"
    sentence = doc["time_origin"]["sentence"]
    # the report: its worst line and the OOM, on the one origin
    assert f"Worst: {worst} (died of CUDA OOM at {(oom['time_us'] - t0) / 1e6:.2f} s" in said["report_text"]
    assert f"Times: {sentence}" in said["report_text"]
    # the timeline's lines
    assert f"memtrace: {worst}: OUT OF MEMORY at {at}" in said["plot"] and f"worst: {worst} (died)" in said["plot"]
    assert sentence in said["plot"]
    # the issue bundle: its first sentence says the run died, which rank, when
    first = said["issue"].split("\n\n")[1]
    assert first.startswith(f"**DIED: {worst} ran out of CUDA memory at {(oom['time_us'] - t0) / 1e6:.2f} s")
    assert sentence in said["issue"]
    assert "| --- | --- |" in said["issue"]  # the environment table is never empty
    # Perfetto: the same origin, the same worst rank, the OOM at the same microsecond
    other = said["perfetto"]["otherData"]
    assert (other["t0_us"], other["worst"], other["time_origin"]) == (t0, worst, sentence)
    names = {e["pid"]: e["args"]["name"] for e in said["perfetto"]["traceEvents"] if e["name"] == "process_name"}
    (slice_,) = [e for e in said["perfetto"]["traceEvents"] if e["name"] == "CUDA OOM"]
    assert names[slice_["pid"]].startswith(worst) and slice_["ts"] == oom["time_us"] - t0
    # the view: its page states the worst rank, the origin, and the OOM at the same moment
    view = said["view"]
    assert view["worst"].startswith(f"Worst: {worst}")
    (lane,) = [r for r in view["ranks"] if r["label"] == worst]
    assert lane["t0_us"] == t0 and lane["oom"]["time_us"] == oom["time_us"] and lane["time_origin"] == sentence
    # the flame graph shows the worst rank; fits names it
    assert f"\nmemtrace: {worst}: " in "\n" + said["flame"]
    assert said["fits"]["worst"] == worst


@pytest.mark.parametrize("which", ["snapshot", "two-h200"])
def test_every_output_states_each_ranks_target_with_the_same_source(which, two_runs, capsys, tmp_path):
    run = SNAPSHOT if which == "snapshot" else two_runs
    given = [] if which == "two-h200" else ["--target", "9GiB"]
    code, text = _cli(capsys, "report", run, *given, "--json")
    reports = {t["label"]: t for t in json.loads(text)["traces"]}
    perfetto = _perfetto(capsys, run, given, tmp_path / "p.json")
    assert main(["view", str(run), *given, "-o", str(tmp_path / "v.html"), "--force"]) == 0
    capsys.readouterr()
    page = (tmp_path / "v.html").read_text()
    view = json.loads(page.split('id="mt-doc">', 1)[1].split("</script>", 1)[0])
    for lane in view["ranks"]:
        r = reports[lane["label"]]
        assert (lane["target"]["bytes"], lane["target"]["source"]) == (
            r["target"]["target_bytes"],
            r["target"]["source"],
        )
    for label, r in reports.items():
        key = label if r["process"]["rank"] is None else f"{label} (pid {r['process']['pid']})"
        assert perfetto[key].get("target") == r["target"]["target_bytes"]


def test_the_issue_bundle_of_the_three_device_snapshot_names_the_rank_that_died_not_rank_0(capsys, tmp_path):
    assert main(["issue", str(SNAPSHOT), "-o", str(tmp_path / "b")]) == 0
    md = (tmp_path / "b" / "issue.md").read_text()
    assert md.startswith("## Rank 1 DIED of CUDA OOM at ") and "start-up" not in md.splitlines()[0]  # a snapshot
    screen = md.split("<details", 1)[0]
    assert screen.split("\n\n")[1].startswith("**DIED: rank 1 ran out of CUDA memory at ") and "4.94 GiB" in screen
    assert "Figures of rank 1, the worst of 3 ranks (died)" in screen
    assert "**Peak before it died:** PyTorch reserved 78.42 GiB" in screen and "7.96 GiB" not in screen
    assert "| devices | cuda:0, cuda:1, cuda:2 |" in md


# -- one vocabulary (issue 32): every named quantity, the same bytes in every output, over every shipped trace --


def _every_shipped_trace() -> list[Path]:
    from vllm034_data import STEPS, VLLM033, VLLM034

    runs = [p for p in (DATA / "h200").iterdir() if p.is_dir()] + [
        unpacked(p) for p in (DATA / "vllm-h200").iterdir() if p.is_dir() and any(unpacked(p).glob("*.memtrace"))
    ]
    runs += [VLLM034.run_dir(s) for s in STEPS] + [VLLM033.run_dir("moe")]
    runs += [DATA / "vllm-cpu-tp2" / "memtrace-run", DATA / "vllm-cpu-tp2" / "ray-two-nodes"]
    return sorted(runs) + [p for p in sorted((DATA / "snapshots").glob("*.pickle")) if "state-only" not in p.name]


@pytest.mark.parametrize("run", _every_shipped_trace(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_named_quantity_is_the_same_bytes_in_every_output_that_shows_it(run, capsys, tmp):
    from memtrace.analysis.memory import quantities as Q
    from memtrace.units import gib_or_dash

    code, out = _cli(capsys, "report", run, "--json")
    assert code == 0
    reports = json.loads(out)["traces"]
    _, text = _cli(capsys, "report", run)
    text = " ".join(text.split())
    if not any(r["n_events"] for r in reports):  # recorded nothing: no figure to state, and the view says so
        assert main(["view", str(run), "-o", str(tmp / f"vocab-{run.name}.html"), "--force"]) == 2
        assert "recorded no allocator events" in capsys.readouterr().err
        return
    perfetto = _perfetto(capsys, run, [], tmp / f"vocab-{run.name}.json")
    assert main(["view", str(run), "-o", str(tmp / f"vocab-{run.name}.html"), "--force"]) == 0
    capsys.readouterr()
    page = (tmp / f"vocab-{run.name}.html").read_text()
    lanes = {r["label"]: r for r in json.loads(page.split('id="mt-doc">', 1)[1].split("</script>", 1)[0])["ranks"]}
    code, out = _cli(capsys, "diff", run, run, "--json")
    diffs = json.loads(out)["traces"] if code in (0, 1) and out.startswith("{") else []
    for i, r in enumerate(reports):
        if not r["n_events"]:
            continue
        reserved, allocated = r["peak"]["reserved_bytes"], r["peak_allocated"]["bytes"]
        held = r["peak_held"]["bytes"] if r["peak_held"] else None
        device = r["peak_device_used"]["bytes"] if r["peak_device_used"] else None
        label = r["label"] if r["process"]["rank"] is None else f"{r['label']} (pid {r['process']['pid']})"
        # PyTorch reserved: text, Perfetto, the view's peak and its landmark, diff
        assert f"reserved {gib_or_dash(reserved)} at" in text
        assert perfetto[label]["peak"] == reserved
        lane = lanes[r["label"]]
        assert lane["peak"]["reserved_bytes"] == reserved
        # the view's peak mark is the run's headline peak (held where a KV cache sat outside PyTorch), decided once
        headline = r["headline"]["point"]["bytes"]
        expect = allocated if r["headline"]["quantity"] == "allocated" else held if held is not None else reserved
        assert headline == expect
        assert [m["bytes"] for m in lane["landmarks"] if m["name"] == "peak"] == [headline]
        assert lane["peak_mark"]["bytes"] == headline
        # PyTorch allocated (requested), and memory present before recording began
        assert f"allocated peak {gib_or_dash(allocated)}" in text
        assert lane["peak"]["allocated_bytes"] == r["peak"]["allocated_bytes"]
        assert (lane["baseline"]["allocated"], lane["baseline"]["reserved"]) == (
            r["baseline"]["allocated_bytes"],
            r["baseline"]["reserved_bytes"],
        )
        before = [h for h in r["holders"] if h["before_recording"]]
        assert sum(h["bytes"] for h in before) <= r["baseline"]["allocated_bytes"]
        # held by this process (reserved + the KV cache outside PyTorch): the view and diff say the same bytes
        if held is not None:
            assert lane["vmm"] is None or lane["vmm"]["held_peak_bytes"] == held
        if device is not None:
            assert f"device used peak {gib_or_dash(device)}" in text
        if diffs:
            head = {c["label"]: c["new_bytes"] for c in diffs[i]["headline"]}
            assert head["peak reserved"] == reserved and head["peak allocated"] == allocated
            assert head.get(f"peak {Q.HELD.label}") == held  # only when a KV cache sat outside PyTorch
            if device is not None and diffs[i]["device_level"]:
                assert head["peak device used"] == device
