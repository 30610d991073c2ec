"""``memtrace report --json``: the analysed run as one JSON document, exact integers of bytes and µs.

One more renderer of ``analysis.run.AnalysedRun``: the run's verdict, its worst rank, its time origin (the
sentence every output states, and each rank's shift onto the driver's clock), the ranks side by side,
the missing ranks, then each rank's JSON shape (``analysis.analysed.summary.summary_doc``) with its verdict.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, TextIO

from memtrace.analysis.analysed.run import side_by_side
from memtrace.analysis.analysed.summary import summary_doc
from memtrace.plots import cost_text


def run_doc(run) -> dict[str, Any]:
    """The JSON-ready document of ``run``."""
    sbs = side_by_side(run)
    return {
        "path": run.path,
        "verdict": run.verdict,
        "worst": run.worst.label,
        "time_origin": {
            "t0_us": run.origin.t0_us,
            "sentence": run.origin.sentence,
            "aligned": run.origin.aligned,
            "shifts": [dataclasses.asdict(s) for s in run.origin.shifts],
        },
        "side_by_side": dataclasses.asdict(sbs) if sbs is not None else None,
        "missing": [{**dataclasses.asdict(m), "line": m.line} for m in run.missing],
        "traces": [{**summary_doc(r), "self_cost_line": _cost_line(r), "verdict": r.verdict} for r in run.ranks],
    }


def _cost_line(rank) -> str | None:
    """The report's sentence on memtrace's cost (``plots.cost_text``), beside its exact figures; None for a
    file memtrace did not record."""
    line = cost_text.headline(rank.self_cost, rank.trace.process.role == "vllm-worker")
    if not line:
        return None
    return f"{line}; {cost_text.sources(rank.self_cost)}" if rank.self_cost.recorded else line


def render(run, file: TextIO) -> None:
    """Write :func:`run_doc` of ``run`` to ``file``."""
    json.dump(run_doc(run), file, indent=1)
    file.write("\n")
