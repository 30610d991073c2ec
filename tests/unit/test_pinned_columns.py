"""The vectorised pinned curve is the event-at-a-time one, on random histories, consistent or not."""

from __future__ import annotations

import numpy as np
import pytest
from memtrace.analysis.memory import pinned as P
from memtrace.analysis.memory.curves import all_curves
from memtrace.model import ACTION_CODE, Block, Segment, Trace, empty_events
from references import pinned_loop

MiB = 1 << 20


def random_trace(seed: int, n: int, consistent: bool) -> Trace:
    """Segments at a few addresses (some nested in others' old ranges), blocks inside and outside them."""
    rng = np.random.default_rng(seed)
    starts = [k * 4 * MiB for k in range(6)] + [2 * MiB + k * 4 * MiB for k in range(3)]
    active: dict[int, int] = {}
    initial = rng.choice(starts, size=2, replace=False).tolist()
    for a in initial:
        active[a] = int(rng.choice([2, 4, 8])) * MiB
    ev = empty_events(n)
    for i in range(n):
        r = rng.random()
        a = int(rng.choice(starts))
        if r < 0.15:
            if consistent and a in active:
                act, size = "segment_free", active.pop(a)
            elif consistent:
                size = int(rng.choice([2, 4, 8])) * MiB
                act, active[a] = "segment_alloc", size
            else:
                act, size = str(rng.choice(["segment_alloc", "segment_free"])), int(rng.choice([2, 4])) * MiB
        else:
            act = "alloc" if rng.random() < 0.55 else "free_completed"
            a = a + int(rng.integers(0, 8)) * 512 * 1024
            size = 512 * 1024
        ev[i] = (1000 + i, ACTION_CODE[act], a, size, 0, -1)
    segs = [
        Segment(a, s, blocks=[Block(a + MiB, MiB, MiB, "active_allocated")] if rng.random() < 0.7 else [])
        for a, s in active.items()
    ]
    return Trace(events=ev, segments=segs)


@pytest.mark.parametrize("consistent", [True, False])
@pytest.mark.parametrize("seed", range(40))
def test_vectorised_pinned_equals_the_loop(seed, consistent):
    tr = random_trace(seed, 300, consistent)
    curves = all_curves(tr)
    assert np.array_equal(P.pinned_curve(tr, curves).bytes, pinned_loop(tr, curves).bytes)


def test_consistent_histories_are_computed_not_answered_with_reserved():
    """Only a history with expandable segments falls back to the reserved curve; every other is computed."""
    for seed in range(10):
        tr = random_trace(seed, 300, True)
        curves = all_curves(tr)
        assert P.pinned_curve(tr, curves) is not curves.reserved
