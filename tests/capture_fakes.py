"""FakeTorch: the parts of ``torch.cuda`` that ``memtrace.capture.allocator_history`` uses, for CPU tests and benches.

It replays the entries of a ``_snapshot()``-shaped dict (e.g. ``memtrace.plots.memory_viz.
snapshot_dict`` of a synthetic trace) as if the program allocated them: ``allocate(n)`` records the
next ``n`` entries (a fresh frames list per entry, as torch builds them) and bumps the allocator's
cumulative counters; ``_snapshot()`` returns the history since the last clear plus the segments.
Everything else a test drives (Session, drains, the store) is memtrace's real code.
"""

from __future__ import annotations

import contextlib
import types
from pathlib import Path

from memtrace.capture import allocator_history as H
from memtrace.capture.session import Session

#: trace action -> the torch.cuda.memory_stats() counter that counts it (torch's names, spelled as torch does)
_COUNTER = {
    "alloc": "allocation.all.allocated",
    "free_completed": "allocation.all.freed",
    "segment_alloc": "segment.all.allocated",
    "segment_free": "segment.all.freed",
}


class FakeTorch:
    """The parts of ``torch.cuda`` that capture/allocator_history.py uses, replaying recorded entries (FakeTorch)."""

    def __init__(self, snap: dict, free_stacks: bool | None = None):
        """``free_stacks``: keep the frees' stacks whatever ``context`` asks (None: as torch would)."""
        self.free_stacks = free_stacks
        self.context = "all"
        self.reserved = 0  # what torch.cuda.memory_reserved() answers
        self.all_entries = snap["device_traces"][0]
        self.segments = snap["segments"]
        self.pos = 0
        self.history: list[dict] = []
        self.max_entries: int | None = None  # torch's ring: the newest entries overwrite the oldest past it
        self.skip: set[str] = set()  # the actions torch is told not to record (skip_actions)
        self.recorded = 0  # entries put in the history (those of the replayed ones not skipped)
        self.stats = dict.fromkeys(_COUNTER.values(), 0)

    def allocate(self, n: int) -> None:
        keep_free = self.context == "all" if self.free_stacks is None else self.free_stacks
        for e in self.all_entries[self.pos : self.pos + n]:
            key = _COUNTER.get(e["action"])
            if key:
                self.stats[key] += 1
            if e["action"] in self.skip:
                continue
            self.recorded += 1
            stack = self.context is not None and (keep_free or e["action"] in ("alloc", "segment_alloc"))
            self.history.append({**e, "frames": list(e["frames"]) if stack else []})  # one list per entry
        if self.max_entries is not None and len(self.history) > self.max_entries:
            del self.history[: len(self.history) - self.max_entries]
        self.pos += n

    def record(self, enabled="all", context="all", clear_history=False, max_entries=None, skip_actions=(), **kw):
        self.context = context
        self.max_entries = max_entries
        self.skip = set(skip_actions)
        if clear_history:
            self.history = []

    def snapshot(self) -> dict:
        return {"device_traces": [list(self.history)], "segments": self.segments, "external_annotations": []}

    def module(self):
        memory = types.SimpleNamespace(_record_memory_history=self.record, _snapshot=self.snapshot)
        cuda = types.SimpleNamespace(
            memory=memory,
            is_initialized=lambda: True,
            memory_stats=lambda d: {**self.stats, "reserved_bytes.all.current": self.reserved},
            memory_reserved=lambda d: self.reserved,
        )
        prof = types.SimpleNamespace(record_function=lambda name: contextlib.nullcontext())
        return types.SimpleNamespace(cuda=cuda, _C=types.SimpleNamespace(), profiler=prof)


def session_with(snap: dict, path: Path, free_stacks: bool | None = None, **kwargs) -> tuple[Session, FakeTorch]:
    """A real Session writing ``path`` whose allocator history is a FakeTorch replaying ``snap``."""
    fake = FakeTorch(snap, free_stacks)
    s = Session(path, sample_hz=0, handle_signals=False, role="vllm-worker", **kwargs)
    s.process.device_index = 0
    s.facts["env"] = {}
    history = H.AllocatorHistory(
        device=0,
        stacks="python",
        max_entries=200_000,
        intern_stack=s._intern_stack,
        on_batch=s._on_batch,
        add_note=s.add_note,
        lock=s._lock,
        torch_module=fake.module(),
    )
    s.attach_history(history)
    history.enable()
    return s, fake
