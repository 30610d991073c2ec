"""Compute a trace's derived columns once per process: a memo of all_curves, lifetimes, categorize.

Every command asks for the same curves and lifetimes several times (summary, categories, flame,
landmarks, fits, diff each call ``all_curves`` / ``lifetimes``); at 10M events each costs seconds and
hundreds of MiB. :func:`cached` keeps one result per (trace, analysis) for as long as the trace lives.

Traces are not mutated after load: the store (or a test's builder) makes a Trace, then analyses read
it. The memo relies on that, and guards it:

- keyed on ``id(trace)`` (a Trace is a mutable dataclass, not hashable), dropped by a ``weakref``
  finalizer when the trace is collected, so an id reused by a later trace never sees an old result and
  nothing leaks between tests;
- each result is stored with a signature of what the analyses read (identity and length of events,
  samples, others, CUPTI's device allocations, segments, phases, hook calls, facts; the recording start and device total), so a
  trace whose columns are replaced or resized after an analysis is computed afresh;
- the numpy columns it was computed from are made read-only, so an in-place edit of an event after an
  analysis raises instead of being served a stale result; and the results are read-only too, since
  they are shared by every caller.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from ..model import Trace

T = TypeVar("T")

_MEMO: dict[int, dict[str, tuple[tuple, Any]]] = {}


def _signature(trace: Trace) -> tuple:
    cols = (
        trace.events,
        trace.samples,
        trace.others,
        trace.device_allocs,
        trace.segments,
        trace.phases,
        trace.hook_calls,
        trace.facts,
    )
    return (
        *((id(c), len(c)) for c in cols),
        trace.recording.start_us,
        trace.process.device_total_bytes,
    )


def _freeze(value: Any) -> Any:
    """Make every numpy array reachable through dataclasses, dicts, lists and tuples read-only."""
    if isinstance(value, np.ndarray):
        value.flags.writeable = False
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            _freeze(getattr(value, f.name))
    elif isinstance(value, dict):
        for v in value.values():
            _freeze(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _freeze(v)
    return value


def cached(trace: Trace, name: str, compute: Callable[[Trace], T]) -> T:
    """``compute(trace)``, computed once per trace while its columns stay the same (see the module docstring)."""
    key = id(trace)
    entry = _MEMO.get(key)
    if entry is None:
        entry = _MEMO[key] = {}
        weakref.finalize(trace, _MEMO.pop, key, None)
    sig = _signature(trace)
    hit = entry.get(name)
    if hit is not None and hit[0] == sig:
        return hit[1]
    for col in (trace.events, trace.samples, trace.others, trace.device_allocs):
        if isinstance(col, np.ndarray):
            col.flags.writeable = False
    value = _freeze(compute(trace))
    entry[name] = (sig, value)
    return value


def forget(trace: Trace) -> None:
    """Drop every memoised result of ``trace`` (for code that must edit a trace after analysing it)."""
    _MEMO.pop(id(trace), None)
