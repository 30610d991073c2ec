"""The one protocol every output follows: ``render(run, out, fmt, **options)``.

``run`` is an ``analysis.analysed.run.AnalysedRun`` (built once by ``analyse``); ``out`` is where the output goes: a
text stream for the text formats, a path for files and bundles. Each format is one ``Format`` of
``plots.formats.FORMATS`` (name, suffixes, binary, the commands offering it, its renderer module) whose module's
``render(run, out, **options) -> None`` computes nothing itself; the CLI's ``-f`` choices and suffixes
(:func:`offered_by`) come from that tuple without importing a renderer.
"""

from __future__ import annotations

from typing import Any

from memtrace.plots.format_spec import Format
from memtrace.plots.formats import FORMATS as _ALL

#: format name -> its metadata
FORMATS: dict[str, Format] = {f.name: f for f in _ALL}


def offered_by(command: str) -> dict[str, Format]:
    """The formats ``command`` offers, by their ``-f`` spelling."""
    return {f.flag: f for f in _ALL if command in f.commands}


def render(run, out, fmt: str, **options: Any) -> Any:
    """Write ``run`` to ``out`` in ``fmt`` (one of :data:`FORMATS`) with the format's ``options``; returns what
    the renderer returns (the issue bundle: the names of the files it wrote)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")
    spec = FORMATS[fmt]
    if spec.binary and hasattr(out, "write"):  # an image or a pickle is never written into a text stream
        raise ValueError(f"{fmt} is written as bytes into a file, not into a stream")
    return spec.load().render(run, out, **spec.options, **options)
