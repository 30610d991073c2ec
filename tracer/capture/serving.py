"""The serving flight recorder (``MEMTRACE_UNTIL=serving``): bounded rings kept after start-up.

Once vLLM's start-up is written (as ``MEMTRACE_UNTIL=startup`` writes it), the allocator's events are kept in a
ring bounded by count (``MEMTRACE_SERVING_EVENTS``) and age (``MEMTRACE_SERVING_SECONDS``). By default
(``MEMTRACE_SERVING_DRAIN_S=0``) that ring is PyTorch's own history (``AllocatorHistory.hold``): nothing is
drained or converted while vLLM serves, and a write reads the whole ring (:meth:`ServingRecorder.hold_events`);
with ``MEMTRACE_SERVING_DRAIN_S=N`` PyTorch's history is drained every N s into memtrace's compact ring here (37 B
an event instead of PyTorch's entry with its stack, at the price of converting every event while serving).
NVML samples (taken here at ``MEMTRACE_SERVING_SAMPLE_HZ``, the start-up sidecar stopped: the whole device's used
memory and, from NVML's per-process list, the other processes' memory, as the sidecar samples them) and vLLM's
scheduler steps (``MEMTRACE_SERVING_STEPS``) go into rings of their own. :meth:`ServingRecorder.window` turns the
rings into the trace's :class:`~memtrace.model.ServingWindow`, with what was dropped counted, PyTorch's state at
the window's first kept event, and memtrace's own cost since serving began (``ServingWindow.cost``). The bytes
the rings may hold are computed from the knobs (:func:`bounds`) and stated in the trace, with the allocation stacks
kept while serving (``MEMTRACE_SERVING_STACKS``, :func:`serving_stacks`: "none" is PyTorch's cheapest recording).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
from memtrace.errors import UsageError
from memtrace.model import (
    ACTION_CODE,
    EVENT_DTYPE,
    OTHERS_DTYPE,
    SAMPLE_DTYPE,
    ServingWindow,
    empty_events,
    empty_others,
    empty_samples,
)

log = logging.getLogger("memtrace")

EVENTS_ENV = "MEMTRACE_SERVING_EVENTS"
SECONDS_ENV = "MEMTRACE_SERVING_SECONDS"
SAMPLE_HZ_ENV = "MEMTRACE_SERVING_SAMPLE_HZ"
STEPS_ENV = "MEMTRACE_SERVING_STEPS"
DRAIN_S_ENV = "MEMTRACE_SERVING_DRAIN_S"
#: The allocation stacks kept while serving ("none", "python", "all"); unset: as start-up's (``MEMTRACE_STACKS``).
STACKS_ENV = "MEMTRACE_SERVING_STACKS"
STACKS = ("none", "python", "all")

#: Defaults: the last 200,000 allocator events held in PyTorch's own ring (no drains while serving:
#: ``DRAIN_S_ENV`` 0; as many entries as start-up's own ring, so PyTorch holds no more memory for serving than it
#: held during start-up), at most 10 minutes of them, NVML at 10 Hz, the last 10,000 scheduler steps.
DEFAULTS: dict[str, float] = {
    EVENTS_ENV: 200_000,
    SECONDS_ENV: 600.0,
    SAMPLE_HZ_ENV: 10.0,
    STEPS_ENV: 10_000,
    DRAIN_S_ENV: 0.0,
}
#: The events kept by default when drains fill memtrace's compact ring instead (37 B an event: 37 MB).
DRAINED_EVENTS = 1_000_000
#: The self-cost source of the serving NVML sampler (its own thread: ``selfcost.mark_own_thread``).
SAMPLER = "serving.nvml"
#: What one kept step costs at most (a small dict of ints: measured with sys.getsizeof, rounded up).
STEP_BYTES = 640
_DELTAS = {  # action -> (allocated sign, reserved sign)
    ACTION_CODE["alloc"]: (1, 0),
    ACTION_CODE["free_completed"]: (-1, 0),
    ACTION_CODE["segment_alloc"]: (0, 1),
    ACTION_CODE["segment_free"]: (0, -1),
    ACTION_CODE["segment_map"]: (0, 1),
    ACTION_CODE["segment_unmap"]: (0, -1),
}


def knobs(environ: dict[str, str] | None = None) -> dict[str, float]:
    """The serving knobs from the environment (defaults for unset ones); UsageError for a bad value."""
    environ = os.environ if environ is None else environ
    out: dict[str, float] = {}
    for name, default in DEFAULTS.items():
        text = environ.get(name, "").strip()
        if not text:
            out[name] = default
            continue
        try:
            value = float(text)
        except ValueError:
            raise UsageError(f"{name}={text!r} is not a number") from None
        if value < 0 or (name == EVENTS_ENV and value < 1):
            raise UsageError(f"{name}={text!r} must be {'at least 1' if name == EVENTS_ENV else '0 or more'}")
        out[name] = value
    if out[DRAIN_S_ENV] and not environ.get(EVENTS_ENV, "").strip():
        out[EVENTS_ENV] = DRAINED_EVENTS
    return out


def serving_stacks(startup: str, environ: dict[str, str] | None = None) -> str:
    """The stacks kept while serving: ``MEMTRACE_SERVING_STACKS``, or start-up's (``startup``) when unset;
    UsageError for a bad value."""
    environ = os.environ if environ is None else environ
    text = environ.get(STACKS_ENV, "").strip()
    if not text:
        return startup
    if text not in STACKS:
        raise UsageError(f"{STACKS_ENV}={text!r}: give one of {', '.join(STACKS)}")
    return text


def held(k: dict[str, float]) -> bool:
    """Whether the allocator's events stay in PyTorch's own ring while serving (no drains: the default)."""
    return not k[DRAIN_S_ENV]


def bounds(k: dict[str, float], torch_entries: int | None, stacks: str = "python") -> dict[str, Any]:
    """The rings' limits and the most bytes they may hold (events and samples are packed numpy records, each NVML
    sample with its other processes' one). Held (:func:`held`), the events are PyTorch's ring of ``max_events``
    entries, in PyTorch's memory (its bytes per entry are PyTorch's, not measured by memtrace); else memtrace's
    ring holds them, and PyTorch's own ring of ``torch_entries`` is stated beside it."""
    events = int(k[EVENTS_ENV])
    samples = int(k[SAMPLE_HZ_ENV] * k[SECONDS_ENV]) if k[SECONDS_ENV] else int(k[SAMPLE_HZ_ENV] * 3600)
    steps = int(k[STEPS_ENV])
    sample_bytes = SAMPLE_DTYPE.itemsize + OTHERS_DTYPE.itemsize
    in_torch = held(k)
    ring_bytes = (0 if in_torch else events * EVENT_DTYPE.itemsize) + samples * sample_bytes + steps * STEP_BYTES
    return {
        "max_events": events,
        "max_age_s": k[SECONDS_ENV] or None,
        "sample_hz": k[SAMPLE_HZ_ENV],
        "max_samples": samples,
        "max_steps": steps,
        "drain_s": k[DRAIN_S_ENV],
        "events_in": "torch" if in_torch else "memtrace",
        "event_bytes": EVENT_DTYPE.itemsize,
        "ring_bytes_max": ring_bytes,
        "torch_history_entries": events if in_torch else torch_entries,
        "stacks": stacks,
    }


class Ring:
    """Packed records (numpy chunks) kept by count and by age; the records pushed out are counted and
    handed to ``on_drop`` (the state carried forward over them)."""

    def __init__(self, dtype: np.dtype, max_count: int, max_age_us: int | None, on_drop: Callable | None = None):
        self.dtype = dtype
        self.max_count = int(max_count)
        self.max_age_us = max_age_us
        self.on_drop = on_drop
        self.chunks: deque[np.ndarray] = deque()
        self.count = 0
        self.dropped = 0

    def push(self, records: np.ndarray) -> None:
        if len(records):
            self.chunks.append(np.ascontiguousarray(records, dtype=self.dtype))
            self.count += len(records)
        self.trim()

    def trim(self, now_us: int | None = None) -> None:
        """Drop the oldest records past the count, and those older than ``max_age_us`` before the newest
        record (or before ``now_us``)."""
        while self.count > self.max_count:
            self._drop_front(self.count - self.max_count)
        if self.max_age_us and self.chunks:
            newest = int(self.chunks[-1]["time_us"][-1]) if now_us is None else now_us
            limit = newest - self.max_age_us
            while self.chunks and int(self.chunks[0]["time_us"][0]) < limit:
                front = self.chunks[0]
                self._drop_front(int(np.searchsorted(front["time_us"], limit, side="left")) or len(front))

    def _drop_front(self, n: int) -> None:
        front = self.chunks[0]
        n = min(n, len(front))
        gone, rest = front[:n], front[n:]
        if rest.size:
            self.chunks[0] = rest
        else:
            self.chunks.popleft()
        self.count -= n
        self.dropped += n
        if self.on_drop is not None:
            self.on_drop(gone)

    def records(self) -> np.ndarray:
        if not self.chunks:
            return np.zeros(0, dtype=self.dtype)
        return np.concatenate(list(self.chunks))


class ServingRecorder:
    """The rings of one session after start-up, and what they make of a serving window."""

    def __init__(
        self,
        k: dict[str, float],
        *,
        startup_end_us: int,
        start_state: dict[str, Any],
        torch_entries=None,
        stacks: str = "python",
    ):
        self.knobs = k
        self.startup_end_us = int(startup_end_us)
        self.begun_us = self.startup_end_us
        age = int(k[SECONDS_ENV] * 1e6) if k[SECONDS_ENV] else None
        self.max_age_us = age
        self.bounds = bounds(k, torch_entries, stacks)
        #: PyTorch's held ring as the last drain read it (:meth:`hold_events`): its events, how many it overwrote
        #: (None: not counted), PyTorch's bytes at that read
        self.held: tuple[np.ndarray, int | None, dict[str, int] | None] | None = None
        #: memtrace's own cost from serving's start to a given write time (``serving_session.cost_since``), for
        #: ``ServingWindow.cost``; None: not stated (set by ``serving_session.enter``)
        self.cost_of: Callable[[int], dict[str, Any]] | None = None
        self.lock = threading.Lock()
        self.events = Ring(EVENT_DTYPE, self.bounds["max_events"], age, self._carry)
        self.samples = Ring(SAMPLE_DTYPE, self.bounds["max_samples"], age)
        self.others = Ring(OTHERS_DTYPE, self.bounds["max_samples"], age)
        self._others: Any = None  # processes.Others of the sampler: how other processes were told apart
        self.steps: deque[dict[str, Any]] = deque()
        self.steps_dropped = 0
        self.running: dict[int, dict[str, Any]] = {}  # steps begun and not ended, by begin_step's token
        self._tokens = 0
        self.state = dict(start_state)  # PyTorch's state at the first kept event (carried forward)
        self.writes = 0
        self._sampler: threading.Thread | None = None
        self._stop = threading.Event()

    # -- feeding -------------------------------------------------------------------------------
    def add_events(self, events: np.ndarray) -> None:
        with self.lock:
            self.events.push(events)

    def hold_events(self, events: np.ndarray, overwritten: int | None, current: dict[str, int] | None) -> None:
        """PyTorch's held ring, read whole at a drain: its ``events``, how many allocations, completed frees and
        segment changes it ``overwritten`` since serving began (the allocator's counters less those kept; None:
        unreadable), PyTorch's ``current`` bytes just before it was read (None: unreadable)."""
        with self.lock:
            self.held = (events, overwritten, current)

    def add_samples(self, samples: np.ndarray, others: np.ndarray | None = None) -> None:
        """NVML samples of the whole device's used memory, and the other processes' memory read with them."""
        with self.lock:
            self.samples.push(samples)
            if others is not None:
                self.others.push(others)

    def begin_step(self, step: dict[str, Any]) -> int:
        """A vLLM scheduler step begins (``time_us``, ``requests``, ``tokens``...): in progress until
        :meth:`add_step` is given the token returned here, so that a window written meanwhile (an OOM's, inside
        the step that failed) names it."""
        with self.lock:
            self._tokens += 1
            self.running[self._tokens] = step
            return self._tokens

    def add_step(self, step: dict[str, Any], token: int | None = None) -> None:
        """One vLLM scheduler step ended (``time_us``, ``duration_us``, ``requests``, ``tokens``...); ``token``:
        :meth:`begin_step`'s, no longer in progress."""
        with self.lock:
            self.running.pop(token, None)
            self.steps.append(step)
            limit, age = self.bounds["max_steps"], self.bounds["max_age_s"]
            while len(self.steps) > limit or (
                age and self.steps and step["time_us"] - self.steps[0]["time_us"] > age * 1e6
            ):
                self.steps.popleft()
                self.steps_dropped += 1

    def _carry(self, gone: np.ndarray) -> None:
        """Events leave the ring: the window's start state moves past them."""
        if "allocated_bytes" not in self.state:
            return
        for code, (a, r) in _DELTAS.items():
            size = int(gone["size"][gone["action"] == code].sum())
            self.state["allocated_bytes"] += a * size
            self.state["reserved_bytes"] += r * size

    # -- NVML ----------------------------------------------------------------------------------
    def start_sampler(
        self,
        uuid: str | None,
        add_note: Callable[[str, str], None],
        *,
        cuda_total_bytes: int | None = None,
        held_bytes: int | None = None,
    ) -> None:
        """Sample NVML's used memory of the device, and the other processes' memory on it (``processes.Others``:
        this process told apart by its pid, or by ``held_bytes``, what it holds, inside a container), at the
        serving rate on a thread (no CUDA context). ``cuda_total_bytes`` (CUDA's total) gives the driver's
        reserve NVML counts as used."""
        hz = self.knobs[SAMPLE_HZ_ENV]
        if hz <= 0:
            return
        try:
            import pynvml
            from memtrace.capture.processes import Others

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid) if uuid else pynvml.nvmlDeviceGetHandleByIndex(0)
            total = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
        except Exception as exc:  # noqa: BLE001 - no NVML (a CPU worker, no driver): said once
            add_note("warning", f"no NVML samples in the serving window: {exc}")
            return
        reserve = max(total - cuda_total_bytes, 0) if cuda_total_bytes else 0
        others = self._others = Others(pynvml, handle, os.getpid(), reserve, held_bytes)
        self._sampler = threading.Thread(
            target=self._sample, args=(pynvml, handle, hz, others), name="memtrace-serving-nvml"
        )
        self._sampler.daemon = True
        self._sampler.start()

    def _sample(self, pynvml: Any, handle: Any, hz: float, others: Any) -> None:
        from memtrace.capture import selfcost

        selfcost.mark_own_thread()
        period = 1.0 / hz
        while not self._stop.wait(period):
            with selfcost.region(SAMPLER):
                if not self._sample_once(pynvml, handle, others):
                    return

    def _sample_once(self, pynvml: Any, handle: Any, others: Any) -> bool:
        """One NVML sample into the rings; False when NVML stopped answering (said in the log)."""
        try:
            used = int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
        except Exception as exc:  # noqa: BLE001 - stop sampling, say why in the log
            log.warning("memtrace: serving NVML sampler stopped: %s", exc)
            return False
        now = time.time_ns() // 1000
        row = np.zeros(1, dtype=SAMPLE_DTYPE)
        row["time_us"], row["used_bytes"] = now, used
        value = others.sample(used)  # NVML's per-process list (~49 µs on the H200); None: not told apart
        other = None
        if value is not None:
            other = np.zeros(1, dtype=OTHERS_DTYPE)
            other["time_us"], other["others_bytes"] = now, value
        self.add_samples(row, other)
        return True

    def stop(self) -> None:
        self._stop.set()

    # -- the window ----------------------------------------------------------------------------
    def window(self, *, now_us: int, reason: str, segments: list) -> ServingWindow:
        """The serving window as it stands: the rings' records, what they dropped, the start state."""
        with self.lock:
            self.events.trim(now_us)
            self.samples.trim(now_us)
            self.others.trim(now_us)
            self.writes += 1
            if self.held is not None:
                events, events_dropped, state = self._held_window(now_us)
            else:
                events = self.events.records() if self.events.count else empty_events()
                events_dropped, state = self.events.dropped, dict(self.state)
            samples = self.samples.records() if self.samples.count else empty_samples()
            others = self.others.records() if self.others.count else empty_others()
            steps = list(self.steps)
            running = [dict(s) for s in self.running.values()]
            starts = [int(a["time_us"][0]) for a in (events, samples) if len(a)]
            starts += [int(steps[0]["time_us"])] if steps else []
            dropped = events_dropped or self.samples.dropped or self.steps_dropped
            start = min(starts) if starts else (now_us if dropped else self.begun_us)
            return ServingWindow(
                startup_end_us=self.startup_end_us,
                start_us=start if dropped else min(start, self.begun_us),
                end_us=int(now_us),
                reason=reason,
                writes=self.writes,
                events_kept=int(len(events)),
                events_dropped=events_dropped,
                samples_kept=int(len(samples)),
                samples_dropped=self.samples.dropped,
                steps_kept=len(steps),
                steps_dropped=self.steps_dropped,
                bounds=dict(self.bounds),
                start_state=state,
                steps=steps,
                steps_in_progress=running,
                events=events,
                samples=samples,
                others=others,
                others_how=self._others.stats() if self._others is not None else {},
                segments=list(segments),
                cost=self.cost_of(int(now_us)) if self.cost_of is not None else {},
            )

    def _held_window(self, now_us: int) -> tuple[np.ndarray, int, dict[str, Any]]:
        """The held ring's events within the age bound, how many were dropped (overwritten by PyTorch's ring: the
        counted kinds, at least one once it is full; or older than the bound) and PyTorch's state at the first
        kept one: its bytes at the read less the kept events' changes (exact: nothing is carried over the dropped
        ones)."""
        events, overwritten, current = self.held
        kept = events
        if self.max_age_us and len(events):
            kept = events[events["time_us"] >= int(now_us) - self.max_age_us]
        dropped = 0
        if len(events) >= self.bounds["max_events"]:  # full: the oldest were overwritten
            dropped = max(overwritten or 0, 1)
        dropped += len(events) - len(kept)
        if current is None:
            return (
                kept,
                dropped,
                {"allocated_bytes": 0, "reserved_bytes": 0, "exact": False, "source": "counters unreadable"},
            )
        state = {"allocated_bytes": int(current["allocated_bytes"]), "reserved_bytes": int(current["reserved_bytes"])}
        for code, (a, r) in _DELTAS.items():
            size = int(kept["size"][kept["action"] == code].sum())
            state["allocated_bytes"] -= a * size
            state["reserved_bytes"] -= r * size
        return kept, dropped, {**state, "exact": True, "source": "torch's counters at the write less the kept events"}
