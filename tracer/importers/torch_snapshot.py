"""Convert PyTorch's own memory snapshots (``torch.cuda.memory._snapshot()``) into the trace model.

Used two ways: by the live recorder (``memtrace.capture``), which drains the allocator history with
``_snapshot()`` and converts each batch with :func:`entries_to_events`, and by ``memtrace import`` /
``memtrace report FILE.pickle`` for snapshots a user dumped with ``_dump_snapshot``.

This module never imports torch: a snapshot is plain dicts and lists.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from ..errors import TraceFormatError
from ..model import ACTION_CODE, Block, Phase, Process, Recording, Segment, Trace, empty_events

#: intern_stack(frames) -> stack id, frames as (filename, line, name) tuples, innermost first.
StackInterner = Callable[[Sequence[tuple[str, int, str]]], int]

#: Prefixes stripped from record_function names when they become phases.
PHASE_PREFIXES = ("memtrace:", "phase:")


class Interner:
    """An in-memory frame/stack interner producing ``Trace.frames`` and ``Trace.stacks``."""

    def __init__(self) -> None:
        self.frames: list[tuple[str, int, str]] = []
        self.stacks: list[tuple[int, ...]] = []
        self._frame_ids: dict[tuple[str, int, str], int] = {}
        self._stack_ids: dict[tuple[int, ...], int] = {}

    def __call__(self, frames: Sequence[tuple[str, int, str]]) -> int:
        ids = []
        for f in frames:
            fid = self._frame_ids.get(f)
            if fid is None:
                fid = self._frame_ids[f] = len(self.frames)
                self.frames.append(f)
            ids.append(fid)
        key = tuple(ids)
        sid = self._stack_ids.get(key)
        if sid is None:
            sid = self._stack_ids[key] = len(self.stacks)
            self.stacks.append(key)
        return sid


_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def _line(value: Any) -> int:
    """A frame's line number as an int64; -1 when PyTorch reports none or a value outside int64.

    Seen on an H200 inside vLLM: a frame whose ``line`` did not fit SQLite's INTEGER.
    """
    try:
        line = int(value or 0)
    except (TypeError, ValueError):
        return -1
    return line if _INT64_MIN <= line <= _INT64_MAX else -1


def _frames_of(raw: Iterable[dict[str, Any]] | None) -> tuple[tuple[str, int, str], ...]:
    if not raw:
        return ()
    return tuple((str(f.get("filename", "")), _line(f.get("line")), str(f.get("name", ""))) for f in raw)


def entries_to_events(entries: Sequence[dict[str, Any]], intern_stack: StackInterner) -> np.ndarray:
    """Convert ``device_traces[d]`` entries to an ``EVENT_DTYPE`` array, interning their stacks.

    Unknown actions (from a newer PyTorch) are skipped. For ``oom`` entries the device's free bytes
    (PyTorch's ``device_free``) are stored in ``addr``. Built for the live recorder's hot
    path: columns are gathered in one pass each, and a stack is interned once per distinct ``frames``
    list object (a snapshot shares one list per unique traceback) before falling back to its contents.
    """
    codes = ACTION_CODE
    kept = [e for e in entries if e.get("action") in codes]
    n = len(kept)
    events = empty_events(n)
    if n == 0:
        return events
    by_list: dict[int, int] = {}
    by_content: dict[tuple, int] = {}

    def stack_of(frames: Any) -> int:
        if not frames:
            return -1
        sid = by_list.get(id(frames))
        if sid is None:
            key = _frames_of(frames)
            sid = by_content.get(key)
            if sid is None:
                sid = by_content[key] = intern_stack(key)
            by_list[id(frames)] = sid
        return sid

    def column(name: str):
        return (int(e.get(name, 0) or 0) for e in kept)

    events["time_us"] = np.fromiter(column("time_us"), dtype=np.int64, count=n)
    events["action"] = np.fromiter((codes[e["action"]] for e in kept), dtype=np.int8, count=n)
    # an oom entry carries the device's free bytes (``device_free`` in PyTorch >= 2.1, ``addr`` before)
    events["addr"] = np.fromiter(
        (
            int(e.get("device_free", e.get("addr", 0)) or 0) if e["action"] == "oom" else int(e.get("addr", 0) or 0)
            for e in kept
        ),
        dtype=np.int64,
        count=n,
    )
    events["size"] = np.fromiter(column("size"), dtype=np.int64, count=n)
    events["stream"] = np.fromiter(column("stream"), dtype=np.int64, count=n)
    events["stack"] = np.fromiter((stack_of(e.get("frames")) for e in kept), dtype=np.int32, count=n)
    return events


def segments_from_snapshot(
    raw_segments: Sequence[dict[str, Any]], intern_stack: StackInterner, device: int | None = None
) -> list[Segment]:
    """The allocator state of a snapshot (``snapshot["segments"]``), for one device if given."""
    out = []
    for s in raw_segments:
        if device is not None and s.get("device", device) != device:
            continue
        addr = int(s.get("address", 0))
        seg = Segment(
            address=addr,
            total_bytes=int(s.get("total_size", 0)),
            stream=int(s.get("stream", 0) or 0),
            segment_type=str(s.get("segment_type", "large")),
            pool_id=",".join(str(x) for x in (s.get("segment_pool_id") or (0, 0))),
            is_expandable=bool(s.get("is_expandable", False)),
        )
        cursor = addr
        for b in s.get("blocks", []):
            size = int(b.get("size", 0))
            frames = _frames_of(b.get("frames"))
            seg.blocks.append(
                Block(
                    address=int(b.get("address", cursor)),
                    size_bytes=size,
                    requested_bytes=int(b.get("requested_size", size) or 0),
                    state=str(b.get("state", "inactive")),
                    stack=intern_stack(frames) if frames else -1,
                )
            )
            cursor += size
        out.append(seg)
    return out


def phases_from_annotations(annotations: Sequence[dict[str, Any]], device: int | None = None) -> list[Phase]:
    """Pair ``external_annotations`` START/END records into nested phases.

    Ranges are matched by name, innermost first (a stack per name). A START with no END becomes an
    open phase (``end_us=None``): the process stopped inside it.
    """
    phases: list[Phase] = []
    open_stack: list[int] = []  # indexes into phases, in nesting order
    for a in sorted(annotations, key=lambda a: int(a.get("time_us", 0))):
        if device is not None and a.get("device", device) != device:
            continue
        name = str(a.get("name", ""))
        for prefix in PHASE_PREFIXES:
            if name.startswith(prefix):
                name = name[len(prefix) :]
        t = int(a.get("time_us", 0))
        if a.get("stage") == "START":
            parent = open_stack[-1] if open_stack else None
            phases.append(Phase(name=name, start_us=t, end_us=None, parent=parent, source="annotation"))
            open_stack.append(len(phases) - 1)
        elif a.get("stage") == "END":
            for depth in range(len(open_stack) - 1, -1, -1):
                if phases[open_stack[depth]].name == name:
                    phases[open_stack[depth]].end_us = t
                    del open_stack[depth]
                    break
    return phases


def pick_device(snapshot: dict[str, Any]) -> int:
    """The device whose history is longest (the one a single-GPU process used)."""
    traces = snapshot.get("device_traces") or []
    if not traces:
        return 0
    return max(range(len(traces)), key=lambda d: len(traces[d] or []))


def validate_snapshot(snapshot: Any, source: str) -> None:
    """Raise TraceFormatError unless ``snapshot`` looks like a ``_snapshot()`` dict."""
    if not isinstance(snapshot, dict) or "segments" not in snapshot or "device_traces" not in snapshot:
        kind = type(snapshot).__name__
        raise TraceFormatError(
            f"{source} is not a PyTorch memory snapshot (got a {kind} without 'segments'/'device_traces'); "
            "dump one with torch.cuda.memory._dump_snapshot()"
        )


def trace_from_snapshot(snapshot: dict[str, Any], *, device: int | None = None, source: str = "snapshot") -> Trace:
    """Build a Trace from a whole ``_snapshot()`` dict (events, segments, frames, phases)."""
    validate_snapshot(snapshot, source)
    dev = pick_device(snapshot) if device is None else device
    traces = snapshot.get("device_traces") or []
    if dev >= len(traces) and traces:
        raise TraceFormatError(f"{source} has no device {dev} (it holds {len(traces)} devices)")
    entries = traces[dev] if traces else []
    interner = Interner()
    events = entries_to_events(entries, interner)
    segments = segments_from_snapshot(snapshot.get("segments", []), interner, device=dev)
    if len(events) == 0 and not segments:
        raise TraceFormatError(
            f"{source} holds no allocator events and no segments; record with "
            "torch.cuda.memory._record_memory_history() before taking the snapshot"
        )
    from ..model import Frame

    trace = Trace(
        process=Process(role="import", device_index=dev),
        recording=Recording(
            source="torch-snapshot",
            start_us=int(events["time_us"].min()) if len(events) else None,
            end_us=int(events["time_us"].max()) if len(events) else None,
            stacks="python" if interner.stacks else "none",
        ),
        events=events,
        frames=[Frame(*f) for f in interner.frames],
        stacks=list(interner.stacks),
        segments=segments,
        phases=phases_from_annotations(snapshot.get("external_annotations", []), device=dev),
    )
    settings = snapshot.get("allocator_settings")
    if settings:
        trace.facts["allocator_settings"] = settings
    return trace
