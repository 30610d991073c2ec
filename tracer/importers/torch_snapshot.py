"""Convert PyTorch's own memory snapshots (``torch.cuda.memory._snapshot()``) into the trace model.

Used two ways: by the live recorder (``memtrace.capture``), which drains the allocator history with
``_snapshot()`` and converts each batch with :func:`entries_to_events`, and by ``memtrace import`` /
``memtrace report FILE.pickle`` for snapshots a user dumped with ``_dump_snapshot``.

This module never imports torch: a snapshot is plain dicts and lists.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
from memtrace import facts as F
from memtrace.errors import TraceFormatError
from memtrace.importers.snapshot_fields import count_unknown, entry_fields, unknown_note
from memtrace.model import (
    ACTION_CODE,
    Block,
    Frame,
    Note,
    Phase,
    Process,
    Recording,
    Segment,
    Trace,
    empty_events,
    stacks_kind,
)

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


def _stack_column(frames_of_entries: Iterable[Any], intern_stack: StackInterner) -> np.ndarray:
    """Stack ids of the entries' ``frames`` lists (-1 for none), interning each distinct stack once.

    torch gives each trace entry a frames list of its own (an alloc shares it with its frees at
    most) while the frame dicts inside are shared across the whole snapshot. So a list is looked up
    by (its innermost frame dict's id, its depth, its outermost frame dict's id) and confirmed by
    comparing it with the list seen first (identical frame dicts compare at C speed); only a new
    stack is converted and interned. The ids are valid while the entries are alive (this call).
    Measured on a 1M-entry snapshot: 0.65 s of CPU, against 2.3 s keyed on the tuple of every frame
    dict's id; keyed on each list's id, the cache misses two times in three.
    """
    by_ends: dict[tuple[int, int, int], list[tuple[Any, int]]] = {}
    by_content: dict[tuple, int] = {}
    get = by_ends.get
    sids: list[int] = []
    append = sids.append
    last, last_sid = None, -1  # a free_completed follows its free_requested with the same list
    for frames in frames_of_entries:
        if frames is last:
            append(last_sid)
            continue
        if not frames:
            append(-1)
            continue
        key = (id(frames[0]), len(frames), id(frames[-1]))
        seen = get(key)
        if seen is not None and seen[0][0] == frames:
            sid = seen[0][1]
        else:
            sid = next((s for ref, s in seen if ref == frames), None) if seen is not None else None
            if sid is None:
                content = _frames_of(frames)
                sid = by_content.get(content)
                if sid is None:
                    sid = by_content[content] = intern_stack(content)
                by_ends.setdefault(key, []).append((frames, sid))
        append(sid)
        last, last_sid = frames, sid
    return np.array(sids, dtype=np.int32)


def _int_column(kept: Sequence[dict[str, Any]], name: str, n: int) -> np.ndarray | None:
    """``entry[name]`` of every entry as int64 (missing -> 0); None when some value is None or absent
    everywhere it matters (the caller decides), computed at C speed when every entry has an int."""
    try:
        return np.fromiter(map(operator.itemgetter(name), kept), dtype=np.int64, count=n)
    except (KeyError, TypeError, ValueError, OverflowError):
        pass
    return np.fromiter((int(e.get(name) or 0) for e in kept), dtype=np.int64, count=n)


def has_clock(entries: Sequence[dict[str, Any]]) -> bool:
    """False when the entries carry no ``time_us`` (PyTorch before 2.1 recorded none)."""
    return any(e.get("time_us") for e in entries[:1000]) or any(e.get("time_us") for e in entries[-1000:])


def _known(entries: Sequence[dict[str, Any]]) -> tuple[Sequence[dict[str, Any]], list[int]]:
    """The entries whose action memtrace knows, and their action codes."""
    codes = ACTION_CODE
    actions = list(map(operator.itemgetter("action"), entries)) if entries else []
    code_list = list(map(codes.get, actions))
    if None not in code_list:
        return entries, code_list
    keep = [c is not None for c in code_list]
    return [e for e, k in zip(entries, keep, strict=True) if k], [c for c in code_list if c is not None]


def entries_to_events(entries: Sequence[dict[str, Any]], intern_stack: StackInterner) -> np.ndarray:
    """Convert ``device_traces[d]`` entries to an ``EVENT_DTYPE`` array, interning their stacks.

    Unknown actions (from a newer PyTorch) are left out (:func:`convert_entries` counts them). For ``oom``
    entries the device's free bytes (PyTorch's ``device_free``) are stored in ``addr``. Entries without
    ``time_us`` get 0 (see :func:`has_clock`). Built for ten million entries: each column is gathered in
    one C-level pass and stacks go through :func:`_stack_column`.
    """
    kept, code_list = _known(entries)
    return _events_of(kept, code_list, intern_stack)


def convert_entries(
    entries: Sequence[dict[str, Any]], intern_stack: StackInterner
) -> tuple[np.ndarray, dict[str, Any] | None, dict[str, list[int]]]:
    """The events of ``entries`` (:func:`entries_to_events`), their ``snapshot_fields`` document (None:
    all torch's defaults) and the unknown actions counted (``{action: [entries, bytes]}``)."""
    kept, code_list = _known(entries)
    unknown = count_unknown(entries, ACTION_CODE) if len(kept) < len(entries) else {}
    return _events_of(kept, code_list, intern_stack), entry_fields(kept), unknown


def _events_of(kept: Sequence[dict[str, Any]], code_list: list[int], intern_stack: StackInterner) -> np.ndarray:
    codes = ACTION_CODE
    n = len(kept)
    events = empty_events(n)
    if n == 0:
        return events
    events["action"] = np.array(code_list, dtype=np.int8)
    events["time_us"] = _int_column(kept, "time_us", n)
    events["size"] = _int_column(kept, "size", n)
    events["stream"] = _int_column(kept, "stream", n)
    oom = np.flatnonzero(events["action"] == codes["oom"])
    if len(oom):  # an oom entry carries the device's free bytes (device_free in PyTorch >= 2.1, addr before)
        events["addr"] = np.fromiter((int(e.get("addr", 0) or 0) for e in kept), dtype=np.int64, count=n)
        for i in oom.tolist():
            e = kept[i]
            events["addr"][i] = int(e.get("device_free", e.get("addr", 0)) or 0)
    else:
        events["addr"] = _int_column(kept, "addr", n)
    try:  # every entry has "frames" unless the history was recorded without stacks
        frames = list(map(operator.itemgetter("frames"), kept))
    except KeyError:
        frames = list(map(operator.methodcaller("get", "frames"), kept))
    events["stack"] = _stack_column(frames, intern_stack)
    return events


def segments_from_snapshot(
    raw_segments: Sequence[dict[str, Any]], intern_stack: StackInterner, device: int | None = None
) -> list[Segment]:
    """The allocator state of a snapshot (``snapshot["segments"]``), for one device if given."""
    out = []
    raw_frames: list[Any] = []  # each block's frames list, converted together below
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
            raw_frames.append(_block_frames(b))
            seg.blocks.append(
                Block(
                    address=int(b.get("address", cursor)),
                    size_bytes=size,
                    requested_bytes=int(b.get("requested_size", size) or 0),
                    state=str(b.get("state", "inactive")),
                )
            )
            cursor += size
        out.append(seg)
    stacks = iter(_stack_column(raw_frames, intern_stack).tolist())
    for seg in out:
        for block in seg.blocks:
            block.stack = next(stacks)
    return out


def _block_frames(block: dict[str, Any]) -> Any:
    """A block's frames: ``frames``, or (PyTorch before 2.1) its ``history``'s latest entry's."""
    frames = block.get("frames")
    if frames is None and block.get("history"):
        frames = block["history"][-1].get("frames")
    return frames


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


def devices_with_history(snapshot: dict[str, Any]) -> list[int]:
    """Every device whose history holds an allocator event or whose segments are listed, in order."""
    return sorted(set(_devices_with_events(snapshot)) | _devices_with_state(snapshot))


def _devices_with_events(snapshot: dict[str, Any]) -> list[int]:
    """The devices whose history holds an event with a memory effect (not only ``snapshot`` markers)."""
    inert = ("snapshot", "annotate")
    traces = snapshot.get("device_traces") or []
    return [d for d, t in enumerate(traces) if any(e.get("action") not in inert for e in t or [])]


def _devices_with_state(snapshot: dict[str, Any]) -> set[int]:
    return {int(s.get("device", 0) or 0) for s in snapshot.get("segments") or []}


def describe_devices(snapshot: dict[str, Any]) -> str:
    """``0 (allocator state only), 1 (history)``: what the snapshot holds for each device."""
    events = set(_devices_with_events(snapshot))
    return ", ".join(
        f"{d} ({'history' if d in events else 'allocator state only'})" for d in devices_with_history(snapshot)
    )


def validate_snapshot(snapshot: Any, source: str) -> None:
    """Raise TraceFormatError unless ``snapshot`` looks like a ``_snapshot()`` dict."""
    if not isinstance(snapshot, dict) or "segments" not in snapshot or "device_traces" not in snapshot:
        kind = type(snapshot).__name__
        raise TraceFormatError(
            f"{source} is not a PyTorch memory snapshot (got a {kind} without 'segments'/'device_traces'); "
            "dump one with torch.cuda.memory._dump_snapshot()"
        )


SYNTHETIC_CLOCK_NOTE = (
    "this snapshot records no times (time_us arrived in PyTorch 2.1): its events are placed 1 µs apart "
    "in recorded order, so durations and rates are not real; the order and every byte figure are exact"
)
MOMENT_NOTE = (
    "this snapshot is the allocator's state at one moment (taken without _record_memory_history()): there "
    "is no timeline; every figure is that moment's (who held which blocks, segment by segment)"
)
NO_STATE_NOTE = (
    "this snapshot lists no segments although its history leaves memory held at its end (converters write "
    "'segments: []'): memory held before recording began cannot be known, so every peak and total here is a "
    "lower bound (the least the history implies), not the peak"
)


def _state_missing(events: np.ndarray, segments: list[Segment]) -> bool:
    """True when the final state is listed empty although the events, from the least memory that keeps
    them non-negative, leave memory allocated or reserved at the end, or allocate more than is reserved:
    then the listed state is not the real one, and what was held before recording is unknown."""
    if segments or not len(events):
        return False
    act, size = events["action"], events["size"]

    def least(up: tuple[str, ...], down: tuple[str, ...]) -> np.ndarray:
        d = np.where(np.isin(act, [ACTION_CODE[a] for a in up]), size, 0)
        sums = np.cumsum(d - np.where(np.isin(act, [ACTION_CODE[a] for a in down]), size, 0))
        return sums + max(0, -int(sums.min()))

    held = least(("alloc",), ("free_completed",))
    reserved = least(("segment_alloc", "segment_map"), ("segment_free", "segment_unmap"))
    return bool(held[-1] > 0 or reserved[-1] > 0 or (held > reserved).any())


def _device_trace(snapshot: dict[str, Any], dev: int, devices: list[int]) -> Trace:
    traces = snapshot.get("device_traces") or []
    entries = (traces[dev] or []) if dev < len(traces) else []
    interner = Interner()
    events, fields, unknown = convert_entries(entries, interner)
    segments = segments_from_snapshot(snapshot.get("segments", []), interner, device=dev)
    inert = (ACTION_CODE["snapshot"], ACTION_CODE["annotate"])
    moment = not np.isin(events["action"], inert, invert=True).any()
    notes: list[Note] = []
    clock = "recorded" if has_clock(entries) else "none"
    if moment:
        notes.append(Note(0, "warning", MOMENT_NOTE))
    elif len(events) and clock == "none":
        events["time_us"] = np.arange(len(events), dtype=np.int64)
        clock = "synthetic"
        notes.append(Note(0, "warning", SYNTHETIC_CLOCK_NOTE))
    state = "moment" if moment else ("missing" if _state_missing(events, segments) else "recorded")
    if state == "missing":
        notes.append(Note(0, "warning", NO_STATE_NOTE))
    if unknown:
        notes.append(Note(0, "warning", unknown_note(unknown)))
    if len(devices) > 1:
        others = ", ".join(f"cuda:{d}" for d in devices if d != dev)
        notes.append(Note(0, "info", f"the snapshot holds several devices; this trace is cuda:{dev} (rank {dev}), "
                                     f"the others ({others}) are their own traces"))  # fmt: skip
    frames = [Frame(*f) for f in interner.frames]
    stacks = stacks_kind(frames)
    timed = len(events) and clock != "none"
    trace = Trace(
        process=Process(role="import", rank=dev, device_index=dev),
        recording=Recording(
            source="torch-snapshot",
            start_us=int(events["time_us"].min()) if timed else None,
            end_us=int(events["time_us"].max()) if timed else None,
            stacks=stacks,
        ),
        events=events,
        frames=frames,
        stacks=list(interner.stacks),
        segments=segments,
        phases=[] if clock != "recorded" else phases_from_annotations(snapshot.get("external_annotations", []), dev),
        notes=notes,
    )
    trace.facts[F.IMPORT] = {"device": dev, "devices": devices, "clock": clock, "stacks": stacks, "state": state}
    if unknown:
        trace.facts[F.IMPORT]["unknown_actions"] = unknown
    if fields:
        trace.facts[F.SNAPSHOT_FIELDS] = fields
    settings = snapshot.get("allocator_settings")
    if settings:
        trace.facts[F.ALLOCATOR_SETTINGS] = settings
    return trace


def as_snapshot(snapshot: Any, source: str) -> dict[str, Any]:
    """The ``_snapshot()`` dict of what was unpickled: an old ``torch.cuda.memory_snapshot()`` segment list
    becomes its ``segments``; anything else that is not a snapshot is refused (:func:`validate_snapshot`)."""
    if isinstance(snapshot, list) and snapshot and all(isinstance(s, dict) and "blocks" in s for s in snapshot[:10]):
        return {"segments": snapshot, "device_traces": []}
    validate_snapshot(snapshot, source)
    return snapshot
