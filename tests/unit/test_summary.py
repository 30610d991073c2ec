"""summarize(): the peak, the crossing of the target, holders at the peak, warnings and reconciliation."""

from __future__ import annotations

import numpy as np
from memtrace.analysis.summary import summarize
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


def test_target_comes_from_the_argument_then_the_utilization_fact():
    assert summarize(startup(), target_bytes=123).target_bytes == 123
    s = summarize(startup())
    assert (s.target_bytes, s.target_source) == (4 * GiB, "utilization")


def test_crossing_of_the_target_by_reserved_and_by_device_used():
    s = summarize(startup(), target_bytes=4 * GiB)
    res, dev = s.crossings
    assert (res.curve, res.time_us, res.phase_path) == ("reserved", 200, "determine_available_memory/profile_run")
    assert (res.value_bytes, res.overshoot_bytes, res.duration_us, res.ended_above) == (5 * GiB, GiB, 30, False)
    assert (dev.curve, dev.time_us, dev.value_bytes, dev.overshoot_bytes, dev.duration_us) == (
        "device_used",
        205,
        6 * GiB,
        2 * GiB,
        35,
    )


def test_no_crossing_when_the_curve_stays_at_or_below_the_target():
    assert summarize(startup(), target_bytes=6 * GiB).crossings == []


def test_holders_at_the_peak_are_grouped_by_stack_with_the_meaningful_frame():
    s = summarize(startup())
    ws, weights = s.holders
    assert (ws.bytes, ws.count, ws.frame.name) == (3 * GiB - 7, 1, "allocate_sm120_dynamic_workspace")
    assert (weights.bytes, weights.frame.name) == (2 * GiB - 5, "load_weights")
    assert abs(ws.share + weights.share - 1.0) < 1e-12


def test_holders_skip_torch_frames_for_the_workspace_at_the_allocated_peak():
    from memtrace.analysis.live import holders_by_stack, meaningful_frame

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
    assert s.truncated
    assert any("truncated" in w and "1,234" in w for w in s.warnings)
    assert any("capture_model" in w and "never ended" in w for w in s.warnings)
    assert s.notes[0].text == "hook target flashinfer.x not found"


def test_reconciliation_uses_the_profiling_peak_plus_non_torch():
    s = summarize(startup(), target_bytes=4 * GiB)
    r = s.reconciliation
    assert r.phase_path == "determine_available_memory"
    assert r.peak_reserved_bytes == 5 * GiB
    assert r.non_torch_bytes == GiB // 2  # last sample at or before the peak (t=95): 0.5 GiB used, 0 reserved
    assert r.memtrace_available_kv_bytes == 4 * GiB - 5 * GiB - GiB // 2
    assert r.difference_bytes == r.memtrace_available_kv_bytes - GiB


def test_an_empty_trace_summarizes_without_error():
    s = summarize(Trace())
    assert (s.peak.reserved_bytes, s.peak_allocated.bytes, s.crossings, s.holders) == (0, 0, [], [])
