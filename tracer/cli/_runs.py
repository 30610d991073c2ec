"""Loading runs for the gate commands (diff, fits, issue, export): with a progress bar, one rank or all."""

from __future__ import annotations

from pathlib import Path

from ..errors import UsageError
from ..model import Run, Trace
from ..progress import task, track


def load_with_progress(path: str | Path) -> Run:
    """``memtrace.store.load_run`` with a progress bar over the run's files (a spinner for one file)."""
    from ..store import load_run, trace_files

    p = Path(path)
    if p.is_dir() and len(trace_files(p)) > 1:
        return load_run(p, each=lambda files: track(files, f"Loading {p.name}"))
    with task(f"Loading {p.name}", total=None):
        return load_run(p)


def select(run: Run, rank: int | None) -> list[Trace]:
    """The traces of ``run`` for ``rank`` (all when None); UsageError when the rank is absent."""
    if rank is None:
        return run.traces
    chosen = [t for t in run.traces if t.process.rank == rank]
    if not chosen and rank == 0 and len(run.traces) == 1 and run.traces[0].process.rank is None:
        return run.traces
    if not chosen:
        have = sorted({t.process.rank for t in run.traces if t.process.rank is not None})
        raise UsageError(f"{run.path} has no trace of rank {rank}; it holds ranks {have or 'none'}")
    return chosen


def main_trace(run: Run, rank: int | None) -> Trace:
    """One trace: the given rank's, else the first (rank 0 when ranks are known)."""
    return select(run, rank)[0]
