"""The icicle path of every allocation, interned, exactly as ``memtrace flame`` builds its frames.

``analysis.flame.stack_paths`` turns live allocations into root→leaf label paths: the stack's frames,
a ``[hook] name`` frame for every hooked call running when the allocation was made, the phase for an
allocation without a stack, a marker for memory allocated before recording. The page needs that path
per allocation, so allocations are put in classes that share a path (same stack outside every hook
call; same phase without a stack; memory from before recording) and ``stack_paths`` is asked once per
class; allocations made while a hook ran are asked one by one (they are few: workspace allocations).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from memtrace.analysis.holders.flame import FramePaths, frame_label, stack_paths
from memtrace.analysis.holders.frames import site_frame
from memtrace.analysis.holders.live import Lifetimes, LiveAllocation
from memtrace.analysis.memory.categories import innermost_phase_indices
from memtrace.analysis.memory.phases import recording_span
from memtrace.model import Trace, empty_events, empty_samples


@dataclass(frozen=True)
class Paths:
    """``ids[k]``: the path of allocation k of the Lifetimes; ``paths[id]``: label ids root→leaf."""

    ids: np.ndarray  # int32, one per allocation of the Lifetimes
    labels: list[str]
    paths: list[list[int]]
    titles: list[str]  # what the top-holders table calls each path


def _without_events(trace: Trace) -> Trace:
    """``trace`` without its event and sample arrays but with the same recording span: ``stack_paths``
    reads phases, hook calls and stacks, and would otherwise scan every event once per call."""
    start, end = recording_span(trace)
    rec = dataclasses.replace(trace.recording, start_us=start, end_us=end)
    return dataclasses.replace(trace, events=empty_events(), samples=empty_samples(), recording=rec)


class _Interner:
    def __init__(self, trace: Trace) -> None:
        self.trace = _without_events(trace)
        self.paths_of = FramePaths(self.trace)
        self.labels: list[str] = []
        self.label_ids: dict[str, int] = {}
        self.paths: list[list[int]] = []
        self.titles: list[str] = []
        self.path_ids: dict[tuple[str, ...], int] = {}

    def path_of(self, stack: int, alloc_us: int | None) -> int:
        """The interned path of one allocation made at ``alloc_us`` (None: before recording)."""
        (key,) = stack_paths(self.trace, [LiveAllocation(0, 1, stack, alloc_us)], self.paths_of)[0]
        pid = self.path_ids.get(key)
        if pid is None:
            pid = self.path_ids[key] = len(self.paths)
            self.paths.append([self._label(x) for x in key])
            f = site_frame(self.trace, stack)
            self.titles.append(frame_label(f) if f is not None else " ".join(key))
        return pid

    def _label(self, text: str) -> int:
        i = self.label_ids.get(text)
        if i is None:
            i = self.label_ids[text] = len(self.labels)
            self.labels.append(text)
        return i


def _in_hook_calls(trace: Trace, times: np.ndarray) -> np.ndarray:
    inside = np.zeros(len(times), dtype=bool)
    for h in trace.hook_calls:
        inside |= (times >= h.start_us) & (times <= max(h.end_us, h.start_us))
    return inside


def allocation_paths(trace: Trace, lt: Lifetimes) -> Paths:
    """The flame graph's path of every allocation in ``lt`` (see the module docstring)."""
    ids = np.zeros(len(lt.size), dtype=np.int32)
    interner = _Interner(trace)
    recorded = lt.alloc_pos >= 0
    hooked = recorded & _in_hook_calls(trace, lt.alloc_us)
    for k in np.flatnonzero(hooked):  # one by one: the hooks running differ
        ids[k] = interner.path_of(int(lt.stack[k]), int(lt.alloc_us[k]))
    plain = ~hooked
    with_stack = plain & (lt.stack >= 0)
    stacks = np.unique(lt.stack[with_stack])  # a stack's path does not depend on when, outside hooks
    by_stack = np.array([interner.path_of(int(s), None) for s in stacks], dtype=np.int32)
    ids[with_stack] = by_stack[np.searchsorted(stacks, lt.stack[with_stack])]
    no_stack = plain & (lt.stack < 0) & recorded
    phase = innermost_phase_indices(trace, lt.alloc_us[no_stack])
    where = np.flatnonzero(no_stack)
    phases, first = np.unique(phase, return_index=True)  # no stack: the phase it was made in
    by_phase = np.array([interner.path_of(-1, int(lt.alloc_us[where[k]])) for k in first], dtype=np.int32)
    ids[where] = by_phase[np.searchsorted(phases, phase)] if len(where) else ids[where]
    before = plain & (lt.stack < 0) & ~recorded
    if before.any():
        ids[before] = interner.path_of(-1, None)
    return Paths(ids, interner.labels, interner.paths, interner.titles)
