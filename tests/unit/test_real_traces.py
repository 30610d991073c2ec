"""The real H200 traces under tests/data/h200 (see its README): what capture guarantees, checked on real data."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from memtrace.model import ACTION_CODE
from memtrace.store import load_run
from references import reserved_curve

DATA = Path(__file__).resolve().parents[1] / "data" / "h200"
RUNS = sorted(p.name for p in DATA.glob("startup-*"))
VLLM_ORDER = [
    "init_device",
    "load_model",
    "profile_run",
    "determine_available_memory",
    "kv_cache_init",
    "compile_or_warm_up",
    "kernel_warmup",
    "capture_model",
]


def _load(name: str):
    trace = load_run(DATA / name).traces[0]
    counters = json.loads(next((DATA / name).glob("*.counters.json")).read_text())
    return trace, counters


def test_the_data_set_has_survivors_and_both_kinds_of_death():
    outcomes = json.loads((DATA / "outcomes.json").read_text())
    phases = {o["phase"] for o in outcomes.values()}
    assert len(RUNS) == 7
    assert None in phases  # survived
    assert "profile_run" in phases
    assert "compile_or_warm_up/kernel_warmup" in phases  # died only after the KV cache was sized


@pytest.mark.parametrize("name", RUNS)
def test_phases_follow_vllm_order_and_nest(name):
    trace, counters = _load(name)
    names = [p.name for p in trace.phases]
    assert names == VLLM_ORDER[: len(names)]
    by_name = {p.name: p for p in trace.phases}
    if "kernel_warmup" in by_name:
        assert trace.phases[by_name["kernel_warmup"].parent].name == "compile_or_warm_up"
    starts = [p.start_us for p in trace.phases]
    assert starts == sorted(starts)
    assert all(p.end_us is not None and p.end_us >= p.start_us for p in trace.phases)
    if counters["outcome"]["outcome"] == "ok":
        assert names == VLLM_ORDER


@pytest.mark.parametrize("name", RUNS)
def test_reserved_curve_matches_torch_counters_to_the_byte(name):
    trace, counters = _load(name)
    curve = reserved_curve(trace)
    reset = trace.facts["peak_stats_reset_us"]
    for row in counters["counters"]:
        assert curve.at(row["time_us"]) == row["memory_reserved"], row["phase"]
        since = reset if row["time_us"] > reset else int(curve.time_us[0])
        assert curve.window(since, row["time_us"]).peak_bytes == row["max_memory_reserved"], row["phase"]
    assert trace.facts["torch_counters"] == counters["counters"]


@pytest.mark.parametrize("name", RUNS)
def test_every_trace_is_complete(name):
    trace, counters = _load(name)
    assert not trace.recording.truncated
    assert trace.recording.lost_events_min == 0
    assert trace.segments, "final segments saved"
    assert len(trace.samples) > 100 and np.all(np.diff(trace.samples["time_us"]) > 0)
    assert trace.facts["sidecar"]["matched_by"] == "uuid"
    assert trace.facts["env"]["gpu_name"] == "NVIDIA H200"
    assert trace.facts["target_bytes"] == counters["target_bytes"]
    assert trace.facts["gpu_memory_utilization"] == 0.92


@pytest.mark.parametrize("name", [n for n in RUNS if n.startswith("startup-cap")])
def test_oom_traces_hold_the_oom_record_of_the_phase_they_died_in(name):
    trace, counters = _load(name)
    outcome = counters["outcome"]
    if outcome["outcome"] == "ok":
        assert "oom" not in trace.facts
        return
    oom = trace.facts["oom"]
    assert oom["phase"] == outcome["phase"]
    assert trace.recording.end_reason == "oom"
    assert np.count_nonzero(trace.events["action"] == ACTION_CODE["oom"]) == 1
    limit = counters["capacity_bytes"] - counters["vllm"]["non_torch_at_init_bytes"]
    assert abs(oom["device_total_bytes"] - limit) < 1 << 20  # the mimicked card's torch limit
    assert reserved_curve(trace).bytes[-1] + oom["requested_bytes"] > oom["device_total_bytes"]


def test_the_bigger_workspace_run_differs_by_the_extra_gib():
    full, c_full = _load("startup-full")
    ws, c_ws = _load("startup-ws1g")
    assert c_ws["vllm"]["non_kv_cache_memory_bytes"] - c_full["vllm"]["non_kv_cache_memory_bytes"] == 1 << 30
    assert [p.name for p in ws.phases] == [p.name for p in full.phases]


def test_the_full_card_crosses_its_target_after_the_kv_cache_is_sized():
    trace, counters = _load("startup-full")
    curve = reserved_curve(trace)
    target = trace.facts["target_bytes"]
    first = int(curve.time_us[np.argmax(curve.bytes > target)])
    warm = next(p for p in trace.phases if p.name == "compile_or_warm_up")
    assert curve.peak_bytes > target
    assert warm.start_us <= first <= warm.end_us


# -- one answer everywhere (issue 10): report and fits state the same OOM, target and non-KV figure ----


def _trace_ids() -> list:
    from testdata import real_traces

    return [pytest.param(p, id=str(p.relative_to(p.parents[2]))) for p in real_traces()]


@pytest.mark.parametrize("path", _trace_ids())
def test_report_and_fits_agree_on_the_oom_the_target_and_the_non_kv_figure(path, capsys):
    from memtrace.analysis.memory.oom import find_oom
    from memtrace.cli import main
    from memtrace.store import load_trace

    trace = load_trace(path)
    oom = find_oom(trace)
    assert main(["report", str(path), "--json"]) == 0
    (rep,) = json.loads(capsys.readouterr().out)["traces"]
    card = rep["target"]["capacity_bytes"]
    rc = main(["fits", str(path), "--capacity", str(max(card or 0, 1 << 30)), "--json"])
    if not len(trace.events) and oom is None:  # nothing to predict from: never a pass (issue 21)
        got = capsys.readouterr()
        assert rc == 1 and got.out == "" and "recorded no allocator events" in got.err
        return
    fit = json.loads(capsys.readouterr().out)["fits"][0]
    assert rc == (0 if fit["survives"] else 1)
    # the OOM: the same record, to the byte, in both; a run that died never fits (defect 1)
    assert (rep["oom"] is None) == (fit["recorded_oom"] is None) == (oom is None)
    if oom is not None:
        assert rep["oom"] == fit["recorded_oom"]
        assert (rep["oom"]["time_us"], rep["oom"]["requested_bytes"]) == (oom.time_us, oom.requested_bytes)
        # on the recorded card it died; a what-if card leaves other processes out (issue 32), and where the
        # run died of their memory nothing recorded says what would have come after the OOM, unless vLLM's own KV
        # sizing refuses whatever it was (shared-gpu: util 0.07 of the card is less than its weights)
        assert not fit["survives"]
        assert (fit["verdict"], fit["stage"]) == ("dies", "recorded OOM") or (
            (fit["verdict"], fit["stage"]) in (("unknown", "beyond the recording"), ("refuses", "KV sizing"))
            and fit.get("others_left_out_bytes")
        )
    # the non-KV figure: one model (reconcile.non_kv) behind both
    if rep["non_kv"] is not None:
        assert rep["non_kv"]["bytes"] == fit["non_kv_bytes"] and rep["non_kv"]["source"] == fit["non_kv_source"]
    # the card the recording stood for is the one fits compares with
    assert fit["recorded_capacity_bytes"] == card
