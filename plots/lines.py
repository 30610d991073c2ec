"""One line per finding of each rank, for a command's stderr: the first crossing and the OOM, the worst
rank and the time origin. A renderer of ``analysis.run.AnalysedRun`` (``memtrace plot`` prints it)."""

from __future__ import annotations

from typing import TextIO

from memtrace.plots.timeline import oom_text
from memtrace.plots.timeline_data import prepare_rank
from memtrace.units import format_gib


def render(run, file: TextIO) -> None:
    """Write the lines of ``run`` to ``file``."""
    for r in run.ranks:
        c = r.first_crossing
        if c is not None:
            file.write(
                f"memtrace: {r.label}: {c.name} crossed {format_gib(c.target_bytes)} at {r.seconds(c.time_us):.3f} s "
                f"in {c.phase_path or 'no phase'}; highest {format_gib(c.max_bytes)} (+{format_gib(c.overshoot_bytes)})\n"
            )
        o = oom_text(prepare_rank(r), run.origin.t0_us)
        if o is not None:
            file.write(f"memtrace: {r.label}: {o.text.replace(chr(10), '; ')}\n")
    if run.multi:
        file.write(f"memtrace: worst: {run.worst.label} ({run.worst.verdict})\n")
    file.write(f"memtrace: times: {run.origin.sentence}\n")
