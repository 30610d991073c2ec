"""Per-phase figures, phase paths and the innermost phase at a moment."""

from __future__ import annotations

from memtrace.analysis.memory.curves import all_curves
from memtrace.analysis.memory.phases import phase_at, phase_path, phase_stats
from memtrace.model import ACTION_CODE, Phase, Trace, empty_events

MiB = 1 << 20


def make_trace(rows, phases):
    ev = empty_events(len(rows))
    for i, (t, action, addr, size) in enumerate(rows):
        ev[i] = (t, ACTION_CODE[action], addr, size, 0, -1)
    return Trace(events=ev, phases=phases)


def startup():
    rows = [
        (100, "segment_alloc", 0x1000, 100 * MiB),  # load_model
        (110, "alloc", 0x1000, 80 * MiB),
        (200, "segment_alloc", 0x9000000, 50 * MiB),  # profile_run transient
        (210, "alloc", 0x9000000, 40 * MiB),
        (220, "free_completed", 0x9000000, 40 * MiB),
        (230, "segment_free", 0x9000000, 50 * MiB),
        (300, "segment_alloc", 0xA000000, 10 * MiB),  # capture_model, never ends
    ]
    phases = [
        Phase("load_model", 90, 150, None, "vllm"),
        Phase("determine_available_memory", 190, 250, None, "vllm"),
        Phase("profile_run", 195, 240, 1, "vllm"),
        Phase("compile_or_warm_up_model", 290, None, None, "vllm"),
        Phase("capture_model", 295, None, 3, "vllm"),
    ]
    return make_trace(rows, phases)


def test_phase_path_joins_names_from_the_outermost():
    tr = startup()
    assert phase_path(tr, 2) == "determine_available_memory/profile_run"
    assert phase_path(tr, 4) == "compile_or_warm_up_model/capture_model"


def test_phase_at_returns_the_innermost_phase_or_none():
    tr = startup()
    assert phase_at(tr, 210).name == "profile_run"
    assert phase_at(tr, 245).name == "determine_available_memory"
    assert phase_at(tr, 170) is None
    assert phase_at(tr, 300).name == "capture_model"  # an open phase runs to the end


def test_phase_stats_start_end_peak_and_delta():
    stats = {s.path: s for s in phase_stats(*_with_curves(startup()))}
    load = stats["load_model"]
    assert (load.start_reserved_bytes, load.end_reserved_bytes, load.delta_reserved_bytes) == (0, 100 * MiB, 100 * MiB)
    assert (load.end_allocated_bytes, load.peak_allocated_bytes) == (80 * MiB, 80 * MiB)
    prof = stats["determine_available_memory/profile_run"]
    assert prof.depth == 1
    assert (prof.peak_reserved_bytes, prof.peak_reserved_us) == (150 * MiB, 200)
    assert prof.peak_allocated_bytes == 120 * MiB
    assert prof.delta_reserved_bytes == 0
    assert prof.peak_device_used_bytes is None


def test_a_phase_that_never_ended_runs_to_the_end_of_the_recording():
    cap = phase_stats(*_with_curves(startup()))[4]
    assert (cap.ended, cap.end_us, cap.end_reserved_bytes) == (False, 300, 110 * MiB)


def test_peak_equal_to_the_value_at_the_start_is_dated_at_the_start():
    stats = phase_stats(*_with_curves(startup()))
    assert (stats[0].peak_reserved_bytes, stats[0].peak_reserved_us) == (100 * MiB, 100)
    assert (stats[3].peak_reserved_bytes, stats[3].peak_reserved_us) == (110 * MiB, 300)


def _with_curves(trace):
    return trace, all_curves(trace)
