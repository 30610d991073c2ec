"""The timeline's time axis: broken where memory stayed flat for long, so start-up's busy seconds are legible.

A vLLM start-up spends minutes in ``profile_run`` (compiling) with memory flat, then does everything that
matters (the KV cache, warm-up, CUDA-graph capture) in a few seconds: on a linear axis those seconds are the
last pixels. :func:`time_scale` finds the *quiet stretches* (longer than :data:`MIN_QUIET_FRAC` of the run,
holding no phase edge and no landmark, over which no drawn curve moves by more than :data:`FLAT_FRAC` of the
plot's height); when the longest :data:`MAX_BREAKS` of them together last half the run or more, each is
squeezed into :data:`BREAK_FRAC` of the axis and the busy rest shares the width linearly. Nothing is dropped:
the curves are drawn through a break at its own (compressed) scale, and the renderer marks each break and
states its length.

Pure arithmetic on microseconds and seconds; ``TimeScale.forward``/``inverse`` feed matplotlib's function
scale. Without quiet stretches the scale is the identity (the axis as before).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: A stretch is squeezed only when it lasts at least this share of the run...
MIN_QUIET_FRAC = 0.1
#: ...and is one of the longest few: a broken axis, not a chopped one...
MAX_BREAKS = 2
#: ...and only when the squeezed stretches together last at least this share of it (half the run flat: a
#: short start-up, busy throughout, keeps its linear axis).
MIN_TOTAL_QUIET_FRAC = 0.5
#: Memory counts as flat while no curve moves by more than this share of the plot's height.
FLAT_FRAC = 0.01
#: The share of the axis width each squeezed stretch keeps.
BREAK_FRAC = 0.035
#: With a gap in the record, the least share of the busy width each busy stretch is drawn with.
MIN_BUSY_FRAC = 0.3
#: Bins over the run the search works in (a stretch starts and ends on their edges).
N_BINS = 1000


@dataclass(frozen=True)
class TimeScale:
    """A piecewise-linear map from seconds since t0 to drawn seconds (the same range, [0, span_s]).

    ``breaks`` are the squeezed stretches, in seconds since t0. ``forward`` and ``inverse`` extend the end
    segments' slopes beyond the range (matplotlib asks for margins and ticks there)."""

    span_s: float
    knots_s: tuple[float, ...] = (0.0, 1.0)
    knots_drawn: tuple[float, ...] = (0.0, 1.0)
    breaks: tuple[tuple[float, float], ...] = ()
    #: the breaks that are gaps in the record (a serving window's dropped time), not flat memory
    gaps: tuple[tuple[float, float], ...] = ()

    def forward(self, s):
        return _interp(np.asarray(s, dtype=np.float64), self.knots_s, self.knots_drawn)

    def inverse(self, d):
        return _interp(np.asarray(d, dtype=np.float64), self.knots_drawn, self.knots_s)

    def fraction(self, s: float) -> float:
        """Where ``s`` seconds fall across the axis (0 left edge, 1 right edge)."""
        return float(self.forward(s)) / self.span_s if self.span_s else 0.0

    def at_fraction(self, f: float) -> float:
        """The seconds at fraction ``f`` of the axis width."""
        return float(self.inverse(f * self.span_s))


def _interp(x: np.ndarray, xs: tuple[float, ...], ys: tuple[float, ...]) -> np.ndarray:
    """``np.interp`` that extends its first and last segments linearly instead of clamping."""
    y = np.interp(x, xs, ys)
    lo = (ys[1] - ys[0]) / (xs[1] - xs[0])
    hi = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
    y = np.where(x < xs[0], ys[0] + (x - xs[0]) * lo, y)
    return np.where(x > xs[-1], ys[-1] + (x - xs[-1]) * hi, y)


def identity(span_s: float) -> TimeScale:
    """The unbroken axis."""
    span = max(span_s, 1e-6)
    return TimeScale(span, (0.0, span), (0.0, span))


def _bin_ranges(t_us: np.ndarray, b: np.ndarray, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per bin, the lowest and highest value the step curve (t_us, b) takes inside it (the value in force
    at the bin's start included); ``t_us`` non-decreasing."""
    n = len(edges) - 1
    start = np.clip(np.searchsorted(t_us, edges[:-1], side="right") - 1, 0, None)
    lo = b[start].astype(np.float64)
    hi = lo.copy()
    if not len(t_us):
        return lo, hi
    # in time order (as every curve's times are): each bin's values are one run, reduced at once; where each
    # run starts is searched for each edge (not each point's bin: at 10M events that took half a second)
    i0, i1 = np.searchsorted(t_us, edges[0], side="left"), np.searchsorted(t_us, edges[-1], side="right")
    if i1 <= i0:
        return lo, hi
    t = t_us[i0:i1]
    # integer times: t >= edge exactly when t >= ceil(edge), so the times are searched as they are
    firsts = np.searchsorted(t, np.ceil(edges).astype(np.int64) if t.dtype.kind in "iu" else edges, side="left")
    starts = np.unique(np.concatenate(([0], firsts[(firsts > 0) & (firsts < len(t))])))
    k = np.clip(np.searchsorted(firsts, starts, side="right") - 1, 0, n - 1)  # the bin of each run
    starts = starts[np.concatenate(([True], k[1:] != k[:-1]))]  # runs clipped into one bin are one
    bins, values = np.clip(np.searchsorted(firsts, starts, side="right") - 1, 0, n - 1), b[i0:i1]
    lo[bins] = np.minimum(lo[bins], np.minimum.reduceat(values, starts))
    hi[bins] = np.maximum(hi[bins], np.maximum.reduceat(values, starts))
    return lo, hi


def quiet_stretches(
    curves: list[tuple[np.ndarray, np.ndarray]],
    marks_us: list[int],
    start_us: int,
    end_us: int,
    flat_bytes: float,
    min_us: float,
    n_bins: int = N_BINS,
) -> list[tuple[int, int]]:
    """[lo, hi] microseconds of each stretch at least ``min_us`` long, holding none of ``marks_us`` (phase
    edges, landmarks), over which every curve of ``curves`` ((time_us, bytes) steps) stays within
    ``flat_bytes``. A bin edge away from where memory moves, so a step in or out stays at full scale."""
    if end_us <= start_us or not curves:
        return []
    edges = np.linspace(start_us, end_us, n_bins + 1)
    ranges = [_bin_ranges(t, b, edges) for t, b in curves if len(t)]
    if not ranges:
        return []
    los, his = np.array([r[0] for r in ranges]), np.array([r[1] for r in ranges])
    blocked = np.zeros(n_bins, dtype=bool)
    marks = np.asarray(marks_us, dtype=np.float64)
    if len(marks):
        k = np.searchsorted(edges, marks, side="right") - 1
        blocked[k[(k >= 0) & (k < n_bins)]] = True
    out: list[tuple[int, int]] = []
    first, run_lo, run_hi = None, None, None

    def close(last: int) -> None:
        # keep the bins next to the stretch at full scale: they hold the step into it and out of it
        a, b = first + 1, last - 1
        if b > a and edges[b] - edges[a] >= min_us:
            out.append((int(edges[a]), int(edges[b])))

    for i in range(n_bins):
        if blocked[i]:
            if first is not None:
                close(i)
            first = None
            continue
        if first is None:
            first, run_lo, run_hi = i, los[:, i].copy(), his[:, i].copy()
            continue
        lo, hi = np.minimum(run_lo, los[:, i]), np.maximum(run_hi, his[:, i])
        if np.any(hi - lo > flat_bytes):
            close(i)
            first, run_lo, run_hi = i, los[:, i].copy(), his[:, i].copy()
        else:
            run_lo, run_hi = lo, hi
    if first is not None:
        close(n_bins)
    return out


def time_scale(
    stretches_us: list[tuple[int, int]], t0_us: int, t_end_us: int, gaps_us: list[tuple[int, int]] = ()
) -> TimeScale:
    """The axis that squeezes the longest :data:`MAX_BREAKS` of ``stretches_us`` (from :func:`quiet_stretches`),
    or the identity when they are too short together to be worth a break. ``gaps_us`` (time nothing was kept
    for: a serving window's gap) are squeezed always, and quiet stretches overlapping them are not; the gaps of
    several ranks that overlap are squeezed where they overlap (the time none of them recorded)."""
    span = max((t_end_us - t0_us) / 1e6, 1e-6)
    gaps_us = shared_gaps(gaps_us)
    free = [(a, b) for a, b in stretches_us if not any(a < gb and ga < b for ga, gb in gaps_us)]
    longest = sorted(free, key=lambda ab: (ab[0] - ab[1], ab[0]))[:MAX_BREAKS]
    quiet = [((a - t0_us) / 1e6, (b - t0_us) / 1e6) for a, b in sorted([*longest, *gaps_us])]
    gaps = tuple(((a - t0_us) / 1e6, (b - t0_us) / 1e6) for a, b in sorted(gaps_us))
    total = sum(b - a for a, b in quiet)
    if not quiet or (not gaps and total < MIN_TOTAL_QUIET_FRAC * span):
        return identity(span)
    squeezed = BREAK_FRAC * span
    busy = span - total
    room = span - squeezed * len(quiet)
    if room <= 0 or busy <= 0:
        return identity(span)
    edges = [0.0, *[x for ab in quiet for x in ab], span]
    lengths = [b - a for a, b in zip(edges[::2], edges[1::2], strict=True)]
    # with a gap, each busy stretch is drawn at least MIN_BUSY_FRAC of the busy width: a serving window of
    # a second after a start-up of minutes stays legible
    widths = [max(n, MIN_BUSY_FRAC * busy) if gaps and n > 0 else n for n in lengths]
    k_of = [room * w / sum(widths) / n if n > 0 else 0.0 for n, w in zip(lengths, widths, strict=True)]
    knots_s, knots_d, d, prev = [0.0], [0.0], 0.0, 0.0
    for (a, b), k in zip(quiet, k_of, strict=False):
        d += (a - prev) * k
        knots_s.append(a)
        knots_d.append(d)
        d += squeezed
        knots_s.append(b)
        knots_d.append(d)
        prev = b
    knots_s.append(span)
    knots_d.append(d + (span - prev) * k_of[-1])
    return TimeScale(span, tuple(knots_s), tuple(knots_d), tuple(quiet), gaps)


def shared_gaps(gaps_us) -> list[tuple[int, int]]:
    """``gaps_us`` in time order, those that overlap (one per rank of a served run) reduced to their overlap."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(gaps_us):
        if out and a < out[-1][1]:
            out[-1] = (a, min(b, out[-1][1]))
        else:
            out.append((a, b))
    return out


def ticks(scale: TimeScale, width_px: float, min_gap_px: float = 55.0) -> list[float]:
    """Tick positions in seconds: round values in each busy stretch, as many as its drawn width holds,
    none closer than ``min_gap_px`` to the previous one."""
    from matplotlib.ticker import MaxNLocator

    px = width_px / scale.span_s  # pixels per drawn second
    bounds = [0.0, *[x for br in scale.breaks for x in br], scale.span_s]
    out: list[float] = []
    for a, b in zip(bounds[::2], bounds[1::2], strict=True):
        seg_px = (float(scale.forward(b)) - float(scale.forward(a))) * px
        if seg_px < min_gap_px and len(bounds) > 2:  # a sliver between two breaks: no tick of its own
            continue
        n = max(int(seg_px // 90), 1)
        values = MaxNLocator(n, steps=[1, 2, 2.5, 5, 10]).tick_values(a, b)
        for v in (float(x) for x in values if a - 1e-9 <= x <= b + 1e-9):
            if not out or (float(scale.forward(v)) - float(scale.forward(out[-1]))) * px >= min_gap_px:
                out.append(v)
    return out
