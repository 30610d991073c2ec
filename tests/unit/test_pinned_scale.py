"""The pinned curve at scale: the windowed search gives the loop's answer whatever the window, below many
closed segments (where the old search gave up at 10M events) and when a segment is allocated again at
its own start. Histories are SYNTHETIC (built event by event, named so); the loop is the reference."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from memtrace.analysis.memory import pinned as P
from memtrace.analysis.memory.curves import all_curves
from memtrace.model import ACTION_CODE, Trace, empty_events
from references import pinned_loop

MiB, GiB = 1 << 20, 1 << 30
# the random histories of test_pinned_columns (test modules are not on the path)
_spec = importlib.util.spec_from_file_location("pinned_histories", Path(__file__).with_name("test_pinned_columns.py"))
_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)
random_trace = _mod.random_trace


def history(rows: list[tuple[str, int, int]]) -> Trace:
    """A SYNTHETIC trace from (action, address, size) rows, 1 µs apart."""
    ev = empty_events(len(rows))
    for i, (act, addr, size) in enumerate(rows):
        ev[i] = (1000 + i, ACTION_CODE[act], addr, size, 0, -1)
    return Trace(events=ev)


def pinned(tr: Trace) -> np.ndarray:
    curves = all_curves(tr)
    out = P.pinned_curve(tr, curves).bytes
    assert np.array_equal(out, pinned_loop(tr, curves).bytes)
    return out


@pytest.mark.parametrize("window", [1, 3, 16, 64])
@pytest.mark.parametrize("consistent", [True, False])
def test_any_window_gives_the_loop_curve(monkeypatch, window, consistent):
    monkeypatch.setattr(P, "_WINDOW", window)
    for seed in range(15):
        pinned(random_trace(seed, 400, consistent))


def test_a_block_above_hundreds_of_closed_segments_finds_its_own():
    # 300 small segments come and go inside what later is one 1 GiB segment's range; a block at its top
    # has 300 closed starts between it and its segment's (the old search gave up after 64)
    rows = []
    for i in range(1, 301):
        rows += [("segment_alloc", i * 2 * MiB, 2 * MiB), ("segment_free", i * 2 * MiB, 2 * MiB)]
    rows += [("segment_alloc", 0, GiB), ("alloc", 900 * MiB, MiB), ("free_completed", 900 * MiB, MiB)]
    out = pinned(history(rows))
    assert out[-3:].tolist() == [0, GiB, 0]  # pinned only while its block lives


def test_a_segment_allocated_again_at_its_start_keeps_its_blocks():
    # an inconsistent history (a second segment_alloc at an active start, no free between, as in the
    # 10M-event benchmark trace): the new size replaces the old and the live count stays; when the last
    # block goes the loop takes off the new size, so 4 of the 8 MiB stay counted (the loop's bookkeeping,
    # followed exactly)
    rows = [
        ("segment_alloc", 0, 8 * MiB),
        ("alloc", MiB, MiB),
        ("segment_alloc", 0, 4 * MiB),
        ("alloc", 2 * MiB, MiB),
        ("free_completed", MiB, MiB),
        ("free_completed", 2 * MiB, MiB),
    ]
    out = pinned(history(rows))
    assert out.tolist()[1:] == [0, 8 * MiB, 8 * MiB, 8 * MiB, 8 * MiB, 4 * MiB]
