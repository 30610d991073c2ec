"""Every output format's metadata, in one table, without importing a renderer.

Each format module of ``memtrace.plots`` carries its metadata as ``FORMATS = of("<module>")`` (read from
:data:`TABLE` here); ``plots.render`` builds the CLI's ``-f`` choices and default suffixes from this table
alone and imports a renderer only when it renders (building the CLI's parser, ``memtrace --help``, imports
none of them).
"""

from __future__ import annotations

from memtrace.plots.format_spec import Format

#: module of ``memtrace.plots`` -> the formats it renders
TABLE: dict[str, tuple[Format, ...]] = {
    "report": (
        Format("text", commands=("report", "run")),
        Format("markdown", commands=("report",), options={"markdown": True}),
    ),
    "json_doc": (Format("json", commands=("report",)),),
    "lines": (Format("lines", commands=("plot",)),),
    "timeline": (Format("timeline", "-timeline.png", (".png", ".svg", ".pdf"), commands=("plot",)),),
    "flame_svg": (Format("flame", "-flame.svg", (".svg",), commands=("flame",), choice="svg"),),
    "folded": (Format("folded", "-flame.folded", (".folded", ".txt"), commands=("flame", "export")),),
    "view_html": (Format("view", "-view.html", (".html",), commands=("view",)),),
    "issue_md": (Format("issue", "-issue", (), commands=("issue",)),),
    "fits_text": (Format("fits", commands=("fits",)),),
    "whatif_text": (Format("whatif", commands=("fits",)),),
    "diff_text": (Format("diff", commands=("diff",)),),
    "perfetto": (Format("perfetto", ".perfetto.json", (".json",), commands=("export",)),),
    "memory_viz": (Format("memory-viz", ".memory_viz.pickle", (".pickle", ".pkl"), commands=("export",)),),
    "csv_curves": (Format("csv", ".curves.csv", (".csv",), commands=("export",)),),
}


def of(module: str) -> tuple[Format, ...]:
    """The formats of ``module`` (its name in ``memtrace.plots``, or its ``__name__``)."""
    return TABLE[module.rpartition(".")[2]]
