"""Record PyTorch's caching-allocator history and drain it into the trace without losing events.

``torch.cuda.memory._record_memory_history`` keeps the last ``max_entries`` events in a ring
buffer (with the stacks of allocations only: ``context="alloc"``). A drain takes ``_snapshot()``, converts this device's new ``device_traces`` entries with
:func:`memtrace.importers.torch_snapshot.entries_to_events`, hands them to the session, and
re-enables recording with ``clear_history=True`` so the next snapshot holds only newer entries.

Drains happen at phase boundaries (when 20,000 entries are pending, or at a top-level boundary at
most every 5 s), on flush/stop/OOM, and
from a watchdog thread that reads the allocator's cumulative counters every 20 ms and drains when
the estimated undrained entries pass half of ``max_entries`` (or every 30 s, to bound what a
SIGKILL loses). The snapshot and the clear run back to back with the GIL switch interval raised, so
no other Python thread allocates between them.

Loss is never silent: a batch of exactly ``max_entries`` entries means the ring buffer wrapped, and
the allocator's own counters (``allocation.all.allocated``, ``segment.all.allocated`` ...) read
before each snapshot must not exceed what was recorded. Either sets ``recording.truncated`` with
``lost_events_min`` and a note.

Serving mode's flight recorder (:meth:`AllocatorHistory.hold`) turns this around: PyTorch's ring *is* the
ring. The watchdog and the boundary drains stop, ``max_entries`` becomes the serving window's event bound, and
nothing is converted while vLLM serves; a drain then only reads the ring (no clear) and hands all of it, with
PyTorch's bytes read just before, to ``on_ring``. Entries the ring overwrote are the window's dropped ones, not a
loss: the allocations, completed frees and segment changes among them are counted exactly from the allocator's
counters.

Neither mode records ``free_requested`` entries where torch can skip them (torch's ``skip_actions``): a third of the
entries, which no analysis reads (every curve, holder and check frees a block at its ``free_completed``; the
memory-viz export puts one back before each free), and each adds to ``_snapshot()``'s ~2.1 us an entry on the H100.
``facts["capture"]["skipped_actions"]`` says what was skipped.
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from memtrace.capture import selfcost
from memtrace.capture.counters import allocator_stats, stat
from memtrace.model import ACTION_CODE, Recording, Segment

log = logging.getLogger("memtrace")

#: allocator counter -> the trace action counting the same thing
_COUNTERS = {
    "allocation.all.allocated": "alloc",
    "allocation.all.freed": "free_completed",
    "segment.all.allocated": "segment_alloc",
    "segment.all.freed": "segment_free",
}
_RESERVED = "reserved_bytes.all.current"  # read with the counters, for the sidecar's hint


#: The drain watchdog polls the allocator's counters (~90 us with the GIL held, each) every 20 ms while allocations
#: come fast, and at most every 0.5 s while they do not. It drains once half the ring is pending, so a poll that
#: just missed that leaves the other half (100,000 entries of the default ring) for the next period: the busiest
#: 160 ms of 30 shipped vLLM start-ups (H200 and H100, vLLM 0.25-0.34) held 11,796 events (73,700 a second), so
#: 0.5 s at that rate fills 37 % of it.
WATCH_PERIOD_S = 0.02
WATCH_PERIOD_MAX_S = 0.5
MAX_UNDRAINED_S = 30.0
#: A phase boundary drains when this many entries wait (a tenth of the default ring: the drains that keep the ring from
#: wrapping when the watchdog is off, under CUPTI), and a top-level one when the last drain is this old. Each drain
#: pays ``_snapshot()``'s fixed part on vLLM's thread, every live block's stack again (1.3-3.2 ms on the H100's vLLM
#: 0.34 start-ups, ``tests/data/vllm-h100-034-cost``): 2,000 entries and 0.5 s made 4-5 drains of start-ups whose
#: whole history fits the ring; the watchdog still bounds what a SIGKILL loses (``MAX_UNDRAINED_S``).
BOUNDARY_MIN_PENDING = 20_000
TOP_LEVEL_MIN_INTERVAL_S = 5.0


def watch_period(room: int, rate_per_s: float) -> float:
    """How long the drain watchdog may sleep: a quarter of the time the ring's ``room`` (entries left before half
    full) lasts at the last poll's ``rate_per_s``, between :data:`WATCH_PERIOD_S` and :data:`WATCH_PERIOD_MAX_S`."""
    if rate_per_s <= 0:
        return WATCH_PERIOD_MAX_S
    return min(max(room / rate_per_s / 4, WATCH_PERIOD_S), WATCH_PERIOD_MAX_S)


def resolve_device(device: Any) -> int | str:
    """The CUDA device index to trace, or a string saying why there is none."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    try:
        if not torch.cuda.is_available():
            return "no CUDA device is visible to torch (torch.cuda.is_available() is False)"
        if device is None:
            return int(torch.cuda.current_device())
        if isinstance(device, int):
            return device
        dev = torch.device(device)
        if dev.type != "cuda":
            return f"device {device} is not a CUDA device"
        return dev.index if dev.index is not None else int(torch.cuda.current_device())
    except Exception as exc:  # a broken driver must not crash the traced program
        return f"CUDA is unusable ({exc})"


def counted_between(then: dict[str, int] | None, now: dict[str, int] | None) -> int | None:
    """The allocations, completed frees and segment allocations and releases the allocator counted between two
    readings (exact: one history entry each); None when either is unreadable."""
    if then is None or now is None:
        return None
    return sum(now[k] - then[k] for k in _COUNTERS)


class DrainTiming:
    """What draining cost the traced program (stored as ``facts["capture"]["drains"]``)."""

    def __init__(self) -> None:
        self.count = 0
        self.snapshot_s = 0.0
        self.convert_s = 0.0
        self.max_s = 0.0
        self.by_reason: dict[str, int] = {}
        self.first: list[dict[str, Any]] = []

    def add(self, reason: str, events: int, snapshot_s: float, convert_s: float) -> None:
        self.count += 1
        self.snapshot_s += snapshot_s
        self.convert_s += convert_s
        self.max_s = max(self.max_s, snapshot_s + convert_s)
        self.by_reason[reason] = self.by_reason.get(reason, 0) + 1
        if len(self.first) < 8:
            self.first.append(
                {
                    "reason": reason,
                    "events": events,
                    "snapshot_s": round(snapshot_s, 4),
                    "convert_s": round(convert_s, 4),
                }
            )

    def as_fact(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "snapshot_s": round(self.snapshot_s, 4),
            "convert_s": round(self.convert_s, 4),
            "max_s": round(self.max_s, 4),
            "by_reason": self.by_reason,
            "first": self.first,
        }


class AllocatorHistory:
    """The allocator-history source of one session (one device)."""

    def __init__(
        self,
        *,
        device: int,
        stacks: str,
        max_entries: int,
        intern_stack: Callable,
        on_batch: Callable[[np.ndarray], None],
        add_note: Callable[[str, str], None],
        lock: threading.RLock,
        torch_module: Any = None,
    ):
        if torch_module is None:
            import torch as torch_module

        self.torch = torch_module
        torch = torch_module
        self.device = device
        self.stacks = stacks
        self.max_entries = int(max_entries)
        self.intern_stack = intern_stack
        self.on_batch = on_batch
        self.add_note = add_note
        self.lock = lock
        self.drains = 0
        self.events = 0
        self.truncated = False
        self.lost_min = 0
        self.annotations: list[dict[str, Any]] = []
        self.allocator_settings: Any = None
        self._counts = dict.fromkeys(_COUNTERS.values(), 0)
        self._base: dict[str, int] | None = None
        self._last_stats: dict[str, int] | None = None
        self._last_drain = time.monotonic()
        #: The watchdog drains anything pending after this long (serving mode shortens it: capture.serving).
        self.max_undrained_s = MAX_UNDRAINED_S
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._other_devices_warned = False
        self.timing = DrainTiming()
        #: Runs a drain's conversion elsewhere (the session's background writer); None: on the drainer.
        self.defer: Callable[[Callable[[], None]], None] | None = None
        #: Serving mode's flight recorder (:meth:`hold`): the ring's whole content goes to ``on_ring`` at each
        #: drain (its events; how many of the counted kinds it overwrote since holding began, None: counters
        #: unreadable; PyTorch's bytes at the snapshot).
        self.on_ring: Callable[[np.ndarray, int | None, dict[str, int] | None], None] | None = None
        self._held_base: dict[str, int] | None = None
        params = inspect.signature(torch.cuda.memory._record_memory_history).parameters
        self._supports = set(params)
        #: The actions torch is told not to record. ``free_requested``: nothing reads it (a block is freed at its
        #: ``free_completed``; the loss check counts neither), and it was a third of the entries each drain's
        #: ``_snapshot()`` pays for (~2.1 us an entry on the H100, issue 42). Empty where torch cannot skip.
        self.skipped: list[str] = ["free_requested"] if "skip_actions" in self._supports else []

    # -- recording -----------------------------------------------------------------------------
    def _record(self, *, clear: bool, enabled: str | None = "all") -> None:
        kwargs: dict[str, Any] = {"enabled": enabled}
        if enabled is not None:
            # "alloc": stacks of allocations only. Nothing in memtrace reads a free's stack (a block's
            # owner is its allocation), and gathering one per free doubled what recording costs the
            # program (torch takes the GIL for it, even on a C++ thread) and what drains convert.
            kwargs["context"] = None if self.stacks == "none" else "alloc"
            kwargs["stacks"] = "all" if self.stacks == "all" else "python"
            if "max_entries" in self._supports:
                kwargs["max_entries"] = self.max_entries
            if "global_record_annotations" in self._supports:  # phases from any thread
                kwargs["global_record_annotations"] = True
            if self.skipped:
                kwargs["skip_actions"] = self.skipped
        if clear and "clear_history" in self._supports:
            kwargs["clear_history"] = True
        self.torch.cuda.memory._record_memory_history(**kwargs)

    def enable(self) -> None:
        """Start recording with an empty history."""
        self._record(clear=True)
        self._base = self._stats()
        self._last_stats = self._base

    def hold(self, max_entries: int, on_ring: Callable[[np.ndarray, int | None, dict[str, int] | None], None]) -> None:
        """From now on PyTorch's own ring of ``max_entries`` is the flight recorder (serving mode): the watchdog
        stops, boundaries no longer drain, and a drain reads the ring without clearing it and hands its whole
        content to ``on_ring``. Call right after a drain: the ring then holds only what followed it."""
        self._stop.set()  # the watchdog's loop and boundary() end; stop() still drains and stops recording
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
            self._thread = None
        with self.lock:
            self._held_base = dict(self._last_stats) if self._last_stats is not None else self._stats()
            self.max_entries = int(max_entries)
            self.on_ring = on_ring
            self._record(clear=False)  # the new bound; what was recorded since the drain stays

    def set_stacks(self, stacks: str) -> None:
        """Keep ``stacks`` ("none", "python", "all") from now on (serving mode's own setting); what was recorded
        stays."""
        with self.lock:
            if stacks != self.stacks:
                self.stacks = stacks
                self._record(clear=False)

    @property
    def held(self) -> bool:
        return self.on_ring is not None

    def _stats(self) -> dict[str, int] | None:
        if not self.torch.cuda.is_initialized():
            return dict.fromkeys(_COUNTERS, 0)
        s = allocator_stats(self.torch, self.device)
        return {k: stat(s, k, 0) for k in (*_COUNTERS, _RESERVED)}

    def allocations(self) -> int | None:
        """The allocations the allocator has counted so far on this device (None: unreadable)."""
        try:
            stats = self._stats()
        except Exception:  # noqa: BLE001 - a cost figure only
            return None
        return None if stats is None else int(stats["allocation.all.allocated"])

    def current_bytes(self) -> dict[str, int] | None:
        """PyTorch's requested (the trace entries' sizes) and reserved bytes now; None when unreadable."""
        try:
            s = allocator_stats(self.torch, self.device)
            allocated, reserved = stat(s, "requested_bytes.all.current"), stat(s, _RESERVED)
        except Exception:  # noqa: BLE001 - the window's start state is then a lower bound, said so
            return None
        return (
            None
            if allocated is None or reserved is None
            else {"allocated_bytes": allocated, "reserved_bytes": reserved}
        )

    def reserved_bytes(self) -> int | None:
        """PyTorch's reserved bytes on the device now (None when it cannot be read)."""
        try:
            return stat(allocator_stats(self.torch, self.device), _RESERVED)
        except Exception:  # noqa: BLE001 - a hint only
            return None

    def _pending(self) -> tuple[int, int | None]:
        """Estimated entries recorded since the last drain (alloc 1, free 1, or 2 where ``free_requested`` is
        recorded, segment 1), and PyTorch's reserved bytes read with them (None before CUDA is initialised)."""
        last, now = self._last_stats, self._stats()
        counted = counted_between(last, now)
        if counted is not None and "free_requested" not in self.skipped:
            counted += now["allocation.all.freed"] - last["allocation.all.freed"]
        return counted or 0, now.get(_RESERVED)

    def _snapshot_and_clear(self, *, stop: bool) -> dict[str, Any]:
        if self.held and not stop:  # the flight recorder's ring is read, never cleared
            return self.torch.cuda.memory._snapshot()
        old = sys.getswitchinterval()
        sys.setswitchinterval(30.0)  # no other Python thread runs between snapshot and clear
        try:
            snap = self.torch.cuda.memory._snapshot()
            if stop:
                self._record(clear=True, enabled=None)
            else:
                self._record(clear=True)
        finally:
            sys.setswitchinterval(old)
        return snap

    def drain(self, reason: str, *, stop: bool = False) -> dict[str, Any] | None:
        """Move the history recorded since the last drain into the trace; returns the snapshot.

        The snapshot and the clear run here (charged to ``drain.<reason>`` in :mod:`.selfcost`); with
        ``defer`` set (the session's background writer), converting and writing the entries run there,
        in drain order.
        """
        with selfcost.region(f"{selfcost.DRAIN}.{reason}"), self.lock:
            t0 = time.perf_counter()
            before = self._stats()
            held, current = self.held, self.current_bytes() if self.held else None
            snap = self._snapshot_and_clear(stop=stop)
            snapshot_s = time.perf_counter() - t0
            self._last_stats = before
            self._last_drain = time.monotonic()
            self.drains += 1
            if held:  # the ring's whole content, with PyTorch's bytes read just before it
                convert = functools.partial(self._convert_ring, snap, before, reason, snapshot_s, current)
            else:
                convert = functools.partial(self._convert, snap, before, reason, snapshot_s)
            if self.defer is None:
                convert()
        if self.defer is not None:
            self.defer(convert)
        return snap

    def _entries(self, snap: dict[str, Any]) -> list:
        """This device's history entries in a snapshot."""
        traces = snap.get("device_traces") or []
        return traces[self.device] if self.device < len(traces) else []

    def _convert(self, snap: dict[str, Any], before: dict[str, int] | None, reason: str, snapshot_s: float) -> None:
        """Turn a drained snapshot's entries into events and hand them to the session (in drain order)."""
        t1 = time.perf_counter()
        traces = snap.get("device_traces") or []
        entries = self._entries(snap)
        others = sum(len(t or []) for i, t in enumerate(traces) if i != self.device)
        if others and not self._other_devices_warned:
            self._other_devices_warned = True
            self._note(f"{others} allocator events on other devices than cuda:{self.device} were not kept")
        if len(entries) >= self.max_entries:
            self._lost(1, f"the allocator history wrapped before a drain ({len(entries)} = max_entries entries)")
        # imported at the first conversion (on the writer when deferred): a worker without a GPU never pays for it
        from memtrace.importers.torch_snapshot import entries_to_events

        events = entries_to_events(entries, self.intern_stack)
        self.on_batch(events)
        self.timing.add(reason, len(events), snapshot_s, time.perf_counter() - t1)
        self.events += len(events)
        for name, code in ACTION_CODE.items():
            if name in self._counts:
                self._counts[name] += int(np.count_nonzero(events["action"] == code))
        self._check(before)
        self.annotations.extend(
            a for a in snap.get("external_annotations") or [] if str(a.get("name", "")).startswith("memtrace:")
        )
        if self.allocator_settings is None:
            self.allocator_settings = snap.get("allocator_settings")

    def _convert_ring(
        self,
        snap: dict[str, Any],
        before: dict[str, int] | None,
        reason: str,
        snapshot_s: float,
        current: dict[str, int] | None,
    ) -> None:
        """The held ring as it stands: all its entries, and how many of the counted kinds it overwrote since holding
        began (the allocator's counters at ``before`` less those kept)."""
        t1 = time.perf_counter()
        from memtrace.importers.torch_snapshot import entries_to_events

        events = entries_to_events(self._entries(snap), self.intern_stack)
        self.timing.add(reason, len(events), snapshot_s, time.perf_counter() - t1)
        counted = sum(int(np.count_nonzero(events["action"] == ACTION_CODE[a])) for a in _COUNTERS.values())
        recorded = counted_between(self._held_base, before)
        self.on_ring(events, None if recorded is None else max(recorded - counted, 0), current)
        if self.allocator_settings is None:
            self.allocator_settings = snap.get("allocator_settings")

    def _check(self, stats: dict[str, int] | None) -> None:
        """Counters read before the snapshot must not exceed the events recorded up to it."""
        if stats is None or self._base is None:
            return
        for key, action in _COUNTERS.items():
            expected = stats[key] - self._base[key]
            if expected < 0:  # someone reset the accumulated stats: rebase
                self._base = dict(stats)
                return
            missing = expected - self._counts[action]
            if missing > self.lost_min and missing > 0:
                self._lost(missing, f"{missing} {action} events counted by the allocator are missing from the history")

    def _lost(self, count: int, text: str) -> None:
        if count > self.lost_min:
            self.lost_min = count
        if not self.truncated:
            log.warning("memtrace: %s; the trace is incomplete (raise max_entries)", text)
        self.truncated = True
        self._note(text)

    def _note(self, text: str, level: str = "warning") -> None:
        self.add_note(level, text)

    def segments(self, snap: dict[str, Any]) -> list[Segment]:
        from memtrace.importers.torch_snapshot import segments_from_snapshot

        return segments_from_snapshot(snap.get("segments") or [], self.intern_stack, device=self.device)

    @selfcost.timed(f"{selfcost.DRAIN}.phase")
    def boundary(self, *, top_level: bool) -> int | None:
        """A phase began or ended: drain if it is worth it. Returns PyTorch's reserved bytes, read with the counters
        (None when not read: the session's hint to the sidecar needs no second read)."""
        if self._stop.is_set():
            return None
        pending, reserved = self._pending()
        recent = time.monotonic() - self._last_drain < TOP_LEVEL_MIN_INTERVAL_S
        if pending >= BOUNDARY_MIN_PENDING or (top_level and pending > 0 and not recent):
            self.drain("phase")
        return reserved

    def capture_fact(self, phases: list) -> dict[str, Any]:
        """Drain costs, the actions torch did not record, and how far the record_function annotations sit from the
        Python phase times."""
        starts: dict[str, list[int]] = {}
        for a in self.annotations:
            if a.get("stage") == "START":
                starts.setdefault(str(a["name"])[len("memtrace:") :], []).append(int(a.get("time_us", 0)))
        used: dict[str, int] = {}
        skew = []
        for p in phases:
            i = used.get(p.name, 0)
            if i < len(starts.get(p.name, ())):
                skew.append(starts[p.name][i] - p.start_us)
                used[p.name] = i + 1
        drains = {**self.timing.as_fact(), "converted_on": "traced thread" if self.defer is None else "background"}
        fact: dict[str, Any] = {"drains": drains, "annotations": len(self.annotations), "skipped_actions": self.skipped}
        if skew:
            fact["annotation_minus_phase_start_us"] = {
                "matched": len(skew),
                "median": int(np.median(skew)),
                "max_abs": int(max(abs(x) for x in skew)),
            }
        return fact

    def recorded_allocs(self) -> int:
        """Allocation events converted so far (each one PyTorch recorded with its stack)."""
        return self._counts["alloc"]

    def update_recording(self, rec: Recording) -> None:
        rec.drains = self.drains
        rec.truncated = rec.truncated or self.truncated
        rec.lost_events_min = max(rec.lost_events_min, self.lost_min)

    # -- phases as record_function ranges ------------------------------------------------------
    def enter_range(self, name: str) -> Any:
        try:
            rng = self.torch.profiler.record_function(name)
            rng.__enter__()
            return rng
        except Exception:
            return None

    def exit_range(self, rng: Any) -> None:
        try:
            rng.__exit__(None, None, None)
        except Exception:
            pass

    # -- watchdog ------------------------------------------------------------------------------
    def start_watchdog(self) -> None:
        self._thread = threading.Thread(target=self._watch, name="memtrace-drain", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        # the watchdog's polls and drains hold the GIL (a drain also the allocator's lock): charged as
        # the program's time (selfcost), though this thread is memtrace's
        period, before, then = WATCH_PERIOD_S, 0, time.monotonic()
        while not self._stop.wait(period):
            try:
                with selfcost.region(f"{selfcost.DRAIN}.watchdog_poll"):
                    pending, now = self._pending()[0], time.monotonic()
                    overdue = now - self._last_drain > self.max_undrained_s
                    if pending > self.max_entries // 2 or (overdue and pending > 0):
                        self.drain("watchdog")
                        pending = 0
                    rate = max(pending - before, 0) / max(now - then, 1e-3)
                    period, before, then = watch_period(self.max_entries // 2 - pending, rate), pending, now
            except Exception as exc:  # never let the watchdog kill anything; say why it stopped
                log.warning("memtrace: drain watchdog stopped: %s", exc)
                self._note(f"drain watchdog stopped: {exc!r}")
                return

    def stop(self) -> dict[str, Any] | None:
        """Stop the watchdog, drain the rest and stop recording; returns the last snapshot."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        return self.drain("stop", stop=True)
