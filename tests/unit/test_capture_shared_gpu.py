"""A shared GPU: another process's memory is not this process's non-PyTorch memory (issue 11, item 2).

The trace here is CONSTRUCTED from a real one: tests/data/h200/startup-full (recorded on the H200
alone) gets a 128 GiB other-process series, as the NVML sidecar records it from the per-process list,
and device-used samples that include those 128 GiB, as NVML's device-wide figure would. Everything
else (events, phases, facts) is the real recording. The analysis must give the same answers as on
the real trace: non-PyTorch at the real figure, the device-used crossing where it really was (not in
init_device), fits not REFUSED at init_device.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from capacity_model import fit
from memtrace.analysis.capacity import fits as fits_mod
from memtrace.analysis.memory.curves import all_curves
from memtrace.model import FORMAT_VERSION, OTHERS_DTYPE
from memtrace.store import load_trace, save_trace
from references import summarize

FULL = Path(__file__).parents[1] / "data" / "h200" / "startup-full" / "vm-pid457.memtrace"
OTHER = 128 << 30  # what the other process held in the H200 run of issue 11


def _shared(trace, others_bytes: int = OTHER, series: bool = True):
    """The real trace as it would have been recorded with another process holding ``others_bytes``."""
    shared = dataclasses.replace(trace, samples=trace.samples.copy(), facts=dict(trace.facts))
    shared.samples["used_bytes"] += others_bytes
    s = trace.samples["time_us"]
    t = np.arange(s[0], s[-1] + 1, 10_000, dtype=np.int64)  # the sidecar reads the list every 10 ms
    shared.others = np.zeros(len(t) if series else 0, dtype=OTHERS_DTYPE)
    shared.others["time_us"], shared.others["others_bytes"] = (t, others_bytes) if series else ([], [])
    return shared


@pytest.fixture(scope="module")
def real():
    return load_trace(FULL)


def test_the_shipped_trace_is_format_1_0_and_loads_with_no_other_processes(real):
    assert len(real.samples) > 0 and len(real.others) == 0 and real.others.dtype == OTHERS_DTYPE


def test_non_pytorch_memory_stays_at_the_real_figure(real):
    base, shared = summarize(real), summarize(_shared(real))
    assert base.peak.non_torch_bytes == 801_964_032  # the real figure (0.75 GiB)
    assert shared.peak.non_torch_bytes == base.peak.non_torch_bytes
    assert shared.non_kv == base.non_kv  # the one non-KV figure (fits shows it too)
    c = all_curves(_shared(real))
    assert np.array_equal(c.non_torch.bytes, all_curves(real).non_torch.bytes)
    assert set(c.others.bytes.tolist()) == {OTHER}


def test_the_device_used_crossing_is_where_it_really_was_not_in_init_device(real):
    crossing = {c.curve: c for c in summarize(_shared(real)).crossing_list}["device_used"]
    real_crossing = {c.curve: c for c in summarize(real).crossing_list}["device_used"]
    assert crossing.phase_path == real_crossing.phase_path == "compile_or_warm_up/kernel_warmup"
    assert (crossing.time_us, crossing.max_bytes) == (real_crossing.time_us, real_crossing.max_bytes)
    # the test can fail: without the other-processes series the device-wide figure crosses at once
    unattributed = {c.curve: c for c in summarize(_shared(real, series=False)).crossing_list}["device_used"]
    assert unattributed.phase_path == "init_device"


def test_fits_is_not_refused_at_init_device(real):
    cap = real.facts["capacity_bytes"]
    shared = fit(_shared(real), cap)
    assert shared.outcome == fit(real, cap).outcome != fits_mod.REFUSED
    assert shared.non_torch_bytes == fit(real, cap).non_torch_bytes
    # the test can fail: the device-wide figure (as before format 1.1) answers otherwise
    assert fit(_shared(real, series=False), cap).outcome != shared.outcome


def test_the_other_processes_series_survives_the_file_format(real, tmp_path):
    shared = _shared(real)
    back = load_trace(save_trace(shared, tmp_path / "shared.memtrace"))
    assert FORMAT_VERSION >= (1, 1)  # 1.2 added device_alloc_chunks (CUPTI)
    assert np.array_equal(back.others, shared.others) and np.array_equal(back.samples, shared.samples)
    assert summarize(back).peak.non_torch_bytes == summarize(real).peak.non_torch_bytes
