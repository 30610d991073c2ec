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
from memtrace.analysis.holders.frames import per_trace
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


#: the live record's keys (``facts["oom"]``) of requested_bytes, free_bytes, total_bytes and device
_RECORDED = ("requested_bytes", "device_free_bytes", "device_total_bytes", "device")


def _int(value) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@per_trace
def find_oom(trace: Trace) -> Oom | None:
    """The OOM ``trace`` recorded (see the module docstring), or None if it recorded none."""
    events = trace.events
    idx = np.flatnonzero(events["action"] == OOM_ACTION) if len(events) else np.zeros(0, np.int64)
    record = trace.facts.get(F.OOM)
    if isinstance(record, dict) and _int(record.get("time_us")) is not None:
        t, phase = int(record["time_us"]), record.get("phase")
        requested, free, total, device = (_int(record.get(k)) for k in _RECORDED)
        phase = phase if isinstance(phase, str) else path_at(trace, t)
        return Oom(t, phase, requested or 0, free, total, device, "observer", max(1, len(idx)))
    if not len(idx):
        return None
    t, requested, free = (int(events[k][idx[0]]) for k in ("time_us", "size", "addr"))
    p = trace.process
    return Oom(t, path_at(trace, t), requested, free if free > 0 else None, p.device_total_bytes, p.device_index,
               "allocator event", len(idx))  # fmt: skip
