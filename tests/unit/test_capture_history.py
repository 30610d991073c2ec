"""Allocator-history draining and loss detection, against FakeAllocator (no CUDA here).

FakeAllocator imitates the parts of ``torch.cuda`` that capture/allocator_history.py uses: a ring buffer of
``max_entries`` trace entries (oldest dropped), ``clear_history``, ``_snapshot()`` and the cumulative
counters of ``memory_stats``. The GPU tests (tests/gpu) run the same code against the real allocator.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import types

import numpy as np
from memtrace.capture import allocator_history as H
from memtrace.importers.torch_snapshot import Interner, entries_to_events
from memtrace.model import ACTION_CODE


class FakeAllocator:
    def __init__(self):
        self.entries, self.max, self.t = [], 10**9, 1_000
        # torch.cuda.memory_stats()' cumulative counters, by torch's names
        self.stats = dict.fromkeys(
            ("allocation.all.allocated", "allocation.all.freed", "segment.all.allocated", "segment.all.freed"), 0
        )
        self.frames = [{"filename": "model.py", "line": 7, "name": "forward"}]

    def record(self, enabled="all", context="all", stacks="python", max_entries=10**9, clear_history=False, **kw):
        self.max = max_entries
        if clear_history:
            self.entries = []

    def _ev(self, action, size):
        self.t += 1
        self.entries.append(
            {"action": action, "addr": 4096, "size": size, "stream": 0, "time_us": self.t, "frames": self.frames}
        )
        del self.entries[: max(0, len(self.entries) - self.max)]

    def alloc_free(self, size=512):
        self._ev("alloc", size)
        self.stats["allocation.all.allocated"] += 1
        self._ev("free_requested", size)
        self._ev("free_completed", size)
        self.stats["allocation.all.freed"] += 1

    def snapshot(self):
        return {"device_traces": [list(self.entries)], "segments": [], "external_annotations": []}

    def torch(self):
        memory = types.SimpleNamespace(_record_memory_history=self.record, _snapshot=self.snapshot)
        cuda = types.SimpleNamespace(
            memory=memory, is_initialized=lambda: True, memory_stats=lambda d: dict(self.stats)
        )
        prof = types.SimpleNamespace(record_function=lambda name: contextlib.nullcontext())
        return types.SimpleNamespace(cuda=cuda, _C=types.SimpleNamespace(), profiler=prof)


class SkippingAllocator(FakeAllocator):
    """A torch whose ``_record_memory_history`` takes ``skip_actions`` (2.13's does) and records none of those."""

    def __init__(self):
        super().__init__()
        self.skip: tuple[str, ...] = ()

    def record(self, enabled="all", context="all", stacks="python", max_entries=10**9, clear_history=False,
               skip_actions=None, **kw):  # fmt: skip
        self.skip = tuple(skip_actions or ())
        super().record(enabled, context, stacks, max_entries, clear_history)

    def _ev(self, action, size):
        if action not in self.skip:
            super()._ev(action, size)


def _calls(fake) -> list[dict]:
    """The keyword arguments of each ``_record_memory_history`` call (the fake's signature kept)."""
    calls, real = [], fake.record

    @functools.wraps(real)
    def record(**kwargs):
        calls.append(kwargs)
        return real(**kwargs)

    fake.record = record
    return calls


def _history(fake, max_entries):
    batches, notes, interner = [], [], Interner()
    h = H.AllocatorHistory(
        device=0,
        stacks="python",
        max_entries=max_entries,
        intern_stack=interner,
        on_batch=batches.append,
        add_note=lambda level, text: notes.append(text),
        lock=threading.RLock(),
        torch_module=fake.torch(),
    )
    h.enable()
    return h, batches, notes


def test_drained_batches_hold_every_event_once():
    fake = FakeAllocator()
    h, batches, notes = _history(fake, 100)
    for _ in range(3):
        for _ in range(20):
            fake.alloc_free()
        h.drain("phase")
    h.stop()
    events = np.concatenate(batches)
    assert len(events) == 180 and np.all(np.diff(events["time_us"]) == 1)
    assert not h.truncated and notes == [] and h.drains == 4


def test_a_wrapped_ring_buffer_is_reported_with_a_lower_bound_of_lost_events():
    fake = FakeAllocator()
    h, batches, notes = _history(fake, 100)
    for _ in range(50):  # 150 entries into a 100-entry buffer
        fake.alloc_free()
    h.stop()
    assert h.truncated
    assert h.lost_min >= 16  # 50 allocs counted by the allocator, 34 in the kept entries
    assert any("wrapped" in n for n in notes) and any("missing" in n for n in notes)


def test_phase_boundaries_drain_when_enough_is_pending():
    fake = FakeAllocator()
    h, batches, _ = _history(fake, 100_000)
    for _ in range(H.BOUNDARY_MIN_PENDING):
        fake.alloc_free()
    h.boundary(top_level=False)
    assert h.drains == 1 and len(batches[0]) == 3 * H.BOUNDARY_MIN_PENDING
    fake.alloc_free()
    h.boundary(top_level=True)  # a top-level boundary right after a drain waits
    assert h.drains == 1


def test_conversion_interns_shared_and_equal_stacks_once_and_skips_unknown_actions():
    shared = [{"filename": "a.py", "line": 3, "name": "g"}, {"filename": "b.py", "line": 9, "name": "h"}]
    entries = [
        {"action": "segment_alloc", "addr": 1 << 40, "size": 2 << 20, "stream": 0, "time_us": 5, "frames": shared},
        {"action": "alloc", "addr": 1 << 40, "size": 512, "stream": 0, "time_us": 6, "frames": shared},
        {"action": "from_the_future", "addr": 0, "size": 0, "time_us": 7},
        {
            "action": "free_completed",
            "addr": 1 << 40,
            "size": 512,
            "stream": 7,
            "time_us": 8,
            "frames": [dict(f) for f in shared],
        },
        {"action": "oom", "device_free": 123, "size": 1 << 30, "stream": 0, "time_us": 9, "frames": []},
    ]
    interner = Interner()
    events = entries_to_events(entries, interner)
    assert events["action"].tolist() == [ACTION_CODE[x] for x in ("segment_alloc", "alloc", "free_completed", "oom")]
    assert events["stack"].tolist() == [0, 0, 0, -1]  # equal contents, other list object: same stack
    assert interner.frames == [("a.py", 3, "g"), ("b.py", 9, "h")]
    assert events["stream"].tolist() == [0, 0, 7, 0] and events["addr"][-1] == 123


def test_a_frame_line_outside_int64_is_stored_as_minus_one_and_the_trace_still_loads(tmp_path):
    # seen on an H200 inside vLLM: a frame line that did not fit SQLite's INTEGER broke a drain
    from memtrace.store import TraceWriter, load_trace

    entries = [
        {
            "action": "alloc",
            "addr": 1,
            "size": 8,
            "time_us": 1,
            "frames": [{"filename": "x.py", "line": 1 << 64, "name": "f"}],
        }
    ]
    with TraceWriter(tmp_path / "t.memtrace") as writer:
        writer.append_events(entries_to_events(entries, writer.intern_stack))
    trace = load_trace(tmp_path / "t.memtrace")
    assert trace.stack_frames(int(trace.events["stack"][0]))[0].line == -1


def test_stacks_are_recorded_for_allocations_only():
    """context="alloc": nothing reads a free's stack, and gathering one per free doubled the cost."""
    calls = []
    fake = FakeAllocator()
    real = fake.record

    def record(**kwargs):
        calls.append(kwargs)
        return real(**kwargs)

    fake.record = record
    h, _, _ = _history(fake, 100)
    h.stop()
    assert calls[0]["context"] == "alloc" and calls[0]["stacks"] == "python"
    assert calls[-1]["enabled"] is None


def test_the_watchdog_polls_at_most_every_half_second_while_quiet_and_every_20ms_in_a_burst():
    """Each poll holds the GIL ~90 us (issue 42: 6,647 polls were 614 ms of a 178 s start-up): while nothing is
    allocated it sleeps the longest, and the faster the ring fills the sooner it looks again."""
    assert H.watch_period(100_000, 0.0) == H.WATCH_PERIOD_MAX_S == 0.5
    assert H.watch_period(100_000, 20_000.0) == 0.5  # 5 s of room at 20k entries/s: a quarter of it, capped
    assert H.watch_period(100_000, 100_000.0) == 0.25  # 1 s of room: a quarter
    assert H.watch_period(100_000, 1_000_000.0) == 0.025  # 0.1 s of room: a quarter
    assert H.watch_period(1_000, 1_000_000.0) == H.WATCH_PERIOD_S == 0.02  # the ring nearly half full: the floor
    assert H.watch_period(-5, 10.0) == 0.02


def test_the_watchdog_drains_a_burst_that_comes_after_a_quiet_spell():
    """A burst past half the ring, started while the watchdog sleeps its longest, is drained before it wraps:
    every event arrives once."""
    fake = FakeAllocator()
    h, batches, notes = _history(fake, 1_000)
    h.start_watchdog()
    try:
        threading.Event().wait(0.35)  # quiet: the watchdog's period grows to its longest
        for _ in range(200):  # 600 entries: past half the ring (500), short of wrapping it
            fake.alloc_free()
        deadline = threading.Event()
        for _ in range(50):
            if batches:
                break
            deadline.wait(0.02)
    finally:
        h._stop.set()
        h._thread.join(5)
    assert batches, "the watchdog did not drain a ring past half full"
    h.stop()
    events = np.concatenate(batches)
    assert len(events) == 600 and np.all(np.diff(events["time_us"]) == 1)  # every entry once, none lost
    assert not h.truncated and notes == []


def test_startup_recording_skips_free_requested_where_torch_can_and_loses_nothing():
    """Issue 42: a third of the entries, each ~2.1 us of ``_snapshot()``, that nothing reads. Plain start-up recording
    (not serving's held ring) skips them; the counters' check counts no free_requested, so none is "lost"."""
    fake = SkippingAllocator()
    calls = _calls(fake)
    h, batches, notes = _history(fake, 100)
    for _ in range(3):
        for _ in range(20):
            fake.alloc_free()
        h.drain("phase")
    h.stop()
    assert not h.held and calls[0]["skip_actions"] == ["free_requested"]
    assert all(c["skip_actions"] == ["free_requested"] for c in calls if c["enabled"] is not None)
    events = np.concatenate(batches)
    assert len(events) == 120 and not np.any(events["action"] == ACTION_CODE["free_requested"])
    assert np.count_nonzero(events["action"] == ACTION_CODE["free_completed"]) == 60
    assert not h.truncated and h.lost_min == 0 and notes == []
    assert h.capture_fact([])["skipped_actions"] == ["free_requested"]


def test_a_torch_without_skip_actions_records_free_requested_and_the_trace_says_none_was_skipped():
    fake = FakeAllocator()  # its _record_memory_history has no skip_actions parameter
    calls = _calls(fake)
    h, batches, notes = _history(fake, 100)
    for _ in range(20):
        fake.alloc_free()
    h.stop()
    assert all("skip_actions" not in c for c in calls)
    events = np.concatenate(batches)
    assert np.count_nonzero(events["action"] == ACTION_CODE["free_requested"]) == 20 and len(events) == 60
    assert not h.truncated and notes == []
    assert h.capture_fact([])["skipped_actions"] == []


def test_with_free_requested_skipped_a_free_is_one_pending_entry():
    """The drains' estimate of what waits in the ring counts a free once when its request is not recorded: 18,000
    entries (9,000 allocations and frees) do not drain at a boundary; counted twice they would (27,000)."""
    fake = SkippingAllocator()
    h, batches, _ = _history(fake, 100_000)
    for _ in range(H.BOUNDARY_MIN_PENDING // 2 - 1_000):
        fake.alloc_free()
    h.boundary(top_level=False)
    assert h.drains == 0
    for _ in range(1_000):
        fake.alloc_free()
    h.boundary(top_level=False)
    assert h.drains == 1 and len(batches[0]) == H.BOUNDARY_MIN_PENDING
