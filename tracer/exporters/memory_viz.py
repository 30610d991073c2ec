"""A PyTorch memory snapshot (the ``torch.cuda.memory._snapshot()`` dict) for pytorch.org/memory_viz.

The dict has PyTorch's shape, so memory_viz and ``torch.cuda._memory_viz`` read it:

- ``segments``: the allocator state at the end of the recording (address, total_size, stream,
  segment_type, segment_pool_id, is_expandable, allocated/active/requested sizes, device, and
  blocks with address, size, requested_size, state, frames);
- ``device_traces``: one list per device up to the traced one, whose entries are the allocator
  events (action, addr, size, stream, time_us, frames, compile_context, user_metadata);
- ``external_annotations``: the phases as ``record_function`` ranges
  (``{name: "memtrace:<phase>", stage: START|END, device, time_us}``);
- ``allocator_settings``: as recorded, when the trace kept them.

It is written as a pickle with protocol 4: memory_viz rejects protocol 5 (pytorch#183842). NVML
samples, hook calls and facts have no place in this format and are left out. memtrace reads the
file back with ``memtrace import`` (``importers.torch_snapshot.trace_from_snapshot``).
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

from ..analysis.phases import recording_span
from ..model import ACTIONS, Trace

PICKLE_PROTOCOL = 4


def _frame_lists(trace: Trace) -> list[list[dict[str, Any]]]:
    """One frames list per interned stack (shared objects: the pickle stores each once)."""
    frames = [{"filename": f.filename, "line": f.line, "name": f.name} for f in trace.frames]
    return [[frames[i] for i in stack] for stack in trace.stacks]


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


def snapshot_dict(trace: Trace, progress=None) -> dict[str, Any]:
    """The ``_snapshot()``-shaped dict of ``trace``."""
    device = trace.process.device_index or 0
    stacks = _frame_lists(trace)
    empty: list[dict[str, Any]] = []

    def frames_of(stack: int) -> list[dict[str, Any]]:
        return stacks[stack] if 0 <= stack < len(stacks) else empty

    ev = trace.events
    entries = []
    cols = zip(
        ev["time_us"].tolist(), ev["action"].tolist(), ev["addr"].tolist(), ev["size"].tolist(),
        ev["stream"].tolist(), ev["stack"].tolist(), strict=True,
    )  # fmt: skip
    oom = ACTIONS.index("oom")
    for t, action, addr, size, stream, stack in cols:
        entry = {
            "action": ACTIONS[action],
            "addr": addr,
            "size": size,
            "stream": stream,
            "time_us": t,
            "frames": frames_of(stack),
            "compile_context": "N/A",
            "user_metadata": "",
        }
        if action == oom:  # PyTorch keeps the device's free bytes of an OOM in "device_free"
            entry["device_free"] = addr
        entries.append(entry)
    if progress is not None:
        progress.advance()
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
    _, end_of_trace = recording_span(trace)
    annotations = []
    for p in trace.phases:
        annotations.append({"name": f"memtrace:{p.name}", "stage": "START", "device": device, "time_us": p.start_us})
        if p.end_us is not None:
            annotations.append({"name": f"memtrace:{p.name}", "stage": "END", "device": device, "time_us": p.end_us})
    annotations.sort(key=lambda a: (a["time_us"], a["stage"] == "START"))  # an END before a START at one µs
    if progress is not None:
        progress.advance()
    return {
        "segments": segments,
        "device_traces": [[] for _ in range(device)] + [entries],
        "external_annotations": annotations,
        "allocator_settings": trace.facts.get("allocator_settings", {}),
    }


def export_memory_viz(trace: Trace, path: str | os.PathLike, progress=None) -> Path:
    """Write ``trace`` to ``path`` as a memory_viz-compatible snapshot pickle (protocol 4)."""
    out = Path(path)
    snap = snapshot_dict(trace, progress)
    with open(out, "wb") as f:
        pickle.dump(snap, f, protocol=PICKLE_PROTOCOL)
    return out
