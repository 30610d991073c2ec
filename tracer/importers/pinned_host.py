"""Pinned host memory of a torch snapshot (``host_segments`` / ``host_traces``) as a trace of its own.

torch 2.14 records the CUDA host (pinned memory) allocator when ``_record_memory_history(...,
record_pinned_host_memory=True)`` is passed; ``_snapshot()`` then holds its state in ``host_segments`` and
its history in ``host_traces``, shaped as the device allocator's ``segments`` and trace entries. That
memory lives in host RAM: it becomes its own trace (role :data:`PINNED_HOST`, no device, no rank, labelled
"pinned host"), never added to any device's curves. ``host_traces`` is read as one list of entries, or as
one list per device (concatenated in time order) if a torch writes it that way.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from memtrace import facts as F
from memtrace.importers.snapshot_fields import unknown_note
from memtrace.model import ACTION_CODE, Frame, Note, Process, Recording, Trace

#: ``Process.role`` of the pinned host memory trace (``Trace.label`` reads it).
PINNED_HOST = "pinned-host"


def _host_entries(snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    raw = snapshot.get("host_traces") or []
    if raw and all(isinstance(x, list) for x in raw):
        entries = [e for part in raw for e in part]
        return sorted(entries, key=lambda e: int(e.get("time_us") or 0))
    return [e for e in raw if isinstance(e, dict)]


def host_trace(snapshot: dict[str, Any], interner) -> Trace | None:
    """The pinned host memory trace of ``snapshot``, or None when it holds no host segments nor history."""
    from memtrace.importers.torch_snapshot import convert_entries, segments_from_snapshot

    entries = _host_entries(snapshot)
    raw_segments = snapshot.get("host_segments") or []
    if not entries and not raw_segments:
        return None
    events, fields, unknown = convert_entries(entries, interner)
    segments = segments_from_snapshot(raw_segments, interner)
    times = events["time_us"][events["time_us"] > 0]
    notes = [
        Note(0, "info", "pinned host memory (torch's CUDA host allocator): host RAM, never counted as device memory")
    ]
    if unknown:
        notes.append(Note(0, "warning", unknown_note(unknown)))
    inert = (ACTION_CODE["snapshot"], ACTION_CODE["annotate"])
    moment = not np.isin(events["action"], inert, invert=True).any()
    trace = Trace(
        process=Process(role=PINNED_HOST),
        recording=Recording(
            source="torch-snapshot",
            start_us=int(times.min()) if len(times) else None,
            end_us=int(times.max()) if len(times) else None,
        ),
        events=events,
        frames=[Frame(*f) for f in interner.frames],
        stacks=list(interner.stacks),
        segments=segments,
        notes=notes,
    )
    trace.facts[F.IMPORT] = {
        "memory": "pinned host",
        "clock": "recorded" if len(times) else "none",
        "state": "moment" if moment else "recorded",
    }
    if unknown:
        trace.facts[F.IMPORT]["unknown_actions"] = unknown
    if fields:
        trace.facts[F.SNAPSHOT_FIELDS] = fields
    return trace
