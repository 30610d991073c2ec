"""The one protocol every output follows: ``render(run, out, fmt, **options)``.

``run`` is an ``analysis.run.AnalysedRun`` (built once by ``analysis.run.analyse``); ``out`` is where the
output goes: a text stream for the text formats, a path for files and bundles. Each format is one module
of ``memtrace.plots`` (the one folder for every format memtrace writes, for people or for other tools:
text, JSON, PNG/SVG, HTML, Perfetto, memory_viz, folded stacks, CSV) with a ``FORMATS`` tuple of its
metadata (``plots.format_spec.Format``: name, suffixes, the commands offering it) and a
``render(run, out, **options) -> None`` that computes nothing itself. :data:`MODULES` lists them, imported
directly; :data:`FORMATS` and the CLI's ``-f`` choices and suffixes (:func:`offered_by`) derive from it.
Adding a format is one module plus its line here.
"""

from __future__ import annotations

from typing import Any

from . import (
    csv_curves,
    diff_text,
    fits_text,
    flame_svg,
    folded,
    issue_md,
    json_doc,
    lines,
    memory_viz,
    perfetto,
    report,
    timeline,
    view_html,
    whatif_text,
)
from .format_spec import Format

MODULES = (
    report,
    json_doc,
    lines,
    timeline,
    flame_svg,
    folded,
    view_html,
    issue_md,
    fits_text,
    whatif_text,
    diff_text,
    perfetto,
    memory_viz,
    csv_curves,
)

#: format name -> (its module, its metadata)
FORMATS: dict[str, tuple[Any, Format]] = {f.name: (mod, f) for mod in MODULES for f in mod.FORMATS}


def offered_by(command: str) -> dict[str, Format]:
    """The formats ``command`` offers, by their ``-f`` spelling."""
    return {f.flag: f for _, f in FORMATS.values() if command in f.commands}


def render(run, out, fmt: str, **options: Any) -> Any:
    """Write ``run`` to ``out`` in ``fmt`` (one of :data:`FORMATS`) with the format's ``options``; returns what
    the renderer returns (the issue bundle: the names of the files it wrote)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")
    mod, spec = FORMATS[fmt]
    return mod.render(run, out, **spec.options, **options)
