"""The one protocol every output follows: ``render(run, out, fmt, **options)``.

``run`` is an ``analysis.run.AnalysedRun`` (built once by ``analysis.run.analyse``); ``out`` is where the
output goes: a text stream for the text formats, a path for files and bundles. Each format is one module
of ``memtrace.plots`` (the one folder for every format memtrace writes, for people or for other tools:
text, JSON, PNG/SVG, HTML, Perfetto, memory_viz, folded stacks, CSV) with a ``FORMATS`` tuple of its
metadata (``plots.format_spec.Format``: name, suffixes, the commands offering it) and a
``render(run, out, **options) -> None`` that computes nothing itself. ``plots.formats.TABLE`` holds that
metadata for every module; :data:`FORMATS` and the CLI's ``-f`` choices and suffixes (:func:`offered_by`)
derive from it without importing a renderer, and :func:`render` imports only the one it uses. Adding a
format is one module plus its line in ``plots.formats``.
"""

from __future__ import annotations

import importlib
from typing import Any

from memtrace.plots.format_spec import Format
from memtrace.plots.formats import TABLE

#: the format modules of ``memtrace.plots``, by name (``plots.formats.TABLE``); imported when one renders
MODULES = tuple(TABLE)

#: format name -> (its module's name, its metadata)
FORMATS: dict[str, tuple[str, Format]] = {f.name: (mod, f) for mod, found in TABLE.items() for f in found}


def module(name: str) -> Any:
    """The renderer module of format ``name``, imported now (only the one used is ever imported)."""
    return importlib.import_module(f".{FORMATS[name][0]}", __package__)


def offered_by(command: str) -> dict[str, Format]:
    """The formats ``command`` offers, by their ``-f`` spelling."""
    return {f.flag: f for _, f in FORMATS.values() if command in f.commands}


def render(run, out, fmt: str, **options: Any) -> Any:
    """Write ``run`` to ``out`` in ``fmt`` (one of :data:`FORMATS`) with the format's ``options``; returns what
    the renderer returns (the issue bundle: the names of the files it wrote)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")
    spec = FORMATS[fmt][1]
    return module(fmt).render(run, out, **spec.options, **options)
