"""Phase labels that never overlap: choose, for every phase bar, the longest label that fits.

Phases are drawn as bars in rows, one row per nesting depth, above the memory plot. A bar's label
is its name if it fits inside the bar, else a known abbreviation of vLLM's method names, else a
cut name ("determine_av…"), else nothing. Short phases that get no label inside their bar may put
it just to the right, when the space up to the next label in that row is free. Pure layout
arithmetic over pixel widths; the renderer draws what this decides.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Short names for vLLM's phases (method names), tried when the full name does not fit.
ABBREVIATIONS = {
    "init_device": "init",
    "load_model": "load",
    "determine_available_memory": "determine_avail_mem",
    "profile_run": "profile",
    "profile_cudagraph_memory": "profile_cg",
    "cudagraph_profile": "cg_profile",
    "initialize_from_config": "init_from_config",
    "initialize_kv_cache": "init_kv",
    "kv_cache_init": "kv_init",
    "compile_or_warm_up_model": "warm-up",
    "compile_or_warm_up": "warm-up",
    "capture_model": "capture",
    "kernel_warmup": "kwarmup",
    "_dummy_run": "dummy",
    "_dummy_sampler_run": "sampler",
}


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


def candidates(name: str) -> list[str]:
    """Labels to try, longest first."""
    out = [name]
    short = ABBREVIATIONS.get(name)
    if short is None and name.startswith("_"):
        short = name.lstrip("_")
    if short and short != name:
        out.append(short)
    return out


def _width_s(text: str, px_per_s: float, char_px: float, pad_px: float) -> float:
    return (len(text) * char_px + pad_px) / px_per_s


def _free(lo: float, hi: float, taken: list[tuple[float, float]]) -> bool:
    return all(hi <= a or lo >= b for a, b in taken)


def _inside(b: PhaseBar, px_per_s: float, char_px: float, pad_px: float, cut: bool) -> PhaseLabel | None:
    """The longest name or abbreviation that fits in the bar (a cut name too when ``cut``)."""
    width_px = (b.end_s - b.start_s) * px_per_s
    mid = (b.start_s + b.end_s) / 2
    for text in candidates(b.name):
        if len(text) * char_px + pad_px <= width_px:
            return PhaseLabel(b.path, text, b.depth, mid, "inside", mid)
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
    for text in reversed(candidates(b.name)):
        text = "← " + text
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
    """In the overflow row: as close to the bar's middle as the labels already there allow."""
    # (the leader line needs the label to start at or left of the bar's middle to stay short)
    mid = (b.start_s + b.end_s) / 2
    text = candidates(b.name)[0]
    w = _width_s(text, px_per_s, char_px, pad_px)
    start = max(mid - w / 2, x_min)
    for lo, hi in sorted(taken):
        if start < hi and start + w > lo:
            start = hi
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

    In order of preference: the longest name or abbreviation that fits inside the bar; then, for
    bars left without one, "← name" just right of the bar in an empty stretch of its row; then the
    overflow row above the lane (with a leader line); last, a cut name inside the bar. A bar with
    room for none of these stays unlabelled.

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
    overflow: list[tuple[float, float]] = []
    for depth in sorted(rows):
        row = sorted(rows[depth], key=lambda b: b.start_s)
        inside = {id(b): _inside(b, px_per_s, char_px, pad_px, cut=False) for b in row}
        # a label to the right of its bar may only use the row's empty stretches
        taken = [(b.start_s, b.end_s) for b in row]
        for b in row:
            lab = (
                inside[id(b)]
                or _right(b, taken, px_per_s, char_px, pad_px, x_max)
                or _above(b, overflow, px_per_s, char_px, pad_px, x_min, x_max)
                or _inside(b, px_per_s, char_px, pad_px, cut=True)
            )
            if lab is not None:
                labels.append(lab)
    return labels
