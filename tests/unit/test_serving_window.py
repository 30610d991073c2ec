"""The serving flight recorder on this CPU machine: the rings' bounds, the window's start state, its writes
(OOM, SIGUSR2, close) and its format, with a fake allocator history replaying a real H200 start-up
(FakeTorch: a serving OOM's history is only a GPU's to produce). Both ways of keeping the events: PyTorch's own
ring held (the default, ``MEMTRACE_SERVING_DRAIN_S=0``) and drains into memtrace's compact ring (``=5``)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from capture_fakes import session_with
from memtrace import facts as F
from memtrace.analysis.serving.serving import window_summary
from memtrace.capture import allocator_history as H
from memtrace.capture import registry as R
from memtrace.capture import serving, signals
from memtrace.capture import session as S
from memtrace.model import ACTION_CODE, SAMPLE_DTYPE, ServingWindow, Trace
from memtrace.store import load_trace, save_trace
from references import snapshot_dict
from serving_fakes import replayed_bytes

FULL = Path(__file__).parents[1] / "data" / "h200" / "startup-full" / "vm-pid457.memtrace"
PHASES = ("load_model", "profile_run", "kv_cache_init", "capture_model")


def _replay(s, fake_history, n_phases):
    share = len(fake_history.all_entries) // len(PHASES)
    for name in PHASES[:n_phases]:
        token = s.phase_enter(name, source="vllm")
        fake_history.allocate(share)
        s.phase_exit(token)


STARTUP_PHASES = 2  # load_model and profile_run are start-up; the rest of the entries are "serving"


@pytest.fixture(scope="module")
def snap():
    return snapshot_dict(load_trace(FULL))


def _state(entries) -> tuple[int, int]:
    a = sum(e["size"] for e in entries if e["action"] == "alloc") - sum(
        e["size"] for e in entries if e["action"] == "free_completed"
    )
    r = sum(e["size"] for e in entries if e["action"] in ("segment_alloc", "segment_map")) - sum(
        e["size"] for e in entries if e["action"] in ("segment_free", "segment_unmap")
    )
    return a, r


def _serving_session(snap, path, monkeypatch, ring_events: int, drain_s: str = "0"):
    monkeypatch.setenv(serving.EVENTS_ENV, str(ring_events))
    monkeypatch.setenv(serving.DRAIN_S_ENV, drain_s)
    monkeypatch.setenv(serving.SAMPLE_HZ_ENV, "0")
    monkeypatch.setenv(serving.SECONDS_ENV, "0")  # the replayed entries carry the H200 run's times
    monkeypatch.setattr(signals, "install_snapshot", lambda: True)
    s, fake_history = session_with(snap, path)
    _replay(s, fake_history, STARTUP_PHASES)
    startup = fake_history.all_entries[: fake_history.pos]
    s.history.current_bytes = replayed_bytes(fake_history)
    s.enter_serving()
    return s, fake_history, len(startup)


def _recorded(entries) -> list[dict]:
    """The entries torch records: it is told to skip ``free_requested`` (``skip_actions``), at start-up as in a ring."""
    return [e for e in entries if e["action"] != "free_requested"]


@pytest.mark.parametrize("held", [True, False], ids=["torch-ring", "memtrace-ring"])
def test_a_serving_oom_writes_the_startup_then_a_bounded_window_with_the_failed_request(
    snap, tmp_path, monkeypatch, held
):
    path = tmp_path / "serve.memtrace"
    monkeypatch.setattr(H, "TOP_LEVEL_MIN_INTERVAL_S", 0.0)  # the boundary below comes at once, not seconds later
    s, fake_history, n_startup = _serving_session(snap, path, monkeypatch, 1000, "0" if held else "5")
    assert s.history.held is held
    serving_entries = fake_history.all_entries[n_startup:]
    drains = s.history.drains
    fake_history.allocate(len(serving_entries))
    s.history.boundary(top_level=True)  # a phase boundary while serving
    assert (s.history.drains == drains) is held  # held: nothing drained (nor converted) until the write
    s.record_step({"time_us": S.now_us(), "duration_us": 5, "requests": 7, "tokens": 900})
    s.on_oom(0, 3 << 30, 80 << 30, 1 << 30)
    t = load_trace(path)
    w = t.window
    # the start-up part as at the end of warm-up, untouched by the window
    assert len(t.events) == len(_recorded(fake_history.all_entries[:n_startup]))
    assert w.reason == "oom" and w.writes == 1
    recorded = _recorded(serving_entries)
    assert w.events_kept == len(w.events) == 1000
    assert w.events_dropped == len(recorded) - 1000  # exact: every overwritten kind is one the counters count
    assert w.events["time_us"].tolist() == [e["time_us"] for e in recorded[-1000:]]
    assert w.start_us == int(w.events["time_us"][0]) and w.gap_us is not None
    assert t.facts[F.OOM]["requested_bytes"] == 3 << 30 and t.facts[F.OOM]["phase"] == "serving"
    assert w.steps == [{"time_us": w.steps[0]["time_us"], "duration_us": 5, "requests": 7, "tokens": 900}]
    # the window's start state, exactly: PyTorch's state just before its first kept event
    a, r = _state(fake_history.all_entries[:n_startup] + recorded[: w.events_dropped])
    assert w.start_state["allocated_bytes"] == a and w.start_state["reserved_bytes"] == r
    assert w.start_state["exact"] is True
    ws = window_summary(t)
    assert ws.oom.requested_bytes == 3 << 30
    assert sum(seg.requested_bytes for seg in w.segments) == ws.end_allocated_bytes
    assert ws.start_allocated_bytes == a
    assert w.bounds["max_age_s"] is None and w.bounds["events_in"] == ("torch" if held else "memtrace")
    steps_bytes = serving.DEFAULTS[serving.STEPS_ENV] * serving.STEP_BYTES
    assert w.bounds["ring_bytes_max"] == (0 if held else 1000 * 37) + steps_bytes
    assert w.bounds["torch_history_entries"] == (1000 if held else 200_000)
    # memtrace's own cost while serving, stated by the window: its span, sources and the allocations made
    assert w.cost["since_us"] == w.startup_end_us and w.cost["until_us"] >= w.cost["since_us"]
    assert w.cost["allocs"] == sum(e["action"] == "alloc" for e in serving_entries)
    assert ("drain.window" in w.cost["sources"]) and ("registration" not in w.cost["sources"])
    assert "drain.window" not in t.facts[F.SELF_COST]["sources"]  # start-up's cost stays start-up's
    assert ws.cost.span_us == w.cost["until_us"] - w.cost["since_us"] and ws.cost.allocs == w.cost["allocs"]
    s.close("exit")
    S.wait_finishing()
    assert load_trace(path).window.writes == 2  # the exit write replaced the OOM's, in the same file


def test_a_held_ring_that_never_filled_drops_nothing_and_its_window_has_no_gap(snap, tmp_path, monkeypatch):
    path = tmp_path / "short.memtrace"
    s, fake_history, n_startup = _serving_session(snap, path, monkeypatch, 100_000)
    fake_history.allocate(300)  # a free requested during start-up completes here: counters and ring differ by it
    assert s.write_window("signal:SIGUSR2")
    w = load_trace(path).window
    assert w.events_dropped == 0 and w.gap_us == 0  # no gap, whatever the counters say of that pending free
    assert w.events_kept == len(_recorded(fake_history.all_entries[n_startup : n_startup + 300]))
    a, r = _state(fake_history.all_entries[:n_startup])
    assert (w.start_state["allocated_bytes"], w.start_state["reserved_bytes"]) == (a, r)
    s.close("stop")
    S.wait_finishing()


def test_the_ring_keeps_the_last_n_events_and_counts_the_rest():
    ring = serving.Ring(np.dtype([("time_us", "<i8"), ("size", "<i8")]), max_count=5, max_age_us=None)
    for start in range(0, 12, 3):
        chunk = np.zeros(3, dtype=ring.dtype)
        chunk["time_us"] = np.arange(start, start + 3)
        ring.push(chunk)
    assert ring.count == 5 and ring.dropped == 7
    assert ring.records()["time_us"].tolist() == [7, 8, 9, 10, 11]


def test_the_ring_drops_records_older_than_its_age_bound():
    ring = serving.Ring(SAMPLE_DTYPE, max_count=1000, max_age_us=10)
    rows = np.zeros(30, dtype=SAMPLE_DTYPE)
    rows["time_us"] = np.arange(30)
    ring.push(rows)
    assert ring.records()["time_us"].tolist() == list(range(19, 30)) and ring.dropped == 19


def test_sigusr2_writes_the_window_and_the_process_goes_on(snap, tmp_path, monkeypatch):
    path = tmp_path / "usr2.memtrace"
    s, fake_history, _ = _serving_session(snap, path, monkeypatch, ring_events=50)
    monkeypatch.setattr(signals, "_previous", {})
    monkeypatch.setattr(R, "_active", s)  # the process's session, as memtrace.start registers it
    seen = []
    old = signal.signal(signal.SIGUSR2, lambda n, f: seen.append(n))  # the program's own handler
    try:
        signals._previous[signal.SIGUSR2] = signal.getsignal(signal.SIGUSR2)
        signal.signal(signal.SIGUSR2, signals._snapshot)  # what install_snapshot installs
        fake_history.allocate(200)
        os.kill(os.getpid(), signal.SIGUSR2)
        w = load_trace(path).window
        recorded = _recorded(fake_history.all_entries[fake_history.pos - 200 : fake_history.pos])
        assert w.reason == "signal:SIGUSR2" and w.events_kept == 50 and w.events_dropped == len(recorded) - 50
        assert seen == [signal.SIGUSR2]  # the handler installed before memtrace's was called
        fake_history.allocate(10)  # still recording
        assert s.write_window("again") and load_trace(path).window.writes == 2
    finally:
        signal.signal(signal.SIGUSR2, old)
        s.close("stop")
        S.wait_finishing()


def test_a_window_round_trips_through_the_store_and_an_old_trace_has_none(tmp_path):
    ev = np.zeros(2, dtype=load_trace(FULL).events.dtype)
    ev["action"] = [ACTION_CODE["alloc"], ACTION_CODE["alloc"]]
    ev["size"] = [10, 20]
    ev["stack"] = -1
    w = ServingWindow(startup_end_us=5, start_us=9, end_us=20, reason="exit", writes=1, events_kept=2,
                      events_dropped=4, start_state={"allocated_bytes": 1, "reserved_bytes": 2, "exact": True},
                      steps=[{"time_us": 10, "tokens": 3}], events=ev)  # fmt: skip
    save_trace(Trace(window=w), tmp_path / "w.memtrace")
    back = load_trace(tmp_path / "w.memtrace").window
    assert back.gap_us == 4 and back.events_dropped == 4 and back.steps == [{"time_us": 10, "tokens": 3}]
    assert np.array_equal(back.events, ev)
    assert load_trace(FULL).window is None
    assert window_summary(load_trace(tmp_path / "w.memtrace")).end_allocated_bytes == 31


def test_the_event_bound_defaults_to_start_ups_own_ring_when_held_and_to_a_million_when_drained():
    held, drained = serving.knobs({}), serving.knobs({serving.DRAIN_S_ENV: "5"})
    assert serving.held(held) and held[serving.EVENTS_ENV] == 200_000
    assert not serving.held(drained) and drained[serving.EVENTS_ENV] == serving.DRAINED_EVENTS == 1_000_000
    assert serving.knobs({serving.DRAIN_S_ENV: "5", serving.EVENTS_ENV: "7"})[serving.EVENTS_ENV] == 7
    assert serving.bounds(held, 200_000)["ring_bytes_max"] == 6000 * 32 + 10_000 * serving.STEP_BYTES  # no events


def test_bad_serving_knobs_are_one_clear_error():
    from memtrace.errors import UsageError

    with pytest.raises(UsageError, match="MEMTRACE_SERVING_EVENTS='0' must be at least 1"):
        serving.knobs({serving.EVENTS_ENV: "0"})
    with pytest.raises(UsageError, match="is not a number"):
        serving.knobs({serving.SECONDS_ENV: "ten"})


class FakeNVML:
    """A fake NVML (this CPU machine has none): the device's used memory is this process's 2 GiB + 615 MiB the
    driver keeps + another process's, which NVML's per-process list names (pid 4242) with this process."""

    OTHER_BYTES = 5 << 30
    RESERVE = 615 << 20
    TOTAL = 80 << 30

    class NVMLError(Exception):
        pass

    def __init__(self):
        self.others_bytes = self.OTHER_BYTES

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, i):
        return "handle"

    def nvmlDeviceGetMemoryInfo(self, h):
        class Mem:
            total = self.TOTAL + self.RESERVE
            used = (2 << 30) + self.RESERVE + self.others_bytes

        return Mem()

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        class Proc:
            def __init__(self, pid, used):
                self.pid, self.usedGpuMemory = pid, used

        return [Proc(os.getpid(), 2 << 30), Proc(4242, self.others_bytes)]


def test_the_serving_sampler_records_other_processes_beside_the_device_used(tmp_path, monkeypatch):
    nvml = FakeNVML()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    k = {**serving.DEFAULTS, serving.SAMPLE_HZ_ENV: 200.0}
    rec = serving.ServingRecorder(k, startup_end_us=S.now_us(), start_state={})
    notes = []
    rec.start_sampler(None, lambda *a: notes.append(a), cuda_total_bytes=FakeNVML.TOTAL, held_bytes=2 << 30)
    try:
        time.sleep(0.15)
        nvml.others_bytes = 6 << 30  # the other process grows while serving
        time.sleep(0.15)
    finally:
        rec.stop()
        rec._sampler.join()
    w = rec.window(now_us=S.now_us(), reason="exit", segments=[])
    assert notes == [] and len(w.samples) > 10 and len(w.others) == len(w.samples)
    assert np.array_equal(w.others["time_us"], w.samples["time_us"])  # read with each sample
    assert set(w.others["others_bytes"].tolist()) == {5 << 30, 6 << 30}
    assert w.others_how["others_method"] == "per-process" and w.others_how["traced_pids"][0] == os.getpid()
    # what the ring may hold counts the other processes' series too
    assert w.bounds["ring_bytes_max"] == serving.bounds(k, None)["ring_bytes_max"]
    assert (
        serving.bounds(k, None)["ring_bytes_max"]
        - serving.bounds({**k, serving.SAMPLE_HZ_ENV: 0}, None)["ring_bytes_max"]
        == w.bounds["max_samples"] * 32
    )
    save_trace(Trace(window=w), tmp_path / "w.memtrace")
    back = load_trace(tmp_path / "w.memtrace").window
    assert np.array_equal(back.others, w.others) and back.others_how == w.others_how


def test_a_format_1_4_window_loads_with_no_other_processes_series():
    from vllm034_data import Recorded

    w = load_trace(next(Recorded("vllm-h200-034-serving").run_dir("oom").glob("*.memtrace"))).window
    assert len(w.samples) == 149 and len(w.others) == 0 and w.others_how == {}


def test_an_oom_inside_a_scheduler_step_writes_the_window_with_that_step_in_progress(tmp_path, monkeypatch):
    from serving_fakes import STEP_AT_OOM, write_fake_serving

    w = write_fake_serving(tmp_path / "fake.memtrace", monkeypatch).window
    assert w.steps_in_progress == [{"time_us": w.steps_in_progress[0]["time_us"], **STEP_AT_OOM}]
    assert all(s["tokens"] != STEP_AT_OOM["tokens"] for s in w.steps)  # begun, never ended: not in the ended list
    ws = window_summary(load_trace(tmp_path / "fake.memtrace"))
    assert ws.step_at_oom == w.steps_in_progress[0]


class FakeSession:
    """A fake serving session (the step hook's only partner): what it is handed, in order."""

    def __init__(self):
        self.serving, self.calls = object(), []

    def begin_step(self, step):
        self.calls.append(("begin", step))
        return 7

    def record_step(self, step, token=None):
        self.calls.append(("end", step, token))


def test_the_step_hook_hands_a_step_over_when_it_begins_and_again_when_it_ends(monkeypatch):
    from memtrace.plugins import vllm_steps

    fake = FakeSession()
    monkeypatch.setattr(vllm_steps, "session", lambda: fake)
    times = iter([1_000, 1_250])
    monkeypatch.setattr(vllm_steps, "now_us", lambda: next(times))

    class Output:  # vLLM's SchedulerOutput, the fields the hook reads
        num_scheduled_tokens = {"a": 592, "b": 1}
        total_num_scheduled_tokens = 593

    hook = vllm_steps.StepHook()
    token = hook.before(None, (object(), Output()), {})
    assert fake.calls == [("begin", {"time_us": 1_000, "requests": 2, "max_request_tokens": 592, "tokens": 593})]
    hook.after(token, None, MemoryError())
    step = {"time_us": 1_000, "duration_us": 250, "requests": 2, "max_request_tokens": 592, "tokens": 593}
    assert fake.calls[1] == ("end", {**step, "error": "MemoryError"}, 7)


def test_the_window_states_memtraces_cost_while_serving_with_pytorchs_recording_priced_at_its_depth():
    from memtrace.analysis.analysed.self_cost import serving_cost
    from memtrace.plots import cost_text

    ev = np.zeros(3, dtype=load_trace(FULL).events.dtype)
    ev["action"] = [ACTION_CODE["alloc"], ACTION_CODE["free_completed"], ACTION_CODE["alloc"]]
    ev["stack"] = [0, -1, 1]  # stacks of 30 and 50 frames: 40 on average, 14 beyond the calibration's depth
    frames = [("f.py", 1, "f")]
    cost = {"since_us": 0, "until_us": 2_000_000, "allocs": 1000, "total_ns": 4_000_000,
            "memtrace_threads_ns": 16_000_000, "sources": {"drain.window": {"ns": 4_000_000, "calls": 1}}}  # fmt: skip
    calibration = {"measured": True, "per_alloc_ns": 1000.0, "per_frame_ns": 10.0, "depth": 26}
    t = Trace(
        window=ServingWindow(start_us=0, end_us=2_000_000, events=ev, cost=cost),
        stacks=[frames * 30, frames * 50],
        facts={F.SELF_COST: {"history": calibration}},
    )
    c = serving_cost(t)
    assert c.history_ns == 1000 * (1000 + 10 * 14)  # every counted allocation, the kept ones' mean depth
    assert c.total_ns == 4_000_000 + 1_140_000 and c.share == pytest.approx(5_140_000 / 2e9)
    assert c.share_with_own_threads == pytest.approx(21_140_000 / 2e9)
    assert [s.name for s in c.sources] == ["drain.window", "history (PyTorch, estimated)"]  # largest first
    assert cost_text.serving(c) == (
        "memtrace while serving: 5.1 ms on vLLM's threads in the 2.00 s since serving began (0.26 %), and 16.0 ms "
        "on memtrace's own threads, which hold the GIL while they run (1.06 % with them); by source (calls): "
        "drain.window 4.0 ms (1), history (PyTorch, estimated) 1.1 ms (1,000)"
    )
    assert serving_cost(Trace(window=ServingWindow())) is None  # a window before format 1.6 states none


def test_serving_can_keep_no_stacks_while_start_up_keeps_its_own(snap, tmp_path, monkeypatch):
    monkeypatch.setenv(serving.STACKS_ENV, "none")  # PyTorch's cheapest recording, for serving only
    s, fake_history, n_startup = _serving_session(snap, tmp_path / "nostacks.memtrace", monkeypatch, 100_000)
    fake_history.allocate(400)
    assert s.write_window("signal:SIGUSR2")
    t = load_trace(s.path)
    allocs = t.window.events[t.window.events["action"] == ACTION_CODE["alloc"]]
    assert len(allocs) and (allocs["stack"] == -1).all()  # the window's allocations: no stack recorded
    assert (t.events["stack"][t.events["action"] == ACTION_CODE["alloc"]] >= 0).all()  # start-up's kept theirs
    assert t.window.bounds["stacks"] == "none" and t.recording.stacks == "python"
    s.close("stop")
    S.wait_finishing()


def test_a_bad_serving_stacks_value_is_one_clear_error(tmp_path, capsys):
    from memtrace.errors import UsageError

    with pytest.raises(UsageError, match="MEMTRACE_SERVING_STACKS='some': give one of none, python, all"):
        serving.serving_stacks("python", {serving.STACKS_ENV: "some"})
    assert (
        serving.serving_stacks("python", {}) == "python"
        and serving.serving_stacks("python", {serving.STACKS_ENV: "none"}) == "none"
    )


def test_serving_with_other_stacks_than_start_ups_calibration_leaves_pytorchs_recording_unpriced():
    from memtrace.analysis.analysed.self_cost import serving_cost

    cost = {"since_us": 0, "until_us": 1_000_000, "allocs": 1000, "total_ns": 1_000_000, "sources": {}}
    calibration = {"measured": True, "per_alloc_ns": 1000.0, "per_frame_ns": 10.0, "depth": 26}
    for stacks, priced in (("python", True), ("none", False)):  # the calibration was taken with python stacks
        t = Trace(window=ServingWindow(start_us=0, end_us=1, cost=cost, bounds={"stacks": stacks}),
                  facts={F.SELF_COST: {"history": calibration}})  # fmt: skip
        assert (serving_cost(t).history_ns is not None) is priced
