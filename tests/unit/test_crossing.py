"""The one definition of "the first crossing" (analysis/crossing.py) on the real traces: which curve is
named, the crossing's moment apart from the excursion's maximum, and nothing read after an OOM."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from memtrace.analysis.memory.crossing import crossings, excursion
from memtrace.analysis.memory.curves import Curve, all_curves
from memtrace.analysis.memory.oom import find_oom
from memtrace.analysis.memory.phases import recording_span
from memtrace.analysis.memory.target import resolve_target
from memtrace.store import load_run
from testdata import unpacked

DATA = Path(__file__).resolve().parents[1] / "data"
GiB = 1024**3


def _load(run: Path):
    trace = load_run(run).traces[0]
    return trace, all_curves(trace)


@pytest.fixture(scope="module")
def vllm():
    return _load(unpacked(DATA / "vllm-h200" / "startup"))


def test_vllm_at_88_gib_names_device_used_and_keeps_the_exact_reserved_crossing(vllm):
    """Defect 5: the report switched to "reserved crossed it … +40.52 GiB" (device used was +41.26)."""
    trace, curves = vllm
    c = crossings(trace, curves, 88 * GiB)
    assert c.first is c.device_used and c.second is c.reserved
    assert f"{c.device_used.overshoot_bytes / GiB:.2f}" == "41.26"
    assert f"{c.reserved.overshoot_bytes / GiB:.2f}" == "40.52"
    assert c.reserved.time_us <= c.device_used.time_us  # reserved is exact; device used is sampled after it


def test_vllm_recorded_target_crossing_and_maximum_are_separate_moments(vllm):
    trace, curves = vllm
    target = resolve_target(trace).target_bytes
    d = crossings(trace, curves, target).first
    start = recording_span(trace)[0]
    assert (round((d.time_us - start) / 1e6, 3), round((d.max_us - start) / 1e6, 3)) == (124.057, 124.618)
    assert d.at_cross_bytes == curves.device_used.at(d.time_us) > target
    assert d.max_bytes == curves.device_used.window(d.time_us, d.time_us + d.duration_us).peak_bytes
    assert d.until == "end" and d.phase_path == "kv_cache_init"


def test_without_nvml_samples_reserved_is_named(vllm):
    trace, curves = vllm
    bare = dataclasses.replace(curves, device_used=Curve(np.zeros(0, np.int64), np.zeros(0, np.int64)))
    c = crossings(trace, bare, 88 * GiB)
    assert c.device_used is None and c.first is c.reserved and c.second is None


def test_an_excursion_is_read_up_to_the_oom_only():
    trace, curves = _load(DATA / "h200" / "startup-cap6g")
    oom = find_oom(trace)
    target = resolve_target(trace).target_bytes
    whole = excursion(trace, curves.device_used, target, "device_used")
    cut = crossings(trace, curves, target, oom_us=oom.time_us).first
    assert whole.until == "end" and whole.duration_us > 4_000_000  # what the old callout claimed: 4.80 s
    assert cut.until == "oom" and cut.time_us + cut.duration_us == oom.time_us and cut.duration_us < 1_000
    assert cut.max_us <= oom.time_us


def test_no_target_no_crossings_and_a_target_above_everything_none(vllm):
    trace, curves = vllm
    assert crossings(trace, curves, None) is None
    c = crossings(trace, curves, 200 * GiB)
    assert c.first is None and c.second is None
