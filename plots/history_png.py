"""The trend of a run history: a PNG with one panel per matrix key (and rank), one line per gated
figure, and the same runs as a text table.

Reads ``analysis.history.trends`` only. The x axis is the run's place in the history (its batch);
filled markers are accepted runs (references for ``history check``), hollow ones were refused (grew
past the threshold). Each line is the figure's change since the key's first stored run, so that a
1 GiB growth shows next to a 130 GiB peak; the legend gives the latest value and that change. matplotlib (Agg) is imported
inside :func:`render_history`.
"""

from __future__ import annotations

from pathlib import Path

from memtrace.units import GiB, format_gib

WIDTH_IN = 13.0
PANEL_IN = 3.4
DPI = 110
SHORT = {
    "peak reserved": "peak reserved",
    "peak device used": "peak device",
    "memory before KV sizing": "before KV",
    "available KV cache (vLLM)": "available KV",
    "all hooked calls": "hooked calls",
}
COLORS = {
    "peak reserved": "#1f77b4",
    "peak device used": "#9467bd",
    "memory before KV sizing": "#d62728",
    "available KV cache (vLLM)": "#2ca02c",
    "all hooked calls": "#ff7f0e",
}


def _panel(ax, trend) -> None:
    for name, pts in trend.series.items():
        color = COLORS.get(name, "#444444")
        first = pts[0].bytes
        xs = [p.batch for p in pts]
        ys = [(p.bytes - first) / GiB for p in pts]
        now = f"{format_gib(pts[-1].bytes)} now, {_signed(pts[-1].bytes - first)}"
        ax.plot(xs, ys, "-", color=color, lw=1.6, label=f"{SHORT.get(name, name)} ({now})")
        for p, y in zip(pts, ys, strict=True):
            ax.plot(p.batch, y, "o", ms=6, color=color, mfc=color if p.accepted else "white", mew=1.5)
    batches = sorted({p.batch for pts in trend.series.values() for p in pts})
    labels = {p.batch: p.label for pts in trend.series.values() for p in pts}
    ax.set_xticks(batches)
    ax.set_xticklabels([f"#{b}\n{labels[b][:18]}" for b in batches], fontsize=8)
    if batches:
        ax.set_xlim(batches[0] - 0.5, batches[-1] + 0.5)
    ax.axhline(0, color="#888888", lw=0.8)
    lo, hi = ax.get_ylim()
    ax.set_ylim(min(lo, -0.5), max(hi, 0.5))  # at least ±0.5 GiB: flat lines stay flat
    ax.set_ylabel("GiB since the first run")
    ax.grid(True, axis="y", alpha=0.3)
    rank = f" · rank {trend.rank}" if trend.rank is not None else ""
    ax.set_title(f"{trend.title}{rank}   [key {trend.key}]", fontsize=9, loc="left")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def _signed(n: int) -> str:
    if n == 0:
        return "±0"
    return ("+" if n > 0 else "-") + format_gib(abs(n))


def render_history(trends: list, out: Path, *, title: str = "memtrace history") -> Path:
    """Draw ``trends`` into ``out`` (PNG or SVG by its suffix); returns ``out``."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    n = max(1, len(trends))
    fig, axes = plt.subplots(n, 1, figsize=(WIDTH_IN, PANEL_IN * n + 0.6), dpi=DPI, squeeze=False)
    try:
        for ax, trend in zip(axes[:, 0], trends, strict=False):
            _panel(ax, trend)
        fig.suptitle(f"{title} — filled: accepted, hollow: refused", fontsize=10, x=0.01, ha="left")
        fig.tight_layout(rect=(0, 0, 1, 0.985))
        fig.savefig(out, dpi=DPI, format=out.suffix.lstrip(".").lower() or "png")
    finally:
        plt.close(fig)
    return out


def history_table(trends: list, rows: list) -> str:
    """The runs of each key as text: number, label, accepted or refused, and each trend figure."""
    out: list[str] = []
    status = {r.batch: "accepted" if r.accepted else "refused" for r in rows}
    for t in trends:
        rank = f" · rank {t.rank}" if t.rank is not None else ""
        out += ["", f"key {t.key}: {t.title}{rank}"]
        names = list(t.series)
        out.append(
            f"  {'run':>4}  {'label':<24} {'status':<9}" + "".join(f" {SHORT.get(n, n)[:14]:>14}" for n in names)
        )
        values = {n: {p.batch: p for p in pts} for n, pts in t.series.items()}
        batches = sorted({p.batch for pts in t.series.values() for p in pts})
        for b in batches:
            label = next(values[n][b].label for n in names if b in values[n])
            cells = "".join(f" {format_gib(values[n][b].bytes) if b in values[n] else '—':>14}" for n in names)
            out.append(f"  {'#' + str(b):>4}  {label[:24]:<24} {status.get(b, ''):<9}{cells}")
    return "\n".join(out[1:]) + "\n"
