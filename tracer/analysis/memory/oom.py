"""The CUDA out-of-memory error a run died of, recorded live or imported: one answer for every output.

A live capture records ``facts["oom"]`` from PyTorch's OOM observer (before the error propagates);
an imported snapshot carries an ``oom`` allocator event (``size`` = the request, ``addr`` = the
device's free bytes). :func:`find_oom` reads either (the live record first: it has the total too)
and says when, in which phase, what was asked for and what was free. Every output that covers that
moment shows it, and nothing claims what happened after it: a run that died cannot say whether the
rest of its start-up fits anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from memtrace import facts as F
from memtrace.analysis.memory.phases import path_at
from memtrace.model import ACTION_CODE, Trace

OOM_ACTION = ACTION_CODE["oom"]


@dataclass(frozen=True)
class Oom:
    """A failed allocation: the error the run died of (the first one, when several were recorded)."""

    time_us: int
    phase_path: str  # the innermost phase in force ("" outside any phase)
    requested_bytes: int
    free_bytes: int | None  # the device's free memory at that moment, when known
    total_bytes: int | None  # the device's memory, when known
    device: int | None
    source: str  # "observer" (a live capture) or "allocator event" (an imported snapshot)
    count: int  # how many OOMs the trace holds (retries after a caught OOM make more)

    @property
    def device_ran_out(self) -> bool:
        """Whether the device itself ran out: it had fewer bytes free than were asked for (False when unknown)."""
        return self.free_bytes is not None and self.free_bytes < self.requested_bytes

    def limit_bytes(self, device_total_bytes: int | None) -> int | None:
        """The allocator's limit when it was below the device (a per-process memory fraction), else None."""
        if self.total_bytes and (not device_total_bytes or self.total_bytes < device_total_bytes):
            return self.total_bytes
        return None


def _int(value) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def find_oom(trace: Trace) -> Oom | None:
    """The OOM ``trace`` recorded (see the module docstring), or None if it recorded none."""
    events = trace.events
    idx = np.flatnonzero(events["action"] == OOM_ACTION) if len(events) else np.zeros(0, np.int64)
    record = trace.facts.get(F.OOM)
    if isinstance(record, dict) and _int(record.get("time_us")) is not None:
        t = int(record["time_us"])
        phase = record.get("phase")
        return Oom(
            time_us=t,
            phase_path=phase if isinstance(phase, str) else path_at(trace, t),
            requested_bytes=_int(record.get("requested_bytes")) or 0,
            free_bytes=_int(record.get("device_free_bytes")),
            total_bytes=_int(record.get("device_total_bytes")),
            device=_int(record.get("device")),
            source="observer",
            count=max(1, len(idx)),
        )
    if not len(idx):
        return None
    first = int(idx[0])
    t = int(events["time_us"][first])
    free = int(events["addr"][first])
    return Oom(
        time_us=t,
        phase_path=path_at(trace, t),
        requested_bytes=int(events["size"][first]),
        free_bytes=free if free > 0 else None,
        total_bytes=trace.process.device_total_bytes,
        device=trace.process.device_index,
        source="allocator event",
        count=len(idx),
    )
