"""The report of an analysed run (``analysis.run.AnalysedRun``): what ``memtrace report`` prints.

Every rank's section (``plots.text.render_report`` of its analysed rank), then for a run of several ranks the
ranks side by side (``run.side_by_side``) and the worst rank (``AnalysedRun.worst``), the ranks
``nodes.json`` lists that are missing from the run directory, the time origin every time counts from,
and the definitions.
"""

from __future__ import annotations

from typing import TextIO

from memtrace.analysis.analysed.origin import who
from memtrace.analysis.analysed.verdict import DIED, NOTHING, UNFINISHED
from memtrace.analysis.memory import quantities
from memtrace.plots import oom_text, verdict_text
from memtrace.plots.text import _CURVE_NAMES, _Out, _seconds, render_definitions, render_report, wrap
from memtrace.units import gib_or_dash, size_column


def worst_line(run) -> str:
    """Why the run's worst rank (``analysis.run.AnalysedRun.worst``) is the worst, in one line."""
    w = run.worst
    if run.verdict == NOTHING:
        return f"Nothing to judge: {who([r.label for r in run.ranks])} recorded no allocator events"
    if w.oom is not None:
        why = f"died of CUDA OOM at {_seconds(w, w.oom.time_us)} {oom_text.where(w.oom)}"
    elif w.first_crossing is not None:
        c = max(w.crossing_list, key=lambda c: c.overshoot_bytes)
        why = f"{_CURVE_NAMES.get(c.curve, c.curve)} goes {gib_or_dash(c.overshoot_bytes)} over its target"
    else:
        why = f"highest {_CURVE_NAMES[run.ranked_by.key]} peak, {gib_or_dash(w.ranked_peak.bytes)}"
    return f"Worst: {w.label} ({why})"


def _side_by_side(out: _Out, run) -> None:
    from memtrace.analysis.analysed.run import side_by_side

    sbs = side_by_side(run)
    if sbs is None:
        return
    out.heading("Ranks side by side")
    col = size_column(r.peak_bytes for r in sbs.rows)
    rows = [
        [r.label, col.cell(r.peak_bytes), _seconds(run.worst, r.time_us), r.verdict, r.phase_path or "-"]
        for r in sbs.rows
    ]
    out.table(["process", f"peak {_CURVE_NAMES[sbs.quantity]} {col.unit}", "at", "verdict", "phase"], rows, "lrrll")
    if len(sbs.top_ranks) > 1:  # a tie: nobody peaked higher
        names = ", ".join(sbs.top_ranks[:-1]) + " and " + sbs.top_ranks[-1]
        lead = f"{names} peaked equally ({gib_or_dash(sbs.rows[0].peak_bytes)})"
    else:
        lead = f"{sbs.top} peaked {gib_or_dash(sbs.top_excess_bytes)} higher than the next ({sbs.rows[1].label})"
    out.item(f"{lead}; {sbs.first} peaked first, at {_seconds(run.worst, sbs.first_us)}")


def render_missing(file: TextIO, run, markdown: bool = False) -> None:
    """One MISSING line per trace ``nodes.json`` lists and the run directory lacks."""
    for m in run.missing:
        file.write(("- **" if markdown else "") + m.line + ("**" if markdown else "") + "\n")


def render(run, file: TextIO, *, width: int = 100, markdown: bool = False) -> None:
    """The report of an analysed run (``analysis.run.AnalysedRun``): every rank, one section each, the ranks
    side by side, the missing ranks, the worst rank named, the time origin, then the definitions. A run that
    died or recorded nothing says so in its first line (``plots.verdict_text``)."""
    if run.verdict in (DIED, NOTHING, UNFINISHED):
        line = verdict_text.headline(run)
        file.write(f"**{line}**\n\n" if markdown else "\n".join(wrap(line, width)) + "\n\n")
    for i, r in enumerate(run.ranks):
        if i:
            file.write("\n" + ("---\n" if markdown else "=" * min(width, 100) + "\n"))
        render_report(r, file, width, markdown)
    out = _Out(file, width, markdown)
    if run.multi:
        _side_by_side(out, run)
        file.write("\n" + ("**" if markdown else "") + worst_line(run) + ("**" if markdown else "") + "\n")
    if run.missing:
        file.write("\n")
        render_missing(file, run, markdown)
    if run.multi:
        file.write(f"Times: {run.origin.sentence}\n")
    held = {
        q
        for r in run.ranks
        for q in quantities.present(r.curves, r.trace.process, oom=r.oom is not None, window=r.window is not None)
    }
    shown = tuple(q for q in quantities.QUANTITIES if q in held)
    render_definitions(file, width, markdown, shown, quantities.memory_meanings([t.process for t in run.traces]))
