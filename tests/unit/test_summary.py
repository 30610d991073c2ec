"""summarize(): the peak, the crossing of the target, holders at the peak, warnings and reconciliation."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from memtrace.analysis.holders.live import live_allocations_at
from memtrace.analysis.memory.curves import all_curves
from memtrace.model import (
    ACTION_CODE,
    SAMPLE_DTYPE,
    Frame,
    Note,
    Phase,
    Process,
    Recording,
    Trace,
    empty_events,
)
from memtrace.store import load_run
from references import summarize

MiB = 1 << 20
GiB = 1 << 30


def startup() -> Trace:
    frames = [
        Frame("/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py", 10, "forward"),
        Frame("/venv/lib/python3.11/site-packages/flashinfer/moe.py", 42, "allocate_sm120_dynamic_workspace"),
        Frame("/venv/lib/python3.11/site-packages/vllm/model_loader.py", 7, "load_weights"),
    ]
    stacks = [(0, 1), (2,)]
    rows = [
        (100, "segment_alloc", 0x10000000, 2 * GiB, -1),
        (110, "alloc", 0x10000000, 2 * GiB - 5, 1),  # weights
        (200, "segment_alloc", 0x90000000, 3 * GiB, -1),
        (210, "alloc", 0x90000000, 3 * GiB - 7, 0),  # workspace: the transient
        (220, "free_requested", 0x90000000, 3 * GiB - 7, -1),
        (225, "free_completed", 0x90000000, 3 * GiB - 7, -1),
        (230, "segment_free", 0x90000000, 3 * GiB, -1),
        (300, "segment_alloc", 0xA0000000, GiB, -1),
        (310, "alloc", 0xA0000000, GiB, 1),
    ]
    ev = empty_events(len(rows))
    for i, (t, action, addr, size, stack) in enumerate(rows):
        ev[i] = (t, ACTION_CODE[action], addr, size, 0, stack)
    samples = np.array([(95, GiB // 2), (205, 5 * GiB + GiB // 2), (215, 6 * GiB), (240, 3 * GiB)], dtype=SAMPLE_DTYPE)
    return Trace(
        process=Process(pid=7, rank=0, device_total_bytes=8 * GiB),
        recording=Recording(start_us=90, end_us=320),
        events=ev,
        frames=frames,
        stacks=stacks,
        phases=[
            Phase("load_model", 90, 150),
            Phase("determine_available_memory", 190, 250),
            Phase("profile_run", 195, 240, 1),
            Phase("initialize_kv_cache", 290, 320),
        ],
        samples=samples,
        facts={"vllm.available_kv_cache_bytes": GiB, "gpu_memory_utilization": 0.5},
    )


def test_peak_is_the_first_maximum_of_reserved_with_its_phase_and_allocated_at_that_instant():
    s = summarize(startup())
    assert (s.peak.time_us, s.peak.reserved_bytes) == (200, 5 * GiB)
    assert s.peak.phase_path == "determine_available_memory/profile_run"
    # the segment is made at 200 for the workspace handed out at 210, while reserved stays at its peak
    assert (s.peak.allocated_bytes, s.peak.state_us, s.peak.event_index) == (5 * GiB - 12, 210, 3)
    assert s.peak.non_torch_bytes == GiB // 2  # last sample (t=95): 0.5 GiB used, nothing reserved yet


def test_allocated_and_device_used_peaks_are_reported_beside_it():
    s = summarize(startup())
    assert (s.peak_allocated.bytes, s.peak_allocated.time_us) == (5 * GiB - 12, 210)
    assert (s.peak_device_used.bytes, s.peak_device_used.time_us) == (6 * GiB, 215)


def test_target_comes_from_the_one_resolver_and_the_summary_carries_it():
    from memtrace.analysis.memory.target import RECORDED_UTIL, describe, resolve_target

    with pytest.raises(TypeError):  # a bare int is no target: where it came from would be lost
        summarize(startup(), 123)
    s = summarize(startup())
    assert (s.target.target_bytes, s.target.source, describe(s.target)) == (
        4 * GiB,
        RECORDED_UTIL,
        "recorded util 0.5 x the card",
    )
    t = resolve_target(startup(), util=0.25)
    assert summarize(startup(), t).target == t and t.target_bytes == 2 * GiB


def test_crossing_of_the_target_by_reserved_and_by_device_used():
    s = summarize(startup(), _target(4 * GiB))
    dev, res = s.crossing_list  # device used first: what the card sees; the exact reserved one beside it
    assert (res.curve, res.time_us, res.phase_path) == ("reserved", 200, "determine_available_memory/profile_run")
    assert (res.max_bytes, res.overshoot_bytes, res.duration_us, res.ended_above) == (5 * GiB, GiB, 30, False)
    assert (dev.curve, dev.time_us, dev.max_bytes, dev.overshoot_bytes, dev.duration_us) == (
        "device_used",
        205,
        6 * GiB,
        2 * GiB,
        35,
    )


def test_no_crossing_when_the_curve_stays_at_or_below_the_target():
    assert summarize(startup(), _target(6 * GiB)).crossing_list == []


def test_holders_at_the_peak_are_grouped_by_stack_with_the_meaningful_frame():
    s = summarize(startup())
    ws, weights = s.holders
    assert (ws.bytes, ws.count, ws.frame.name) == (3 * GiB - 7, 1, "allocate_sm120_dynamic_workspace")
    assert (weights.bytes, weights.frame.name) == (2 * GiB - 5, "load_weights")
    assert abs(ws.share + weights.share - 1.0) < 1e-12


def test_holders_skip_torch_frames_for_the_workspace_at_the_allocated_peak():
    from memtrace.analysis.holders.frames import meaningful_frame
    from memtrace.analysis.holders.live import holders_by_stack

    tr = startup()
    top = holders_by_stack(tr, 215)
    assert [h.bytes for h in top] == [3 * GiB - 7, 2 * GiB - 5]
    assert meaningful_frame(tr.stack_frames(top[0].stack)).name == "allocate_sm120_dynamic_workspace"


def test_truncation_notes_and_open_phases_surface_as_warnings():
    tr = startup()
    tr.recording.truncated = True
    tr.recording.lost_events_min = 1234
    tr.notes.append(Note(100, "warning", "hook target flashinfer.x not found"))
    tr.phases.append(Phase("capture_model", 315, None))
    s = summarize(tr)
    assert s.trace.recording.truncated
    assert any("truncated" in w and "1,234" in w for w in s.warnings)
    assert any("capture_model" in w and "never ended" in w for w in s.warnings)
    assert s.trace.notes[0].text == "hook target flashinfer.x not found"


def test_non_kv_is_the_one_model_with_vllms_recorded_figure_as_its_fallback():
    from memtrace.analysis.capacity.reconcile import VLLM_RECORDED

    # no init_device phase and no target fact: memtrace cannot reconstruct; vLLM's figure stands
    s = summarize(startup(), _target(4 * GiB))
    assert s.non_kv is not None and s.non_kv.reconstruction is None
    tr = startup()
    tr.facts["target_bytes"] = 4 * GiB
    s = summarize(tr)
    assert (s.non_kv.source, s.non_kv.bytes) == (VLLM_RECORDED, 4 * GiB - GiB)


def test_an_empty_trace_summarizes_without_error():
    s = summarize(Trace())
    assert (s.peak.reserved_bytes, s.peak_allocated.bytes, s.crossing_list, s.holders) == (0, 0, [], [])


# -- real traces recorded on an H200 (tests/data/h200, see its README) ------------------------------

DATA = Path(__file__).resolve().parents[1] / "data" / "h200"
RUNS = sorted(p.name for p in DATA.glob("startup-*"))


def real(name: str):
    trace = load_run(DATA / name).traces[0]
    counters = json.loads(next((DATA / name).glob("*.counters.json")).read_text())["counters"]
    return trace, counters


@pytest.mark.parametrize("name", RUNS)
def test_real_peak_reserved_equals_torch_max_memory_reserved_to_the_byte(name):
    trace, counters = real(name)
    s = summarize(trace)
    assert s.peak.reserved_bytes == max(c["max_memory_reserved"] for c in counters)


@pytest.mark.parametrize("name", RUNS)
def test_real_peak_is_attributed_to_the_phase_where_torch_saw_it(name):
    trace, counters = real(name)
    s = summarize(trace)
    top = max(c["max_memory_reserved"] for c in counters)
    first = next(c for c in counters if c["max_memory_reserved"] == top)  # phase ends come innermost first
    assert s.peak.phase_path.split("/")[-1] == first["phase"]
    phase = next(p for p in trace.phases if p.name == first["phase"])
    assert phase.start_us <= s.peak.time_us <= (phase.end_us or s.span[1]) <= first["time_us"]


def test_real_peak_of_the_full_card_is_in_capture_model_and_crosses_in_kernel_warmup():
    s = summarize(real("startup-full")[0])
    assert s.peak.phase_path == "compile_or_warm_up/capture_model"
    assert s.peak.reserved_bytes == 140_286_885_888
    res = next(c for c in s.crossing_list if c.curve == "reserved")
    assert res.phase_path == "compile_or_warm_up/kernel_warmup"
    assert (
        res.max_bytes == s.peak.reserved_bytes and res.overshoot_bytes == s.peak.reserved_bytes - s.target.target_bytes
    )


@pytest.mark.parametrize("name", RUNS)
def test_real_peak_allocated_is_the_requested_bytes_live_at_that_moment(name):
    trace, counters = real(name)
    c = all_curves(trace)
    s = summarize(trace, curves=c)
    i = c.allocated.peak_index
    assert s.peak_allocated.bytes == sum(a.size_bytes for a in live_allocations_at(trace, event_index=i - 1))
    assert s.peak.allocated_bytes == sum(
        a.size_bytes for a in live_allocations_at(trace, event_index=s.peak.event_index)
    )
    # torch counts whole blocks (rounded up), memtrace the requested bytes: a few MiB apart, never the other way
    torch_max = max(x["max_memory_allocated"] for x in counters)
    assert 0 <= torch_max - s.peak_allocated.bytes <= 16 * MiB


@pytest.mark.parametrize("name", RUNS)
def test_real_holders_at_the_peak_add_up_to_the_allocated_bytes_there(name):
    s = summarize(real(name)[0], top=1 << 20)
    assert sum(h.bytes for h in s.holders) == s.peak.allocated_bytes
    assert s.curves.baseline.consistent and not s.warnings


def test_real_oom_runs_carry_the_oom_and_the_phase_it_died_in():
    s = summarize(real("startup-cap16g")[0])
    assert (
        (s.oom is not None)
        and s.oom.phase_path == "compile_or_warm_up/kernel_warmup"
        and s.oom.requested_bytes == 1 << 30
    )
    assert (s.oom.free_bytes, s.oom.total_bytes) == (133_925_306_368, 16_461_791_232)
    assert s.phases[-1].path == "compile_or_warm_up/kernel_warmup"


def test_real_kv_reconstruction_matches_vllms_figure():
    s = summarize(real("startup-full")[0])
    assert s.non_kv.reconstruction.vllm_available_kv_bytes == 130_693_424_743
    assert s.non_kv.reconstruction.available_kv_bytes == s.non_kv.reconstruction.vllm_available_kv_bytes


def test_holders_are_one_line_per_printed_site_with_the_count_of_stacks():
    # startup-cap16g: two workspaces from allocate_sm120_dynamic_workspace (1.50 and 1.00 GiB) were two
    # lines printed alike; the real vLLM-shaped runs showed it three times
    s = summarize(real("startup-cap16g")[0])
    sites = [(h.frame.filename, h.frame.line, h.frame.name) for h in s.holders]
    assert len(sites) == len(set(sites))
    ws = next(h for h in s.holders if h.frame.name == "allocate_sm120_dynamic_workspace")
    assert (ws.bytes, ws.count, ws.stacks) == (int(2.5 * GiB), 2, 2)


def test_crossing_is_read_up_to_the_oom_only():
    s = summarize(real("startup-cap6g")[0])
    assert (s.oom is not None) and s.crossing_list
    for c in s.crossing_list:  # "over the target for 4.80 s (until the end)" although the OOM was at 0.68 s
        assert c.time_us + c.duration_us == s.oom.time_us if c.ended_above else c.time_us < s.oom.time_us


def _target(nbytes: int):
    """An explicit target (``--target``) of the synthetic start-up, resolved by the one resolver."""
    from memtrace.analysis.memory.target import resolve_target

    return resolve_target(startup(), target_bytes=nbytes)
