"""Phase labels that never overlap: choose, for every phase bar, where its name goes.

Phases are drawn as bars in rows, one row per nesting depth, above the memory plot. A bar's label is its
name, as the trace recorded it (the names reports and diffs use; never a made-up short form): inside the bar
if it fits; else just to its right when that stretch of its row is free; else in an overflow row above the
lane, joined to the bar by a leader line; else a cut name inside the bar ("determine_av…"); else nothing.
Overflow labels are laid out left to right in the order of their bars, and every leader leaves the lane's
top edge (:func:`leader`), so no two leader lines cross. Pure layout arithmetic over pixel widths; the
renderer draws what this decides.
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
    with an arrow) or "above" (in the overflow row above the lane, joined to the bar's middle
    ``anchor_s`` by a leader line, starting at ``x_s``).
    """

    path: str
    text: str
    depth: int
    x_s: float
    where: str
    anchor_s: float

    @property
    def inside(self) -> bool:
        return self.where == "inside"


#: The leader line's end runs this many pixels into its label when the label starts right of its bar.
LEADER_INTO_PX = 4.0


def leader(label: PhaseLabel, px_per_s: float) -> tuple[float, float]:
    """(x at the lane's top edge, x at the overflow row) of an overflow label's leader line, in seconds.

    The line rises from the bar's middle to the lane's top edge, then runs to the label: straight up when
    the label spans its bar's middle, else to just inside the label's start. Both ends grow with the
    label's place in the row, so two leaders never cross."""
    return label.anchor_s, max(label.anchor_s, label.x_s + LEADER_INTO_PX / px_per_s)


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


def _above(
    b: PhaseBar,
    taken: list[tuple[float, float]],
    px_per_s: float,
    char_px: float,
    pad_px: float,
    x_min: float,
    x_max: float = float("inf"),
):
    """In the overflow row, right of every label placed there before (bars come left to right): as close to
    the bar's middle as they allow."""
    mid = (b.start_s + b.end_s) / 2
    text = b.name
    w = _width_s(text, px_per_s, char_px, pad_px)
    start = max([mid - w / 2, x_min, *(hi for _, hi in taken)])
    if start + w > x_max:  # it would leave the figure: end it at the edge if that stretch is free
        start = x_max - w
        if start < x_min or not _free(start, start + w, taken):
            return None
    if start - mid > 8 * w:  # too far from its bar to be read as its label
        return None
    taken.append((start, start + w))
    return PhaseLabel(b.path, text, b.depth, start, "above", mid)


def place_labels(
    bars: list[PhaseBar],
    px_per_s: float,
    char_px: float,
    pad_px: float = 6.0,
    x_min: float = 0.0,
    x_max: float = float("inf"),
) -> list[PhaseLabel]:
    """Pick a non-overlapping label for each bar (bars of one row must not overlap in time).

    In order of preference: the name inside the bar; then, for bars left without one, "← name" just
    right of the bar in an empty stretch of its row; then the overflow row above the lane (with a leader
    line; bars of every row taken left to right by their middle, so leaders never cross); last, a cut
    name inside the bar. A bar with room for none of these stays unlabelled.

    Args:
        bars: the phases.
        px_per_s: horizontal scale of the drawing (pixels per second).
        char_px: average width of one character of the label font, in pixels.
        pad_px: free space kept around each label.
        x_min: the left edge of the drawing (seconds); overflow labels start no further left.
        x_max: the right edge of the figure (seconds); overflow labels end no further right.
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
        for b in row:
            lab = inside[id(b)] or _right(b, taken, px_per_s, char_px, pad_px, x_max)
            if lab is not None:
                labels.append(lab)
            else:
                left.append(b)
    overflow: list[tuple[float, float]] = []
    for b in sorted(left, key=lambda b: ((b.start_s + b.end_s) / 2, b.depth)):
        lab = _above(b, overflow, px_per_s, char_px, pad_px, x_min, x_max) or _inside(
            b, px_per_s, char_px, pad_px, cut=True
        )
        if lab is not None:
            labels.append(lab)
    return labels
