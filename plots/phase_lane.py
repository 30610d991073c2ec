"""Phase labels that never overlap: choose, for every phase bar, where its name goes.

Phases are drawn as bars in rows, one row per nesting depth, above the memory plot. A bar's label is its
name, as the trace recorded it (the names reports and diffs use; never a made-up short form): inside the bar
if it fits; else just to its right when that stretch of its row is free; else in one of the overflow rows
above the lane, starting right at its bar's middle (or ending there when no row is left on its right), joined to the
bar by a straight vertical tick; else a cut name inside the bar ("determine_av…"); else nothing. An overflow
label takes the lowest overflow row where it overlaps no other label and where no tick passes through its
text (a tick rises through every row below its own label's), so ticks never cross a name; they are placed
right to left, so a cluster of short phases climbs leftwards. The phases a landmark falls in (the peak, the
crossing, the OOM: ``first``) claim the free stretches of their row first. Pure layout arithmetic over
pixel widths; the renderer draws what this decides.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PhaseBar:
    """A phase to draw: bar from start_s to end_s in row ``depth``."""

    path: str
    name: str
    depth: int
    start_s: float
    end_s: float


@dataclass(frozen=True)
class PhaseLabel:
    """The label chosen for one bar: its text, its row and where it starts or is centred.

    ``where`` is "inside" (centred in the bar), "right" (just right of the bar, in its row, starting
    with an arrow) or "above" (in overflow row ``row`` above the lane, starting at ``x_s``, joined to the
    bar's middle ``anchor_s`` by a vertical tick).
    """

    path: str
    text: str
    depth: int
    x_s: float
    where: str
    anchor_s: float
    row: int = 0  # the overflow row (0 right above the lane), for "above" labels

    @property
    def inside(self) -> bool:
        return self.where == "inside"


#: Room between an overflow label's tick and its text.
TICK_GAP_PX = 3.0
#: At most this many overflow rows above the lane.
MAX_OVERFLOW_ROWS = 3


def _width_s(text: str, px_per_s: float, char_px: float, pad_px: float) -> float:
    return (len(text) * char_px + pad_px) / px_per_s


def _free(lo: float, hi: float, taken: list[tuple[float, float]]) -> bool:
    return all(hi <= a or lo >= b for a, b in taken)


def _inside(b: PhaseBar, px_per_s: float, char_px: float, pad_px: float, cut: bool) -> PhaseLabel | None:
    """The name, when it fits in the bar (a cut name too when ``cut``)."""
    width_px = (b.end_s - b.start_s) * px_per_s
    mid = (b.start_s + b.end_s) / 2
    if len(b.name) * char_px + pad_px <= width_px:
        return PhaseLabel(b.path, b.name, b.depth, mid, "inside", mid)
    n = int((width_px - pad_px) / char_px) - 1
    if cut and n >= 4:
        return PhaseLabel(b.path, b.name[:n] + "…", b.depth, mid, "inside", mid)
    return None


def _right(
    b: PhaseBar,
    taken: list[tuple[float, float]],
    px_per_s: float,
    char_px: float,
    pad_px: float,
    x_max: float = float("inf"),
):
    start = b.end_s + pad_px / 2 / px_per_s
    text = "← " + b.name
    end = start + _width_s(text, px_per_s, char_px, pad_px)
    if end <= x_max and _free(start, end, taken):
        taken.append((start, end))
        return PhaseLabel(b.path, text, b.depth, start, "right", (b.start_s + b.end_s) / 2)
    return None


@dataclass(frozen=True)
class _Placed:
    lo: float
    hi: float
    tick: float
    row: int


def _row_for(lo: float, hi: float, tick: float, placed: list[_Placed]) -> int | None:
    """The lowest overflow row where [lo, hi] overlaps no label, no tick below its own label crosses it,
    and its own tick crosses no label; None when no row up to :data:`MAX_OVERFLOW_ROWS` qualifies."""
    above = max([p.row for p in placed if lo <= p.tick <= hi], default=-1)  # their ticks: go above them
    below = min([p.row for p in placed if p.lo <= tick <= p.hi], default=MAX_OVERFLOW_ROWS)  # stay under them
    busy = {p.row for p in placed if p.lo < hi and lo < p.hi}
    return next((r for r in range(above + 1, below) if r not in busy), None)


def _above(
    b: PhaseBar,
    placed: list[_Placed],
    px_per_s: float,
    char_px: float,
    pad_px: float,
    x_min: float,
    x_max: float = float("inf"),
    pending: tuple[float, ...] = (),
) -> PhaseLabel | None:
    """In the lowest overflow row free for it, starting just right of the bar's middle, else (no row
    left there, or the figure's edge) ending just left of it, over none of the ``pending`` ticks."""
    mid = (b.start_s + b.end_s) / 2
    w = _width_s(b.name, px_per_s, char_px, pad_px)
    gap = TICK_GAP_PX / px_per_s
    options = []  # (row, where the name starts): right of its tick first, else left of it
    for lo in (mid + gap, mid - gap - w):
        # a name left of its tick must leave the ticks of the bars still to place (further left) free
        left_ok = lo > mid or not any(lo <= t <= lo + w for t in pending)
        if lo >= x_min and lo + w <= x_max and left_ok:
            row = _row_for(lo, lo + w, mid, placed)
            if row is not None:
                options.append((row, lo))
    if not options:
        return None
    row, lo = options[0]
    placed.append(_Placed(lo, lo + w, mid, row))
    return PhaseLabel(b.path, b.name, b.depth, lo, "above", mid, row)


def place_labels(
    bars: list[PhaseBar],
    px_per_s: float,
    char_px: float,
    pad_px: float = 6.0,
    x_min: float = 0.0,
    x_max: float = float("inf"),
    first: frozenset[str] | set[str] = frozenset(),
) -> list[PhaseLabel]:
    """Pick a non-overlapping label for each bar (bars of one row must not overlap in time).

    In order of preference: the name inside the bar; then, for bars left without one, "← name" just
    right of the bar in an empty stretch of its row; then an overflow row above the lane (at the bar's
    middle, with a vertical tick that crosses no name); last, a cut name inside the bar. A bar with room
    for none of these stays unlabelled. Bars whose path is in ``first`` claim their row's free stretches first.

    Args:
        bars: the phases.
        px_per_s: horizontal scale of the drawing (pixels per second).
        char_px: average width of one character of the label font, in pixels.
        pad_px: free space kept around each label.
        x_min: the left edge of the drawing (seconds); overflow labels start no further left.
        x_max: the right edge of the figure (seconds); overflow labels end no further right.
        first: paths of the bars to label before the others (where a landmark falls).
    """
    labels: list[PhaseLabel] = []
    rows: dict[int, list[PhaseBar]] = {}
    for b in bars:
        rows.setdefault(b.depth, []).append(b)
    left: list[PhaseBar] = []  # bars whose row has no room for their name
    for depth in sorted(rows):
        row = sorted(rows[depth], key=lambda b: b.start_s)
        inside = {id(b): _inside(b, px_per_s, char_px, pad_px, cut=False) for b in row}
        # a label to the right of its bar may only use the row's empty stretches
        taken = [(b.start_s, b.end_s) for b in row]
        for b in sorted(row, key=lambda b: b.path not in first):
            lab = inside[id(b)] or _right(b, taken, px_per_s, char_px, pad_px, x_max)
            if lab is not None:
                labels.append(lab)
            else:
                left.append(b)
    overflow: list[_Placed] = []
    # right to left: each label's text then only ever covers ticks of labels placed before it (to its
    # right), so it goes above them; a staircase rising leftwards, always possible up to the row limit
    order = sorted(left, key=lambda b: (-(b.start_s + b.end_s) / 2, b.depth))
    for k, b in enumerate(order):
        pending = tuple((c.start_s + c.end_s) / 2 for c in order[k + 1 :])
        lab = _above(b, overflow, px_per_s, char_px, pad_px, x_min, x_max, pending) or _inside(
            b, px_per_s, char_px, pad_px, cut=True
        )
        if lab is not None:
            labels.append(lab)
    return labels
