"""A PyTorch memory snapshot (the ``torch.cuda.memory._snapshot()`` dict) for pytorch.org/memory_viz.

The dict has PyTorch's shape, so memory_viz and ``torch.cuda._memory_viz`` read it:

- ``segments``: the allocator state at the end of the recording (address, total_size, stream,
  segment_type, segment_pool_id, is_expandable, allocated/active/requested sizes, device, and
  blocks with address, size, requested_size, state, frames);
- ``device_traces``: one list per device up to the traced one, whose entries are the allocator
  events (action, addr, size, stream, time_us, frames, compile_context, user_metadata, and pool_id
  when not the default pool), with the compile_context / user_metadata / pool_id the import kept
  (``facts["snapshot_fields"]``), torch's defaults ("N/A", "") elsewhere; a ``free_completed``
  without its block's ``free_requested`` (memtrace records none where torch can skip them, a
  profiler's import has none) gets one just before it (:func:`with_free_requests`);
- a pinned host memory trace (``importers.pinned_host``) goes to ``host_segments`` / ``host_traces``;
- ``external_annotations``: the phases as ``record_function`` ranges
  (``{name: "memtrace:<phase>", stage: START|END, device, time_us}``);
- ``allocator_settings``: as recorded, when the trace kept them.

It is written as a pickle with protocol 4: memory_viz rejects protocol 5 (pytorch#183842). The file
is streamed (``pickle_stream``): ten million entries never exist as Python objects. NVML
samples, hook calls and facts have no place in this format and are left out. memtrace reads the
file back with ``memtrace import`` (``importers.snapshot.traces_from_snapshot``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, Any

import numpy as np
from memtrace import facts as F
from memtrace.errors import UsageError
from memtrace.importers.pinned_host import PINNED_HOST
from memtrace.importers.snapshot_fields import fields_by_event
from memtrace.model import ACTION_CODE, ACTIONS, Trace
from memtrace.plots.pickle_stream import (
    APPENDS,
    COMPILE_CONTEXT,
    EMPTY_DICT,
    EMPTY_LIST,
    MARK,
    PROTO4,
    SETITEMS,
    STOP,
    USER_METADATA,
    PickleStream,
    StackRef,
    entry_records,
)

_OOM = ACTION_CODE["oom"]
_FREE_REQUESTED, _FREE_COMPLETED = ACTION_CODE["free_requested"], ACTION_CODE["free_completed"]
_BLOCK_ACTIONS = (ACTION_CODE["alloc"], _FREE_REQUESTED, _FREE_COMPLETED)


def _covering_blocks(seg, frames_of) -> list[dict[str, Any]]:
    """The segment's blocks, with "inactive" blocks filling any gap: PyTorch's snapshots cover every
    byte of a segment with blocks, and ``torch.cuda._memory_viz`` checks that they add up."""
    out: list[dict[str, Any]] = []
    cursor = seg.address
    end = seg.address + seg.total_bytes
    for b in sorted(seg.blocks, key=lambda b: b.address):
        if b.address > cursor:
            out.append({"address": cursor, "size": b.address - cursor, "requested_size": 0, "state": "inactive",
                        "frames": []})  # fmt: skip
        out.append({"address": b.address, "size": b.size_bytes, "requested_size": b.requested_bytes,
                    "state": b.state, "frames": frames_of(b.stack)})  # fmt: skip
        cursor = max(cursor, b.address + b.size_bytes)
    if cursor < end:
        out.append({"address": cursor, "size": end - cursor, "requested_size": 0, "state": "inactive", "frames": []})
    return out


def _segments(trace: Trace, frames_of) -> list[dict[str, Any]]:
    device = trace.process.device_index or 0
    segments = []
    for s in trace.segments:
        blocks = _covering_blocks(s, frames_of)
        active = sum(b.size_bytes for b in s.blocks if b.state.startswith("active"))
        segments.append(
            {
                "device": device,
                "address": s.address,
                "total_size": s.total_bytes,
                "allocated_size": sum(b.size_bytes for b in s.blocks if b.state == "active_allocated"),
                "active_size": active,
                "requested_size": s.requested_bytes,
                "stream": s.stream,
                "segment_type": s.segment_type,
                "segment_pool_id": tuple(int(x) for x in s.pool_id.split(",")) if s.pool_id else (0, 0),
                "is_expandable": s.is_expandable,
                "blocks": blocks,
            }
        )
    return segments


def _annotations(trace: Trace) -> list[dict[str, Any]]:
    device = trace.process.device_index or 0
    annotations = []
    for p in trace.phases:
        annotations.append({"name": f"memtrace:{p.name}", "stage": "START", "device": device, "time_us": p.start_us})
        if p.end_us is not None:
            annotations.append({"name": f"memtrace:{p.name}", "stage": "END", "device": device, "time_us": p.end_us})
    annotations.sort(key=lambda a: (a["time_us"], a["stage"] == "START"))  # an END before a START at one µs
    return annotations


def _entry(t: int, action: int, addr: int, size: int, stream: int, frames: Any, fields=None) -> dict[str, Any]:
    """One trace entry; ``fields`` is the (compile_context, user_metadata, pool_id) the import kept
    (``importers.snapshot_fields``), None for torch's defaults (``pool_id`` then left out)."""
    context, metadata, pool = fields if fields is not None else (COMPILE_CONTEXT, USER_METADATA, None)
    entry = {
        "action": ACTIONS[action],
        "addr": addr,
        "size": size,
        "stream": stream,
        "time_us": t,
        "frames": frames,
        "compile_context": context,
        "user_metadata": metadata,
    }
    if pool is not None and tuple(pool) != (0, 0):
        entry["pool_id"] = tuple(pool)
    if action == _OOM:  # PyTorch keeps the device's free bytes of an OOM in "device_free"
        entry["device_free"] = addr
    return entry


def _fields(trace: Trace) -> tuple[np.ndarray, list]:
    """Per event, the index of its kept fields in the returned list (-1: torch's defaults)."""
    return fields_by_event(trace.facts.get(F.SNAPSHOT_FIELDS), len(trace.events))


def _unrequested_frees(ev: np.ndarray) -> np.ndarray:
    """Positions of the ``free_completed`` entries with no ``free_requested`` of their block just before them at
    their address (memtrace's recordings skip those: ``facts["capture"]["skipped_actions"]``)."""
    idx = np.flatnonzero(np.isin(ev["action"], _BLOCK_ACTIONS))
    idx = idx[np.lexsort((idx, ev["addr"][idx]))]  # by address, each address's entries in order
    action, addr = ev["action"][idx], ev["addr"][idx]
    requested = np.zeros(len(idx), dtype=bool)
    requested[1:] = (action[:-1] == _FREE_REQUESTED) & (addr[:-1] == addr[1:])
    return np.sort(idx[(action == _FREE_COMPLETED) & ~requested])


def with_free_requests(ev: np.ndarray, which: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``ev`` and its fields' ``which`` with a ``free_requested`` put back just before each free without one, at the
    free's time, with its stack and fields.

    memory_viz's "Allocator State History" replays the entries backwards from the final state and draws a freed
    block red ("block freed but waiting due to record_stream") until it meets the block's ``free_requested``:
    without one, every block freed later would be drawn so from its allocation on. Put back, the pair reads as one
    "free"; a block that did wait on another stream shows as allocated until it was returned."""
    pos = _unrequested_frees(ev)
    if len(pos) == 0:
        return ev, which
    requests = ev[pos]
    requests["action"] = _FREE_REQUESTED
    return np.insert(ev, pos, requests), np.insert(which, pos, which[pos])


def _is_host(trace: Trace) -> bool:
    return trace.process.role == PINNED_HOST


#: Entries per MARK ... APPENDS group of the streamed file. MemoryViz.js appends a group with
#: ``arr.push(...items)``, whose argument count JavaScript engines cap (pickle itself uses 1,000).
CHUNK = 1 << 13


def _slow_positions(ev: np.ndarray, which: np.ndarray) -> np.ndarray:
    """Entries the generic writer writes: the first use of each stack and action, every OOM, and every
    entry with fields of its own (``which`` >= 0)."""
    if len(ev) == 0:
        return np.zeros(0, np.int64)
    _, first_stack = np.unique(ev["stack"], return_index=True)
    _, first_action = np.unique(ev["action"], return_index=True)
    ooms = np.flatnonzero(ev["action"] == _OOM)
    own = np.flatnonzero(which >= 0)
    return np.unique(np.concatenate((first_stack, first_action, ooms, own)).astype(np.int64))


def _write_entries(ps: PickleStream, ev: np.ndarray, which: np.ndarray, values: list) -> None:
    ps.w(EMPTY_LIST)
    slow = _slow_positions(ev, which)
    for lo in range(0, len(ev), CHUNK):
        hi = min(len(ev), lo + CHUNK)
        ps.w(MARK)
        cur = lo
        for i in slow[(slow >= lo) & (slow < hi)].tolist():
            if i > cur:
                ps.raw(entry_records(ps, ev[cur:i], ACTIONS).tobytes())
            e = ev[i]
            w = int(which[i])
            ps.value(_entry(int(e["time_us"]), int(e["action"]), int(e["addr"]), int(e["size"]), int(e["stream"]),
                            StackRef(int(e["stack"])), values[w] if w >= 0 else None))  # fmt: skip
            cur = i + 1
        if cur < hi:
            ps.raw(entry_records(ps, ev[cur:hi], ACTIONS).tobytes())
        ps.w(APPENDS)


def write_snapshot(trace: Trace, out: IO[bytes], progress=None) -> None:
    """Stream the snapshot of ``trace`` to ``out`` as a protocol-4 pickle (see ``pickle_stream``)."""
    device = trace.process.device_index or 0
    ps = PickleStream(out, [(f.filename, f.line, f.name) for f in trace.frames], trace.stacks)
    which, values = _fields(trace)
    events, which = with_free_requests(trace.events, which)
    ps.w(PROTO4 + EMPTY_DICT + MARK)
    if _is_host(trace):  # pinned host memory goes back where torch 2.14 keeps it
        for key in ("segments", "device_traces"):
            ps.string(key)
            ps.value([])
        ps.string("host_segments")
        ps.value(_segments(trace, StackRef))
        ps.string("host_traces")
        _write_entries(ps, events, which, values)
        ps.w(SETITEMS + STOP)
        ps.flush()
        return
    ps.string("segments")
    ps.value(_segments(trace, StackRef))
    ps.string("device_traces")
    ps.w(EMPTY_LIST + MARK + EMPTY_LIST * device)
    _write_entries(ps, events, which, values)
    ps.w(APPENDS)
    if progress is not None:
        progress.advance()
    ps.string("external_annotations")
    ps.value(_annotations(trace))
    ps.string("allocator_settings")
    ps.value(trace.facts.get(F.ALLOCATOR_SETTINGS, {}))
    ps.w(SETITEMS + STOP)
    ps.flush()
    if progress is not None:
        progress.advance()


def export_memory_viz(trace: Trace, path: str | os.PathLike, progress=None) -> Path:
    """Write ``trace`` to ``path`` as a memory_viz-compatible snapshot pickle (protocol 4), streamed.

    A profiler trace's CPU memory (role ``host``) is refused: a snapshot has no place for it other than a
    device's, and host memory is never written as device memory."""
    if trace.process.role == "host":
        raise UsageError(
            f"{trace.label} is the CPU's memory from a profiler trace; a memory_viz snapshot holds device (and "
            "pinned host) memory only: export it with -f perfetto or -f folded"
        )
    out = Path(path)
    with open(out, "wb") as f:
        write_snapshot(trace, f, progress)
    return out


def render(run, out: str | os.PathLike, *, progress=None) -> None:
    """The render protocol's entry (``plots.render``): the run's worst rank (``--rank`` leaves one) as a
    memory_viz snapshot."""
    export_memory_viz(run.worst.trace, out, progress)
