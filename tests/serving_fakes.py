"""A serving trace with an OOM an hour into serving, on this CPU machine (the one named ``fake`` in the tests).

memtrace's real Session, serving recorder and store write it; only the allocator is FakeTorch
(``capture_fakes``), replaying a real H200 start-up's history (``tests/data/h200/startup-full``): its first
two phases' entries are start-up, the rest are "serving", moved :data:`GAP_S` later (the hour in which the
ring drops what it cannot keep). The session's clock is the replay's (:class:`ReplayClock`: 1 ms after the
last replayed entry), so phases, the window's edges and the OOM fall where the entries say.
"""

from __future__ import annotations

from pathlib import Path

from capture_fakes import session_with
from memtrace.capture import serving, serving_session, signals
from memtrace.capture import session as S
from memtrace.model import Trace
from memtrace.store import load_trace
from references import snapshot_dict

FULL = Path(__file__).parent / "data" / "h200" / "startup-full" / "vm-pid457.memtrace"
STARTUP = ("load_model", "profile_run")
GAP_S = 3600
#: the OOM's failed request and the device's free memory then (torch's OOM observer's figures)
REQUESTED_BYTES = 3 << 30
FREE_BYTES = 1 << 30
TOTAL_BYTES = 80 << 30
STEP = {"duration_us": 5_000, "requests": 7, "tokens": 900}
#: the scheduler step in progress when the OOM happens (begun, never ended: the OOM is raised inside it)
STEP_AT_OOM = {"requests": 8, "tokens": 5489}


class ReplayClock:
    """Unix-epoch microseconds 1 ms after the last entry the fake allocator replayed (before the first: 1 ms
    before it)."""

    def __init__(self, fake) -> None:
        self.fake = fake

    def __call__(self) -> int:
        entries = self.fake.all_entries
        if self.fake.pos == 0:
            return int(entries[0]["time_us"]) - 1000
        return int(entries[self.fake.pos - 1]["time_us"]) + 1000


def _state(entries) -> tuple[int, int]:
    a = sum(e["size"] for e in entries if e["action"] == "alloc")
    a -= sum(e["size"] for e in entries if e["action"] == "free_completed")
    r = sum(e["size"] for e in entries if e["action"] in ("segment_alloc", "segment_map"))
    r -= sum(e["size"] for e in entries if e["action"] in ("segment_free", "segment_unmap"))
    return a, r


def replayed_bytes(fake):
    """torch's counters as FakeTorch has replayed so far (``AllocatorHistory.current_bytes``): the window's start
    state, and the bytes at a held ring's read."""

    def current() -> dict[str, int]:
        a, r = _state(fake.all_entries[: fake.pos])
        return {"allocated_bytes": a, "reserved_bytes": r}

    return current


def write_fake_serving(path: Path, monkeypatch, ring_events: int = 3000) -> Trace:
    """Record the fake serving OOM into ``path`` (closed at exit after the OOM's write) and load it."""
    snap = snapshot_dict(load_trace(FULL))
    entries = [dict(e) for e in snap["device_traces"][0]]
    n_startup = len(entries) // 4 * len(STARTUP)  # as the phases share the entries in test_serving_window
    for e in entries[n_startup:]:
        e["time_us"] = int(e["time_us"]) + GAP_S * 1_000_000
    snap["device_traces"] = [entries]
    monkeypatch.setenv(serving.EVENTS_ENV, str(ring_events))
    monkeypatch.setenv(serving.SAMPLE_HZ_ENV, "0")
    monkeypatch.setenv(serving.SECONDS_ENV, "0")
    monkeypatch.setattr(signals, "install_snapshot", lambda: True)
    s, fake = session_with(snap, path)
    clock = ReplayClock(fake)
    monkeypatch.setattr(S, "now_us", clock)
    monkeypatch.setattr(serving_session, "now_us", clock)
    share = n_startup // len(STARTUP)
    for name in STARTUP:
        token = s.phase_enter(name, source="vllm")
        fake.allocate(share)
        s.phase_exit(token)
    s.history.current_bytes = replayed_bytes(fake)
    s.enter_serving()
    fake.allocate(len(entries) - n_startup)
    s.record_step({"time_us": clock(), **STEP})
    s.begin_step({"time_us": clock(), **STEP_AT_OOM})
    s.on_oom(0, REQUESTED_BYTES, TOTAL_BYTES, FREE_BYTES)
    s.close("exit")
    S.wait_finishing()
    return load_trace(path)
