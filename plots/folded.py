"""Folded stacks (``frame;frame;frame bytes``): the input format of flamegraph.pl and speedscope.

One line per distinct root→leaf path of a :class:`memtrace.analysis.holders.flame.Flame`, frames joined
by ``;`` from the root to the leaf, then a space and the live bytes (an integer). The lines add up
to the flame's total: the bytes live at that moment, exactly. Lines are sorted by bytes (largest
first), then by path, so the output is deterministic.
"""

from __future__ import annotations

import os
from pathlib import Path

from memtrace.analysis.holders.flame import Flame


def folded_lines(flame: Flame) -> list[str]:
    """The folded lines of ``flame``, largest first."""
    items = sorted(flame.stacks.items(), key=lambda kv: (-kv[1], kv[0]))
    return [f"{';'.join(path)} {nbytes}" for path, nbytes in items if nbytes > 0]


def render_folded(flame: Flame, path: str | os.PathLike) -> Path:
    """Write ``flame`` as folded stacks to ``path`` (one line each, newline-terminated)."""
    out = Path(path)
    lines = folded_lines(flame)
    out.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return out


def render(run, out: str | os.PathLike, *, at: str = "peak", since: str | None = None, added: bool = False,
           torch_only: bool = False, log=None) -> None:  # fmt: skip
    """The folded stacks of the run's worst rank (``AnalysedRun.worst``; ``--rank`` leaves one) at ``at``."""
    from memtrace.analysis.holders.moment import flame_for, rank_at
    from memtrace.plots.flame_svg import say_flame

    rank = rank_at(run.worst, at)
    moment, flame = flame_for(rank, at, since=since, added=added, non_torch=not torch_only)
    render_folded(flame, out)
    say_flame(rank, moment, flame, log)
