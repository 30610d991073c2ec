"""The one protocol every output follows: ``render(run, out, fmt, **options)``.

``run`` is an ``analysis.run.AnalysedRun`` (built once by ``analysis.run.analyse``); ``out`` is where the
output goes: a text stream for the text formats, a path for files and bundles. Each format is a module
with a ``render(run, out, **options) -> None`` function that computes nothing itself: every figure comes
from the run (its ranks' cached properties). The formats, and where each lives:

==============  =====================================  ==================================
format          module                                 out
==============  =====================================  ==================================
text, markdown  ``plots.report``                       text stream
json            ``plots.json_doc``                     text stream
lines           ``plots.lines`` (one line per rank)    text stream (stderr)
timeline        ``plots.timeline``                     .png / .svg / .pdf path
flame, folded   ``plots.flame_svg``, ``plots.folded``  path
view            ``plots.view_html``                    .html path
issue           ``plots.issue_md``                     a directory
fits            ``plots.fits_text``                    text stream
whatif          ``plots.whatif_text`` (fits --what-if) text stream
diff            ``plots.diff_text``                    text stream (``base=`` the other run)
perfetto        ``exporters.perfetto``                 .json path
memory-viz      ``exporters.memory_viz``               .pickle path
==============  =====================================  ==================================
"""

from __future__ import annotations

import importlib
from typing import Any

#: format -> (module under ``memtrace``, fixed options)
FORMATS: dict[str, tuple[str, dict[str, Any]]] = {
    "text": ("plots.report", {}),
    "markdown": ("plots.report", {"markdown": True}),
    "json": ("plots.json_doc", {}),
    "lines": ("plots.lines", {}),
    "timeline": ("plots.timeline", {}),
    "flame": ("plots.flame_svg", {}),
    "folded": ("plots.folded", {}),
    "view": ("plots.view_html", {}),
    "issue": ("plots.issue_md", {}),
    "fits": ("plots.fits_text", {}),
    "whatif": ("plots.whatif_text", {}),
    "diff": ("plots.diff_text", {}),
    "perfetto": ("exporters.perfetto", {}),
    "memory-viz": ("exporters.memory_viz", {}),
}


def render(run, out, fmt: str, **options: Any) -> Any:
    """Write ``run`` to ``out`` in ``fmt`` (one of :data:`FORMATS`) with the format's ``options``; returns what
    the renderer returns (the issue bundle: the names of the files it wrote)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")
    module, fixed = FORMATS[fmt]
    mod = importlib.import_module(f"memtrace.{module}")
    return mod.render(run, out, **fixed, **options)
