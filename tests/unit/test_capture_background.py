"""The background writer: drains converted off the traced thread, in order, and waited for where a
complete file is promised (flush, the OOM path, close, exit).

The allocator is FakeTorch (tests/capture_fakes.py: no CUDA here) replaying the real H200 start-up
tests/data/h200/startup-full as torch's ``_snapshot()`` dicts; the session, drains, conversion and
store are memtrace's real code.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from capture_fakes import session_with
from memtrace import facts as F
from memtrace.capture import allocator_history as H
from memtrace.capture import registry as R
from memtrace.capture import session as S
from memtrace.facts import OOM as FACT_OOM
from memtrace.importers import torch_snapshot as TS  # the conversion allocator_history looks up at each drain
from memtrace.store import load_trace, read_fact
from references import snapshot_dict

FULL = Path(__file__).parents[1] / "data" / "h200" / "startup-full" / "vm-pid457.memtrace"
PHASES = ("load_model", "profile_run", "kv_cache_init", "capture_model")


@pytest.fixture(scope="module")
def snap():
    return snapshot_dict(load_trace(FULL))


def _replay(s, fake, n_phases=len(PHASES)):
    share = len(fake.all_entries) // len(PHASES)
    for name in PHASES[:n_phases]:
        token = s.phase_enter(name, source="vllm")
        fake.allocate(share)
        s.phase_exit(token)


def _record(snap, path, monkeypatch, sync: str) -> object:
    monkeypatch.setenv("MEMTRACE_CAPTURE_SYNC", sync)
    s, fake = session_with(snap, path)
    _replay(s, fake)
    fake.allocate(len(fake.all_entries))  # the rest, drained by close
    s.close("startup-complete")
    S.wait_finishing()
    return load_trace(path), fake


def test_background_and_synchronous_capture_write_the_same_trace(snap, tmp_path, monkeypatch):
    bg, fake = _record(snap, tmp_path / "bg.memtrace", monkeypatch, "")
    sync, _ = _record(snap, tmp_path / "sync.memtrace", monkeypatch, "1")
    assert len(bg.events) == fake.recorded == 13_922 - 4_584  # the replayed entries less free_requested (skipped)
    assert np.array_equal(bg.events, sync.events)
    assert bg.frames == sync.frames and bg.stacks == sync.stacks
    assert [(x.address, x.total_bytes, len(x.blocks)) for x in bg.segments] == [
        (x.address, x.total_bytes, len(x.blocks)) for x in sync.segments
    ]
    assert bg.facts["capture"]["drains"]["converted_on"] == "background"
    assert sync.facts["capture"]["drains"]["converted_on"] == "traced thread"
    assert bg.recording.end_us and bg.recording.end_reason == "startup-complete"


def _slow_conversion(monkeypatch, seconds=0.3):
    real = TS.entries_to_events

    def slow(entries, intern):
        time.sleep(seconds)
        return real(entries, intern)

    monkeypatch.setattr(TS, "entries_to_events", slow)


def test_startup_complete_returns_at_once_and_exit_waits_for_the_file(snap, tmp_path, monkeypatch):
    monkeypatch.setenv("MEMTRACE_CAPTURE_SYNC", "")
    _slow_conversion(monkeypatch)
    path = tmp_path / "t.memtrace"
    s, fake = session_with(snap, path)
    fake.allocate(len(fake.all_entries))
    s.set_fact(F.VLLM_STARTUP_COMPLETE_US, 123)  # as the plugin does, right before stopping
    t0 = time.perf_counter()
    s.close("startup-complete")
    returned_s = time.perf_counter() - t0
    assert returned_s < 0.25  # the 0.3 s conversion runs in the background
    assert s in R._finishing
    assert read_fact(path, F.VLLM_STARTUP_COMPLETE_US) is None  # memtrace run must not read it yet
    S.wait_finishing()  # what atexit, multiprocessing's finalizers and SIGTERM call
    trace = load_trace(path)
    assert len(trace.events) == fake.recorded == 13_922 - 4_584 and trace.segments and trace.recording.end_us
    assert read_fact(path, F.VLLM_STARTUP_COMPLETE_US) == 123
    assert s not in R._finishing


def test_the_oom_path_writes_everything_before_it_returns(snap, tmp_path, monkeypatch):
    monkeypatch.setenv("MEMTRACE_CAPTURE_SYNC", "")
    path = tmp_path / "t.memtrace"
    s, fake = session_with(snap, path)
    _replay(s, fake, 2)
    _slow_conversion(monkeypatch)
    fake.allocate(500)
    s.on_oom(0, 60 << 20, 141 << 30, 27 << 20)  # torch raises right after this returns
    trace = load_trace(path)  # the file is still open (WAL): read what is on disk now
    assert len(trace.events) == fake.recorded
    assert trace.facts[FACT_OOM]["requested_bytes"] == 60 << 20 and trace.segments
    s.close("oom")


def test_a_failing_conversion_is_a_note_and_later_drains_are_kept(snap, tmp_path, monkeypatch):
    monkeypatch.setenv("MEMTRACE_CAPTURE_SYNC", "")
    monkeypatch.setattr(H, "BOUNDARY_MIN_PENDING", 2_000)  # each phase's ~3,480 entries drain at its end
    real, calls = TS.entries_to_events, []

    def fails_once(entries, intern):
        calls.append(len(entries))
        if len(calls) == 1:
            raise RuntimeError("conversion bug")
        return real(entries, intern)

    monkeypatch.setattr(TS, "entries_to_events", fails_once)
    path = tmp_path / "t.memtrace"
    s, fake = session_with(snap, path)
    _replay(s, fake)
    s.close("stop")
    trace = load_trace(path)
    assert any("background write failed" in n.text and "conversion bug" in n.text for n in trace.notes)
    assert len(trace.events) == fake.recorded - calls[0] > 0
    assert trace.recording.truncated  # the lost batch is never silent: the allocator counters disagree


def test_a_signal_handler_interrupting_a_session_method_does_not_deadlock(snap, tmp_path, monkeypatch):
    """SIGTERM's handler runs on the thread that may hold the session lock; the writer needs it."""
    import threading

    monkeypatch.setenv("MEMTRACE_CAPTURE_SYNC", "")
    _slow_conversion(monkeypatch, 0.2)
    path = tmp_path / "t.memtrace"
    s, fake = session_with(snap, path)
    _replay(s, fake)  # conversions queued on the background writer

    def interrupted_method():
        with s._lock:  # inside set_fact, say, when the signal arrives
            s.close("signal:SIGTERM")

    t = threading.Thread(target=interrupted_method)
    t.start()
    t.join(30)
    assert not t.is_alive(), "close() waited for a writer that needs the lock it holds"
    assert len(load_trace(path).events) == fake.recorded


def test_phase_boundaries_tell_the_sidecar_pytorchs_reserved_bytes(snap, tmp_path):
    """How the sidecar finds this process by memory where NVML lists host pids (a container)."""

    class SidecarStub:  # stands in for the sidecar process handle: records what it is told
        unavailable = None

        def __init__(self):
            self.hints = []

        def hint(self, reserved):
            self.hints.append(reserved)

        def stop(self):
            return {}

    s, fake = session_with(snap, tmp_path / "t.memtrace")
    s.sidecar = SidecarStub()
    fake.reserved = 3 << 30
    token = s.phase_enter("load_model")
    fake.reserved = 5 << 30
    s.phase_exit(token)
    s.close("stop")
    assert s.sidecar.hints == [3 << 30, 5 << 30]


def test_writes_asked_on_the_programs_thread_reach_the_file_in_order_once_waited_for(snap, tmp_path, monkeypatch):
    """Issue 42: facts, notes, phases, hook calls and VMM rows are written by the background writer (the program's
    thread does not wait for SQLite); indexes are handed out at once and match the rows, a phase ended by the close
    is written after it began, and what is asked after the close is dropped, never raised."""
    from memtrace.model import HookCall, empty_vmm

    monkeypatch.setenv("MEMTRACE_CAPTURE_SYNC", "")
    _slow_conversion(monkeypatch, 0.2)  # the writer is busy while the program goes on
    path = tmp_path / "t.memtrace"
    s, fake = session_with(snap, path)
    outer = s.phase_enter("load_model", source="vllm")
    fake.allocate(2_500)  # past the boundary threshold: the next boundary drains (a slow conversion queued)
    inner = s.phase_enter("profile_run", source="vllm")
    first = s.record_hook_call(HookCall("fi.workspace", 10, 20))
    second = s.record_hook_call(HookCall("fi.inner", 11, 19, parent=first))
    s.set_fact("a", 1)
    s.set_fact("a", 2)  # one write for both, with the later value
    s.add_note("info", "hello")
    rec = empty_vmm(1)
    rec["bytes"] = 2 << 20
    s.record_vmm(rec, [("vllm/kv.py", 7, "reserve")])
    s.phase_exit(inner)
    assert (first, second, inner, outer) == (0, 1, 1, 0)
    s.close("stop")  # load_model is still open: the close ends it
    assert s.record_hook_call(HookCall("late", 30, 31)) == -1
    trace = load_trace(path)
    assert [(p.name, p.parent) for p in trace.phases] == [("load_model", None), ("profile_run", 0)]
    assert all(p.end_us is not None for p in trace.phases)
    assert [(c.name, c.parent) for c in trace.hook_calls] == [("fi.workspace", None), ("fi.inner", 0)]
    assert trace.facts["a"] == 2 and any(n.text == "hello" for n in trace.notes)
    assert len(trace.vmm) == 1 and trace.vmm["bytes"][0] == 2 << 20
    assert [f.filename for f in trace.stack_frames(int(trace.vmm["stack"][0]))] == ["vllm/kv.py"]


def test_start_ups_completion_stays_in_the_file_once_a_flush_wrote_it(snap, tmp_path, monkeypatch):
    """Serving mode and --until exit flush the finished start-up (its completion fact with it) and go on recording: a
    fact set later must not write the facts back without it (memtrace run waits for it to print the summary)."""
    monkeypatch.setenv("MEMTRACE_CAPTURE_SYNC", "")
    path = tmp_path / "t.memtrace"
    s, fake = session_with(snap, path)
    s.set_fact(F.VLLM_STARTUP_COMPLETE_US, 123)
    s.wait_written()
    assert read_fact(path, F.VLLM_STARTUP_COMPLETE_US) is None  # not before the start-up is written
    s.flush()
    assert read_fact(path, F.VLLM_STARTUP_COMPLETE_US) == 123
    s.set_fact("serving", {"started_us": 1})
    s.wait_written()
    assert read_fact(path, F.VLLM_STARTUP_COMPLETE_US) == 123 and read_fact(path, "serving") == {"started_us": 1}
    s.close("stop")
