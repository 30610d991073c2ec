"""The memory curves as CSV, for users' own tools (pandas, a spreadsheet, gnuplot).

One row per change of a quantity: ``rank,quantity,time_us,bytes``, ``time_us`` from the run's one time
origin (``AnalysedRun.origin``), ``bytes`` exact integers; ``quantity`` is the key of
``analysis.quantities`` (allocated, reserved, vmm, held, device_used, others, non_torch), each curve
written as a step function: a value holds until the next row of the same rank and quantity.
"""

from __future__ import annotations

import csv
import os

import numpy as np
from memtrace.analysis.memory import quantities as Q

#: the quantities written, in this order
WRITTEN = (Q.ALLOCATED, Q.RESERVED, Q.VMM, Q.HELD, Q.DEVICE_USED, Q.OTHERS, Q.NON_TORCH)


def _changes(t: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The last value per microsecond, then only the points where the value changes."""
    if len(t) == 0:
        return t, b
    last = np.ones(len(t), dtype=bool)
    last[:-1] = t[1:] != t[:-1]
    t, b = t[last], b[last]
    keep = np.ones(len(t), dtype=bool)
    keep[1:] = b[1:] != b[:-1]
    return t[keep], b[keep]


def render(run, out: str | os.PathLike, *, progress=None) -> None:
    """Write every rank's curves (ranks with no allocator events are left out) to ``out``."""
    t0 = run.origin.t0_us
    with open(out, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(("rank", "quantity", "time_us", "bytes"))
        for rank in run.ranks:
            if not rank.recorded_nothing:
                label = rank.trace.process.rank if rank.trace.process.rank is not None else 0
                for q in WRITTEN:
                    c = Q.curve(rank.curves, q)
                    t, b = _changes(c.time_us, c.bytes)
                    w.writerows((label, q.key, ti, bi) for ti, bi in zip((t - t0).tolist(), b.tolist(), strict=True))
            if progress is not None:
                progress.advance()
