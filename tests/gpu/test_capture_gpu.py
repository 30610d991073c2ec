"""Capture on a real GPU: exact peaks, lossless drains, NVML sees raw cudaMalloc, OOM and signal traces."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import textwrap
import time

import memtrace
import numpy as np
import pytest
from memtrace.analysis.memory.curves import all_curves
from memtrace.model import ACTION_CODE
from memtrace.store import load_run, load_trace

pytestmark = pytest.mark.gpu

GiB = 1 << 30


@pytest.fixture
def torch_cuda():
    import torch

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    yield torch
    torch.cuda.set_per_process_memory_fraction(1.0)
    torch.cuda.empty_cache()


def _workload(torch, n: int = 400) -> None:
    keep = []
    rng = np.random.default_rng(0)
    for i in range(n):
        size = int(rng.integers(1 << 10, 64 << 20))
        keep.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
        if i % 3 == 0:
            keep.pop(0)
        if i % 50 == 0:
            torch.empty(int(2.5 * GiB), dtype=torch.uint8, device="cuda")  # transient segment
    del keep


def test_allocator_peak_equals_max_memory_reserved(tmp_path, torch_cuda):
    torch = torch_cuda
    with memtrace.trace(tmp_path) as session:
        with memtrace.phase("work"):
            _workload(torch)
        expected_peak = torch.cuda.max_memory_reserved()
        expected_now = torch.cuda.memory_reserved()
    trace = load_trace(session.path)
    curve = all_curves(trace).reserved
    assert not trace.recording.truncated
    assert curve.peak_bytes == expected_peak
    assert curve.bytes[-1] == expected_now
    print(f"\npeak {curve.peak_bytes} == max_memory_reserved {expected_peak}; {len(trace.events)} events")


def _alloc_counts(trace) -> tuple[int, int]:
    action = trace.events["action"]
    return int(np.count_nonzero(action == ACTION_CODE["alloc"])), int(
        np.count_nonzero(action == ACTION_CODE["free_completed"])
    )


def test_drains_at_phase_boundaries_lose_no_event(tmp_path, torch_cuda):
    torch = torch_cuda
    before = torch.cuda.memory_stats()
    # 120k entries through a 40k buffer (60,000 allocations and frees; free_requested is not recorded): each phase
    # adds 10k and a boundary drains at 20k, never past the watchdog's trigger (over half the buffer), so only the
    # allocating thread drains (at a 20k buffer the watchdog joins in and, draining from another thread, lost 4 of
    # 60,000 allocs on the H200: reported, but that is the other test)
    with memtrace.trace(tmp_path, max_entries=40_000) as session:
        for i in range(12):
            with memtrace.phase(f"step{i}"):
                for _ in range(5_000):
                    torch.empty(4096, device="cuda")
    after = torch.cuda.memory_stats()
    trace = load_trace(session.path)
    allocs, frees = _alloc_counts(trace)
    print(f"\n{allocs} allocs in {trace.recording.drains} drains; {trace.facts['capture']['drains']}")
    assert allocs == after["allocation.all.allocated"] - before["allocation.all.allocated"]
    assert frees == after["allocation.all.freed"] - before["allocation.all.freed"]
    assert not trace.recording.truncated
    assert trace.facts["capture"]["drains"]["by_reason"].get("watchdog", 0) == 0


def test_watchdog_drains_never_lose_events_silently(tmp_path, torch_cuda):
    torch = torch_cuda
    before = torch.cuda.memory_stats()
    with memtrace.trace(tmp_path, max_entries=100_000) as session:
        for _ in range(60_000):  # 120k entries, no phase boundary: only the watchdog thread drains
            torch.empty(4096, device="cuda")
    after = torch.cuda.memory_stats()
    trace = load_trace(session.path)
    allocs, _ = _alloc_counts(trace)
    missing = after["allocation.all.allocated"] - before["allocation.all.allocated"] - allocs
    drains = trace.facts["capture"]["drains"]
    print(
        f"\nwatchdog: {missing} of {allocs + missing} allocs lost, reported {trace.recording.lost_events_min}; {drains}"
    )
    assert drains["by_reason"].get("watchdog", 0) >= 1
    assert missing == 0 or (trace.recording.truncated and trace.recording.lost_events_min >= missing)


def test_a_wrapped_history_is_reported_as_truncated(tmp_path, torch_cuda):
    torch = torch_cuda
    with memtrace.trace(tmp_path, max_entries=1000, sidecar=False) as session:
        with memtrace.phase("burst"):
            session.history._stop.set()  # no watchdog: the ring buffer must wrap
            for _ in range(2000):
                torch.empty(4096, device="cuda")
            session.history._stop.clear()
    trace = load_trace(session.path)
    assert trace.recording.truncated
    assert trace.recording.lost_events_min > 0
    assert any("missing" in n.text or "wrapped" in n.text for n in trace.notes)


def _raw_malloc():
    """cudaMalloc/cudaFree outside PyTorch: libcudart through ctypes, else CuPy's runtime."""
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue

        def malloc(size, lib=lib):
            ptr = ctypes.c_void_p()
            assert lib.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(size)) == 0
            return ptr

        def free(ptr, lib=lib):
            assert lib.cudaFree(ptr) == 0

        return malloc, free
    import cupy

    return cupy.cuda.runtime.malloc, cupy.cuda.runtime.free


def test_sidecar_sees_a_raw_2gib_cudamalloc_held_2ms_as_non_torch(tmp_path, torch_cuda):
    torch = torch_cuda
    torch.zeros(1, device="cuda")  # the context exists before the sidecar's first sample
    malloc, free = _raw_malloc()
    windows = []
    with memtrace.trace(tmp_path) as session:
        for _ in range(20):
            time.sleep(0.02)
            t0 = time.time_ns() // 1000  # the allocation exists from cudaMalloc's call to cudaFree's return
            ptr = malloc(2 * GiB)
            held = time.time_ns() // 1000
            while time.time_ns() // 1000 - held < 2000:
                pass
            free(ptr)
            t1 = time.time_ns() // 1000
            windows.append((t0, t1))
    trace = load_trace(session.path)
    curve = all_curves(trace).non_torch
    assert len(curve) > 0, "no NVML samples"
    quiet = int(np.median(curve.bytes))
    hits = 0
    for t0, t1 in windows:
        inside = curve.bytes[(curve.time_us >= t0) & (curve.time_us <= t1)]
        if len(inside) and int(inside.max()) - quiet >= 0.95 * 2 * GiB:
            hits += 1
    info = trace.facts.get("sidecar", {})
    print(f"\nraw 2 GiB cudaMalloc held 2 ms seen as non-torch in {hits}/20; sidecar {info}")
    for t0, t1 in windows:  # what the sidecar saw around a missed window
        near = (curve.time_us >= t0 - 3000) & (curve.time_us <= t1 + 3000)
        if not np.any((curve.bytes[near] - quiet) >= 0.95 * 2 * GiB):
            print("missed", t0, t1, list(zip(curve.time_us[near] - t0, (curve.bytes[near] - quiet) >> 20, strict=True)))
    assert hits == 20


def test_sidecar_is_not_a_cuda_process(tmp_path, torch_cuda):
    import pynvml

    torch = torch_cuda
    torch.zeros(1, device="cuda")
    with memtrace.trace(tmp_path) as session:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByUUID(session.facts["env"]["gpu_uuid"])
        pids = {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
        sidecar_pid = session.sidecar.info["pid"]
    print(f"\ncompute processes {sorted(pids)}; us {os.getpid()}; sidecar {sidecar_pid}")
    assert sidecar_pid not in pids


@pytest.mark.parametrize("capacity_gib", [16] * 5 + [32] * 5)
def test_forced_oom_leaves_a_complete_trace(tmp_path, torch_cuda, capacity_gib):
    torch = torch_cuda
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(capacity_gib * GiB / total)
    session = memtrace.start(tmp_path, sidecar=False)
    held = []
    try:
        with memtrace.phase("fill"), pytest.raises(torch.OutOfMemoryError):
            while True:
                held.append(torch.empty(GiB, dtype=torch.uint8, device="cuda"))
        on_disk = load_trace(session.path)  # what the observer wrote before the error propagated
    finally:
        del held
        memtrace.stop()
    oom = on_disk.facts["oom"]
    assert oom["phase"] == "fill"
    assert oom["requested_bytes"] == GiB
    assert oom["device_total_bytes"] > 0
    assert np.count_nonzero(on_disk.events["action"] == ACTION_CODE["oom"]) == 1
    assert on_disk.segments, "segments saved at the OOM"
    assert on_disk.recording.end_reason == "oom"
    assert all_curves(on_disk).reserved.peak_bytes >= (capacity_gib - 2) * GiB


@pytest.mark.parametrize("drain_s", ["0", "5"], ids=["torch-ring", "memtrace-ring"])
def test_a_serving_window_on_a_real_allocator_counts_what_its_ring_dropped_exactly(
    tmp_path, torch_cuda, monkeypatch, drain_s
):
    torch = torch_cuda
    monkeypatch.setenv("MEMTRACE_SERVING_EVENTS", "3000")
    monkeypatch.setenv("MEMTRACE_SERVING_DRAIN_S", drain_s)
    monkeypatch.setenv("MEMTRACE_SERVING_SAMPLE_HZ", "0")
    session = memtrace.start(tmp_path, sidecar=False)
    try:
        keep = [torch.empty(1 << 20, dtype=torch.uint8, device="cuda") for _ in range(10)]
        session.enter_serving()
        assert session.history.held is (drain_s == "0")
        assert session.history.skipped == ["free_requested"]  # the GPU image's torch takes skip_actions
        s0 = torch.cuda.memory_stats()
        rng = np.random.default_rng(1)
        for i in range(2500):  # ~5,000 to 7,500 entries: the 3,000-entry ring overwrites the oldest
            x = torch.empty(int(rng.integers(512, 8 << 20)), dtype=torch.uint8, device="cuda")
            keep.append(x) if i % 7 == 0 else None
            if i % 500 == 499:
                del keep[10:]
                torch.cuda.empty_cache()  # segments released while serving
        del x
        s1 = torch.cuda.memory_stats()
        assert session.write_window("test")
        w = load_trace(session.path).window
    finally:
        memtrace.stop()
    d = {k: s1[k] - s0[k] for k in s0 if k.endswith(".all.allocated") or k.endswith(".all.freed")}
    counted = sum(d[k] for k in ("allocation.all.allocated", "allocation.all.freed", "segment.all.allocated",
                                 "segment.all.freed"))  # fmt: skip
    kinds = [ACTION_CODE[a] for a in ("alloc", "free_completed", "segment_alloc", "segment_free")]
    kept = int(np.isin(w.events["action"], kinds).sum())
    assert w.events_kept == len(w.events) == 3000
    assert np.count_nonzero(w.events["action"] == ACTION_CODE["free_requested"]) == 0  # not recorded (skip_actions)
    if drain_s == "0":  # torch's ring: the counters count what it overwrote
        assert w.events_dropped == counted - kept
    else:  # memtrace's ring drops whole events, each one the counters count
        assert w.events_dropped == counted - 3000
    # the start state plus the kept events is torch's own state at the write, to the byte
    a = w.start_state["allocated_bytes"]
    a += int(w.events["size"][w.events["action"] == ACTION_CODE["alloc"]].sum())
    a -= int(w.events["size"][w.events["action"] == ACTION_CODE["free_completed"]].sum())
    assert w.start_state["exact"] and a == s1["requested_bytes.all.current"]
    assert w.cost["allocs"] == d["allocation.all.allocated"]


def test_a_serving_oom_writes_the_held_ring_before_torch_raises(tmp_path, torch_cuda, monkeypatch):
    torch = torch_cuda
    total = torch.cuda.get_device_properties(0).total_memory
    monkeypatch.setenv("MEMTRACE_SERVING_EVENTS", "500")
    monkeypatch.setenv("MEMTRACE_SERVING_SAMPLE_HZ", "0")
    session = memtrace.start(tmp_path, sidecar=False)
    held = []
    try:
        session.enter_serving()
        torch.cuda.set_per_process_memory_fraction(16 * GiB / total)
        for _ in range(400):  # serving's churn: more than the 500-entry ring keeps
            x = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
            del x
        with pytest.raises(torch.OutOfMemoryError):
            while True:
                held.append(torch.empty(GiB, dtype=torch.uint8, device="cuda"))
        on_disk = load_trace(session.path)  # what the observer wrote before the error propagated
        stats = torch.cuda.memory_stats()
    finally:
        del held
        memtrace.stop()
    w = on_disk.window
    assert w.reason == "oom" and on_disk.facts["oom"]["requested_bytes"] == GiB
    assert on_disk.facts["oom"]["phase"] == "serving"
    assert w.events_kept == 500 and w.events_dropped > 0 and w.gap_us is not None
    # the kept events end with the fills: the last one allocated is the last 1 GiB block that fit
    allocs = w.events[w.events["action"] == ACTION_CODE["alloc"]]
    assert int(allocs["size"][-1]) == GiB
    assert sum(s.requested_bytes for s in w.segments) == stats["requested_bytes.all.current"]


CHILD = textwrap.dedent(
    """
    import sys, time, torch, memtrace
    session = memtrace.start(sys.argv[1])
    with memtrace.phase("work"):
        keep = [torch.empty(64 << 20, dtype=torch.uint8, device="cuda") for _ in range(8)]
        session.flush()
        print("ready", flush=True)
        time.sleep(60)
    """
)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_signalled_traced_process_leaves_a_readable_trace(tmp_path, sig):
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    time.sleep(0.3)
    child.send_signal(sig)
    child.wait(timeout=30)
    assert child.returncode == -sig
    time.sleep(1.0)  # the sidecar notices its parent is gone and flushes
    run = load_run(tmp_path)
    trace = run.traces[0]
    assert [p.name for p in trace.phases] == ["work"]
    assert np.count_nonzero(trace.events["action"] == ACTION_CODE["alloc"]) >= 8
    assert len(trace.samples) > 0
    sidecar_pid = trace.facts["sidecar"]["pid"]
    assert not os.path.exists(f"/proc/{sidecar_pid}") or "zombie" in open(f"/proc/{sidecar_pid}/status").read()
    if sig == signal.SIGTERM:
        assert trace.recording.end_reason == "signal:SIGTERM"
        assert trace.segments
    else:
        assert trace.phases[0].end_us is None


def test_phases_land_in_the_allocator_annotations(tmp_path, torch_cuda):
    torch = torch_cuda
    with memtrace.trace(tmp_path) as session:
        with memtrace.phase("outer"):
            torch.empty(1 << 20, device="cuda")
    notes = list(session.history.annotations)  # the END is drained at stop
    names = {(a["name"], a["stage"]) for a in notes}
    print(f"\nannotations {notes}; capture {load_trace(session.path).facts.get('capture')}")
    assert ("memtrace:outer", "START") in names and ("memtrace:outer", "END") in names
    trace = load_trace(session.path)
    start = next(a["time_us"] for a in notes if a["stage"] == "START")
    assert abs(start - trace.phases[0].start_us) < 1_000


def test_startup_complete_is_finished_in_the_background_losslessly(tmp_path, torch_cuda):
    from memtrace.capture import session as S

    torch = torch_cuda
    before = torch.cuda.memory_stats()
    session = memtrace.start(tmp_path, max_entries=40_000)
    for i in range(6):
        with memtrace.phase(f"step{i}"):
            keep = [torch.empty(4096 * (j % 7 + 1), device="cuda") for j in range(5_000)]
            del keep
    t0 = time.perf_counter()
    memtrace.stop("startup-complete")
    returned_s = time.perf_counter() - t0
    after = torch.cuda.memory_stats()
    S.wait_finishing()
    trace = load_trace(session.path)
    allocs, frees = _alloc_counts(trace)
    print(f"\nstop returned in {returned_s * 1e3:.1f} ms; capture {trace.facts['capture']}")
    assert allocs == after["allocation.all.allocated"] - before["allocation.all.allocated"]
    assert frees == after["allocation.all.freed"] - before["allocation.all.freed"]
    assert trace.facts["capture"]["drains"]["converted_on"] == "background"
    assert trace.recording.end_us and trace.segments and not trace.recording.truncated


def test_another_process_memory_is_attributed_to_others():
    """tests/gpu/check_shared_gpu.py: a child holds 16 GiB; the trace shows it as others'."""
    script = os.path.join(os.path.dirname(__file__), "check_shared_gpu.py")
    out = subprocess.run([sys.executable, script, "--hold-gib", "16"], capture_output=True, text=True, timeout=300)
    print(out.stdout, out.stderr[-2000:])
    assert out.returncode == 0 and "PASS" in out.stdout


def test_the_history_calibration_measures_a_cost_and_leaves_the_allocator_as_it_was(tmp_path, torch_cuda):
    """The self-cost fact's history part on a real GPU: measured and positive, the allocator's reserved
    bytes the same after start() as before it, and an estimate for the trace's allocations."""
    from memtrace import facts as F
    from memtrace.analysis.analysed.self_cost import HISTORY, self_cost

    torch = torch_cuda
    reserved = torch.cuda.memory_reserved()
    session = memtrace.start(tmp_path / "t.memtrace", sample_hz=0)
    assert torch.cuda.memory_reserved() == reserved  # the calibration's block was given back
    with memtrace.phase("work"):
        _workload(torch)
    memtrace.stop()
    trace = load_trace(session.path)
    history = trace.facts[F.SELF_COST]["history"]
    assert history["measured"] is True, history
    assert history["per_alloc_ns"] > 0, history
    cost = self_cost(trace)
    assert cost.history_ns > 0
    assert {"start", "calibration", "phases", HISTORY} <= {s.name for s in cost.sources}
    print(history, cost.sources)
