"""Write ``memtrace view``'s page: one self-contained HTML file (CSS, JavaScript and data inline).

The page's code is ``assets/view.js`` (the model: decoding, curves, live sets), ``assets/view_ui.js``
(charts, tables) and ``assets/view.css``; the charts are drawn by the vendored uPlot
(``assets/VENDORED.md``). Data comes from ``view_data.pack_rank``: a JSON document per rank and its
gzip'd columns in base64. Nothing is fetched from the network; a page written with ``api=True``
(``memtrace view --serve``) asks the server it came from for zoomed windows and live sets.
"""

from __future__ import annotations

import base64
import html
import io
import json
from importlib import resources
from typing import Any

from .text import render_run
from .view_data import PackedRank, RankAnalysis, pack_rank, run_start

#: Width in pixels of the coarse overview a page without its events carries.
OVERVIEW_WIDTH = 1600

_ASSETS = ("uPlot.min.css", "view.css", "uPlot.iife.min.js", "view.js", "view_ui.js")


def asset(name: str) -> str:
    """The text of a file in ``memtrace.plots/assets``."""
    return resources.files(__package__).joinpath("assets", name).read_text(encoding="utf-8")


def _script_safe(text: str) -> str:
    """Text that cannot close the <script> element it sits in."""
    return text.replace("</", "<\\/")


def page_document(ranks: list[PackedRank], *, title: str, report_text: str, api: bool) -> dict[str, Any]:
    """The page's JSON document (every rank's meta and column table)."""
    return {
        "title": title,
        "api": api,
        "report": report_text,
        "ranks": [{**r.meta, "columns": r.columns} for r in ranks],
    }


def render_html(ranks: list[PackedRank], summaries: list, *, title: str, api: bool = False) -> str:
    """The whole page as a string."""
    buf = io.StringIO()
    render_run(summaries, buf)  # as `memtrace report` prints it
    doc = page_document(ranks, title=title, report_text=buf.getvalue(), api=api)
    blobs = "\n".join(
        f'<script type="application/octet-stream" id="mt-blob-{i}">{base64.b64encode(r.blob).decode("ascii")}</script>'
        for i, r in enumerate(ranks)
    )
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


def build_page(analyses: list[RankAnalysis], *, title: str, max_events: int, api: bool) -> str:
    """The page for ``analyses`` (one per rank): with every event when the run holds at most
    ``max_events``, else a coarse overview per rank (``api``: the page asks its server for the rest)."""
    t0 = run_start(analyses)
    with_events = sum(len(a.times) for a in analyses) <= max_events
    packed = []
    for a in analyses:
        p = pack_rank(a, t0, with_events=with_events)
        if not with_events:
            from .view_window import RankQueries

            q = RankQueries(a, t0)
            p.meta["overview"] = q.window(p.meta["start_us"] / 1e6, p.meta["end_us"] / 1e6, OVERVIEW_WIDTH)
        packed.append(p)
    return render_html(packed, [a.summary for a in analyses], title=title, api=api)
