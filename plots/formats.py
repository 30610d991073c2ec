"""Every output format memtrace writes, in one tuple (:data:`FORMATS`), without importing a renderer.

Each ``Format`` names its renderer through a function that imports it (``_report`` ...), so building the CLI's
parser (``memtrace --help``) imports none of them and rendering imports only the one it uses. Adding a format is
one renderer module plus its line here.
"""

from __future__ import annotations

from types import ModuleType

from memtrace.plots.format_spec import Format


def _report() -> ModuleType:
    from memtrace.plots import report

    return report


def _json_doc() -> ModuleType:
    from memtrace.plots import json_doc

    return json_doc


def _lines() -> ModuleType:
    from memtrace.plots import lines

    return lines


def _timeline() -> ModuleType:
    from memtrace.plots import timeline

    return timeline


def _flame_svg() -> ModuleType:
    from memtrace.plots import flame_svg

    return flame_svg


def _folded() -> ModuleType:
    from memtrace.plots import folded

    return folded


def _view_html() -> ModuleType:
    from memtrace.plots import view_html

    return view_html


def _issue_md() -> ModuleType:
    from memtrace.plots import issue_md

    return issue_md


def _fits_text() -> ModuleType:
    from memtrace.plots import fits_text

    return fits_text


def _whatif_text() -> ModuleType:
    from memtrace.plots import whatif_text

    return whatif_text


def _diff_text() -> ModuleType:
    from memtrace.plots import diff_text

    return diff_text


def _perfetto() -> ModuleType:
    from memtrace.plots import perfetto

    return perfetto


def _memory_viz() -> ModuleType:
    from memtrace.plots import memory_viz

    return memory_viz


def _csv_curves() -> ModuleType:
    from memtrace.plots import csv_curves

    return csv_curves


#: every format, with the commands offering it
FORMATS: tuple[Format, ...] = (
    Format("text", commands=("report", "run"), load=_report),
    Format("markdown", commands=("report",), options={"markdown": True}, load=_report),
    Format("json", commands=("report",), load=_json_doc),
    Format("lines", commands=("plot",), load=_lines),
    Format("timeline", "-timeline.png", (".png", ".svg", ".pdf"), commands=("plot",), binary=True, load=_timeline),
    Format("flame", "-flame.svg", (".svg",), commands=("flame",), choice="svg", load=_flame_svg),
    Format("folded", "-flame.folded", (".folded", ".txt"), commands=("flame", "export"), load=_folded),
    Format("view", "-view.html", (".html",), commands=("view",), load=_view_html),
    Format("issue", "-issue", (), commands=("issue",), load=_issue_md),
    Format("fits", commands=("fits",), load=_fits_text),
    Format("whatif", commands=("fits",), load=_whatif_text),
    Format("diff", commands=("diff",), load=_diff_text),
    Format("perfetto", ".perfetto.json", (".json",), commands=("export",), load=_perfetto),
    Format(
        "memory-viz", ".memory_viz.pickle", (".pickle", ".pkl"), commands=("export",), binary=True, load=_memory_viz
    ),
    Format("csv", ".curves.csv", (".csv",), commands=("export",), load=_csv_curves),
)
