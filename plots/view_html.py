"""Write ``memtrace view``'s page: one self-contained HTML file (CSS, JavaScript and data inline).

The page's code is ``assets/view_units.js`` (sizes: the one rule of ``units``, ported), ``assets/view.js``
(the model: decoding, curves, live sets), ``assets/view_gap.js`` (a serving window's gap: the broken axis's
ticks, the hatched band, a click there), ``assets/view_ui.js`` (charts, tables) and ``assets/view.css``; the
charts are drawn by the vendored uPlot (``assets/VENDORED.md``). Data comes from ``view_data.pack_rank``: a
JSON document per rank and its gzip'd columns in base64. Nothing is fetched from the network; a page written
with ``api=True`` (``memtrace view --serve``) asks the server it came from for zoomed windows and live sets.
"""

from __future__ import annotations

import base64
import html
import io
import json
from importlib import resources
from typing import Any

from memtrace.plots import verdict_text
from memtrace.plots.report import render as render_report
from memtrace.plots.report import worst_line
from memtrace.plots.view_data import PackedRank, pack_rank, time_axis
from memtrace.plots.whatif_text import boot_section

#: Width in pixels of the coarse overview a page without its events carries.
OVERVIEW_WIDTH = 1600

_ASSETS = ("uPlot.min.css", "view.css", "uPlot.iife.min.js", "view_units.js", "view.js", "view_gap.js", "view_ui.js")


def asset(name: str) -> str:
    """The text of a file in ``memtrace.plots/assets``."""
    return resources.files(__package__).joinpath("assets", name).read_text(encoding="utf-8")


def _script_safe(text: str) -> str:
    """Text that cannot close the <script> element it sits in."""
    return text.replace("</", "<\\/")


def page_document(ranks: list[PackedRank], *, title: str, report_text: str, api: bool, run=None) -> dict[str, Any]:
    """The page's JSON document (every rank's meta and column table; the run's worst rank, missing ranks)."""
    return {
        "title": title,
        # the run's verdict, said first under the title (a run that died or recorded nothing above all)
        "headline": verdict_text.headline(run) if run is not None else None,
        "verdict": run.verdict if run is not None else None,
        "api": api,
        "report": report_text,
        "worst": worst_line(run) if run is not None and run.multi else None,
        "missing": [m.line for m in run.missing] if run is not None else [],
        "ranks": [_rank_doc(r) for r in ranks],
        "x_scale": time_axis(ranks),  # the serving gap squeezed; None: a linear time axis
    }


def _rank_doc(r: PackedRank) -> dict[str, Any]:
    """One rank's part of the page's document, with its serving window's (``PackedRank.window``) when it has one."""
    doc = {**r.meta, "columns": r.columns}
    if r.window is not None:
        doc["window"] = {**r.window.meta, "columns": r.window.columns}
    return doc


def _blobs(ranks: list[PackedRank]) -> str:
    """The gzip'd columns in base64, one script element each: ``mt-blob-<rank>`` (start-up, or the whole run)
    and ``mt-blob-<rank>-serving`` (its serving window)."""
    parts = [(f"{i}", r) for i, r in enumerate(ranks)]
    parts += [(f"{i}-serving", r.window) for i, r in enumerate(ranks) if r.window is not None]
    return "\n".join(
        f'<script type="application/octet-stream" id="mt-blob-{key}">{base64.b64encode(p.blob).decode("ascii")}</script>'
        for key, p in parts
    )


def render_html(ranks: list[PackedRank], run, *, title: str, api: bool = False) -> str:
    """The whole page as a string."""
    buf = io.StringIO()
    render_report(run, buf)  # as `memtrace report` prints it
    doc = page_document(ranks, title=title, report_text=buf.getvalue(), api=api, run=run)
    doc["boot"] = "\n".join(boot_section(run, markdown=False)[2:])  # fits --suggest: the issue bundle's words
    blobs = _blobs(ranks)
    doc_json = json.dumps(doc, separators=(",", ":")).replace("<", "\\u003c")  # no "</script>" or "<!--" inside
    css = "\n".join(asset(n) for n in _ASSETS if n.endswith(".css"))
    js = "\n".join(_script_safe(asset(n)) for n in _ASSETS if n.endswith(".js"))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>{html.escape(title)}</title>
<style>{css}</style>
</head><body>
<div id="mt-app"></div>
<script type="application/json" id="mt-doc">{doc_json}</script>
{blobs}
<script>{js}</script>
</body></html>
"""


def build_page(run, *, title: str | None = None, max_events: int, api: bool) -> str:
    """The page of an analysed run (``analysis.run.AnalysedRun``): with every event when the run holds at most
    ``max_events``, else a coarse overview per rank (``api``: the page asks its server for the rest). The
    title names what ran (``analysis.titles.timeline_title``), as the timeline's does."""
    from memtrace.analysis.analysed.titles import timeline_title

    t0 = run.origin.t0_us
    parts = [a for r in run.ranks for a in (r, r.serving) if a is not None]  # a serving window's events count too
    with_events = sum(len(a.event_times) for a in parts) <= max_events
    packed = []
    for r in run.ranks:
        p = pack_rank(r, t0, with_events=with_events)
        if not with_events:
            for part, a in ((p, r), (p.window, r.serving)):
                if part is not None:
                    m = part.meta
                    m["overview"] = a.queries.window(m["start_us"] / 1e6, m["end_us"] / 1e6, OVERVIEW_WIDTH)
        packed.append(p)
    return render_html(packed, run, title=title or timeline_title(run), api=api)


def render(run, out, *, max_events: int, title: str | None = None) -> None:
    """Write the offline page of ``run`` to the path ``out``."""
    from pathlib import Path

    Path(out).write_text(build_page(run, title=title, max_events=max_events, api=False), encoding="utf-8")
