"""Thin a step curve for drawing without losing its peaks: keep the first, lowest, highest and last
point of every pixel-wide bucket of time.

A trace of a million events would otherwise send a million vertices to matplotlib; with about two
buckets per pixel the drawn line is indistinguishable from the full one and every maximum (the
moment that crossed the target) survives exactly. Pure numpy; times and values stay integers.
"""

from __future__ import annotations

import numpy as np


def bucket_indices(time_us: np.ndarray, key: np.ndarray, t_lo: int, t_hi: int, n_buckets: int) -> np.ndarray:
    """Sorted, unique indices to keep: per time bucket over [t_lo, t_hi], the first and last index and
    those of the minimum and maximum of ``key``. Points outside the range are dropped, except the
    last one before ``t_lo`` (the value in force at the left edge).

    Args:
        time_us: non-decreasing times.
        key: the values whose extremes must survive (e.g. the total of a stack).
        t_lo, t_hi: the drawn time range.
        n_buckets: how many buckets (about twice the width in pixels).
    """
    n = len(time_us)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    lo = max(int(np.searchsorted(time_us, t_lo, side="right")) - 1, 0)
    hi = int(np.searchsorted(time_us, t_hi, side="right"))
    if hi - lo <= 4 * n_buckets:
        return np.arange(lo, max(hi, lo + 1), dtype=np.int64)
    t = time_us[lo:hi].astype(np.float64)
    v = key[lo:hi]
    span = max(float(t_hi - t_lo), 1.0)
    bucket = np.clip(((t - t_lo) * n_buckets / span).astype(np.int64), 0, n_buckets - 1)
    starts = np.flatnonzero(np.concatenate(([True], bucket[1:] != bucket[:-1])))
    ends = np.concatenate((starts[1:], [len(t)])) - 1
    seg_max = np.maximum.reduceat(v, starts)
    seg_min = np.minimum.reduceat(v, starts)
    seg_of = np.repeat(np.arange(len(starts)), np.diff(np.concatenate((starts, [len(t)]))))
    is_max = v == seg_max[seg_of]
    is_min = v == seg_min[seg_of]
    first_max = _first_per_segment(np.flatnonzero(is_max), seg_of)
    first_min = _first_per_segment(np.flatnonzero(is_min), seg_of)
    keep = np.unique(np.concatenate((starts, ends, first_max, first_min)))
    return keep + lo


def _first_per_segment(positions: np.ndarray, seg_of: np.ndarray) -> np.ndarray:
    if not len(positions):
        return positions
    segs = seg_of[positions]
    _, first = np.unique(segs, return_index=True)
    return positions[first]
