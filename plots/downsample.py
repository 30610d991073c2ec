"""Thin a step curve for drawing without losing its peaks: keep the first, lowest, highest and last
point of every pixel-wide bucket of time.

A trace of a million events would otherwise send a million vertices to matplotlib; with about two
buckets per pixel the drawn line is indistinguishable from the full one and every maximum (the
moment that crossed the target) survives exactly. Pure numpy; times and values stay integers.

The cost is one pass of ``argmax`` and one of ``argmin`` over the drawn range: where each bucket starts
is found by binary search (a few thousand searches), not by computing every point's bucket (at 10M events
that took a fifth of ``memtrace plot``'s own time).
"""

from __future__ import annotations

import numpy as np


def bucket_indices(time_us: np.ndarray, key: np.ndarray, t_lo: int, t_hi: int, n_buckets: int) -> np.ndarray:
    """Sorted, unique indices to keep: per time bucket over [t_lo, t_hi], the first and last index and
    those of the minimum and maximum of ``key`` (the first of equal ones). Points outside the range are
    dropped, except the last one before ``t_lo`` (the value in force at the left edge).

    A point at time ``t`` falls in bucket ``floor((t - t_lo) * n_buckets / span)`` (float64, clipped to
    the first and last bucket), ``span`` = ``t_hi - t_lo`` (at least 1).

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
    t = time_us[lo:hi]
    span = max(float(t_hi - t_lo), 1.0)
    starts = _bucket_starts(t, t_lo, span, n_buckets)
    bounds = np.append(starts, len(t)).tolist()
    v = key[lo:hi]
    extremes = np.empty(2 * len(starts), dtype=np.int64)
    for j in range(len(starts)):  # a few thousand buckets: argmax/argmin per bucket beats a pass per point
        a, b = bounds[j], bounds[j + 1]
        part = v[a:b]
        extremes[2 * j] = a + int(part.argmax())
        extremes[2 * j + 1] = a + int(part.argmin())
    ends = np.asarray(bounds[1:], dtype=np.int64) - 1
    keep = np.unique(np.concatenate((starts, ends, extremes)))
    return keep + lo


def _bucket(x: np.ndarray, t_lo: int, span: float, n_buckets: int) -> np.ndarray:
    """The bucket of each time ``x`` (the formula of :func:`bucket_indices`)."""
    return np.clip(((x.astype(np.float64) - t_lo) * n_buckets / span).astype(np.int64), 0, n_buckets - 1)


def _bucket_starts(t: np.ndarray, t_lo: int, span: float, n_buckets: int) -> np.ndarray:
    """The index of the first point of every non-empty bucket of the non-decreasing times ``t``."""
    if not np.issubdtype(t.dtype, np.integer):  # no integer thresholds to search: each point's bucket
        bucket = _bucket(t, t_lo, span, n_buckets)
        return np.flatnonzero(np.concatenate(([True], bucket[1:] != bucket[:-1])))
    # the bucket is non-decreasing in t: bucket k >= 1 starts at the least integer time x with bucket(x) >= k,
    # estimated, then corrected by whole microseconds (float rounding moves it by one at most)
    k = np.arange(1, n_buckets, dtype=np.int64)
    x = t_lo + np.ceil(k * span / n_buckets).astype(np.int64)
    for _ in range(64):
        low = _bucket(x - 1, t_lo, span, n_buckets) >= k  # x - 1 is already in bucket k: step back
        high = _bucket(x, t_lo, span, n_buckets) < k  # x is not yet in bucket k: step on
        if not low.any() and not high.any():
            break
        x = x - low + high
    pos = np.searchsorted(t, x, side="left")
    return np.unique(np.concatenate(([0], pos[pos < len(t)])))
