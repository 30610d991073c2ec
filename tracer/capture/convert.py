"""Fast conversion of a drained batch of allocator-history entries into ``EVENT_DTYPE`` events.

Same result as :func:`memtrace.importers.torch_snapshot.entries_to_events` (a unit test checks it),
built for the live recorder's hot path: columns are gathered with list comprehensions instead of
per-record numpy assignment, and stacks are interned once per distinct ``frames`` list object (PyTorch
hands out one list per unique traceback in a snapshot) before falling back to their contents.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..model import ACTION_CODE, empty_events


def entries_to_events_fast(entries: Sequence[dict[str, Any]], intern_stack: Callable) -> np.ndarray:
    """Convert ``device_traces[d]`` entries, skipping unknown actions; stacks interned via ``intern_stack``."""
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
            key = tuple(
                (str(f.get("filename", "")), int(f.get("line", 0) or 0), str(f.get("name", ""))) for f in frames
            )
            sid = by_content.get(key)
            if sid is None:
                sid = by_content[key] = intern_stack(key)
            by_list[id(frames)] = sid
        return sid

    events["time_us"] = np.fromiter((int(e.get("time_us", 0) or 0) for e in kept), dtype=np.int64, count=n)
    events["action"] = np.fromiter((codes[e["action"]] for e in kept), dtype=np.int8, count=n)
    events["addr"] = np.fromiter((int(e.get("addr", 0) or 0) for e in kept), dtype=np.int64, count=n)
    events["size"] = np.fromiter((int(e.get("size", 0) or 0) for e in kept), dtype=np.int64, count=n)
    events["stream"] = np.fromiter((int(e.get("stream", 0) or 0) for e in kept), dtype=np.int64, count=n)
    events["stack"] = np.fromiter((stack_of(e.get("frames")) for e in kept), dtype=np.int32, count=n)
    return events
