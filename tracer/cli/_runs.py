"""The one way every reading command takes its input: arguments, loading (with progress), rank choice.

Every command that reads a run calls :func:`add_input` (the positional RUN, ``--allow-pickle``) and
:func:`load`: a run directory, a ``.memtrace`` file, or a PyTorch snapshot pickle (``.pickle``/``.pkl``
or any name with ``--allow-pickle``; the same warning and the same refusal of code in the pickle:
``importers.files``). Target arguments are added by :func:`add_target` and resolved per trace by
``analysis.target.resolve_target``. The options several commands share (``--rank``, ``-o``/``--output``,
``--force``) are declared here once: :func:`add_rank`, :func:`add_output`, :func:`add_force`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from memtrace.errors import UsageError
from memtrace.model import Run, Trace
from memtrace.progress import task, track


def add_input(
    p: argparse.ArgumentParser, dest: str = "run_path", help: str | None = None, optional: bool = False
) -> None:
    """The positional RUN (``optional``: may be left out) and ``--allow-pickle``."""
    p.add_argument(dest, metavar="RUN", nargs="?" if optional else None,
                   help=help or "run directory, .memtrace file or snapshot pickle (.pickle/.pkl)")  # fmt: skip
    if not any("--allow-pickle" in a.option_strings for a in p._actions):
        p.add_argument(
            "--allow-pickle", action="store_true", help="read a snapshot pickle whatever its name (unpickling warns)"
        )


def add_target(p: argparse.ArgumentParser) -> None:
    """``--target`` / ``--util`` [``--total``]: the same flags, parsed the same way, in every command."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--target", metavar="SIZE", help="the line not to cross, e.g. 88GiB (default: the recorded one)")
    g.add_argument("--util", metavar="FRACTION", help="target as a share of the card, e.g. 0.92 or 92%%")
    p.add_argument("--total", metavar="SIZE", help="the card's memory for --util (default: the card the run stood for)")


def add_rank(p: argparse.ArgumentParser, help: str = "only this rank (default: every rank)") -> None:
    """``--rank N``: which rank a command reads (None: the command's default, which ``help`` states)."""
    p.add_argument("--rank", type=int, default=None, metavar="N", help=help)


def add_force(p: argparse.ArgumentParser, help: str = "replace FILE if it exists (never an input)") -> None:
    """``--force``: replace an existing output; an input is never an output, even with it (``outputs``)."""
    p.add_argument("--force", action="store_true", help=help)


def add_output(p: argparse.ArgumentParser, help: str, *, metavar: str = "FILE", force: str | None = None) -> None:
    """``-o/--output`` (``help`` names the default) and its :func:`add_force` (``force``: that flag's help)."""
    p.add_argument("-o", "--output", metavar=metavar, help=help)
    if force is not None:
        add_force(p, force)
    else:
        add_force(p)


def target_args(args: argparse.Namespace) -> dict:
    """Keyword arguments for ``resolve_target`` from :func:`add_target`'s flags (parsed, validated)."""
    from memtrace.units import parse_fraction, parse_size

    return {
        "target_bytes": parse_size(args.target) if getattr(args, "target", None) is not None else None,
        "util": parse_fraction(args.util) if getattr(args, "util", None) is not None else None,
        "total_bytes": parse_size(args.total) if getattr(args, "total", None) is not None else None,
    }


def load(path: str | Path, *, allow_pickle: bool = False, progress: bool = True) -> Run:
    """A Run from ``path`` (see the module docstring), with a progress bar over a run's files (none when
    ``progress`` is False: the caller shows one for several loads at once)."""
    from memtrace.importers.files import load_input
    from memtrace.store import trace_files

    p = Path(path)
    if not progress:
        return load_input(p, allow_pickle=allow_pickle)
    if p.is_dir():
        try:
            many = len(trace_files(p)) > 1
        except OSError:
            many = False  # load_input says what is wrong, in one line
        if many:
            return load_input(p, each=lambda files: track(files, f"Loading {p.name}"))
    with task(f"Loading {p.name or path}", total=None):
        return load_input(p, allow_pickle=allow_pickle)


def check_rank(rank: int | None) -> None:
    if rank is not None and rank < 0:
        raise UsageError(f"--rank {rank}: ranks are 0 or more")


def ranks_of(run: Run) -> list[int]:
    """The ranks a run holds; a single trace without a rank counts as rank 0."""
    ranks = sorted({t.process.rank for t in run.traces if t.process.rank is not None})
    if not ranks and len(run.traces) == 1:
        return [0]
    return ranks


def select(run: Run, rank: int | None) -> list[Trace]:
    """The traces of ``run`` for ``rank`` (all when None); UsageError when the rank is absent."""
    check_rank(rank)
    if rank is None:
        return run.traces
    chosen = [t for t in run.traces if t.process.rank == rank]
    if not chosen and rank == 0 and len(run.traces) == 1 and run.traces[0].process.rank is None:
        return run.traces
    if not chosen:
        have = ranks_of(run)
        pids = ", ".join(str(t.process.pid) for t in run.traces if t.process.rank is None)
        if have:
            raise UsageError(f"{run.path} has no rank {rank}; it holds rank(s) {', '.join(map(str, have))}")
        raise UsageError(f"{run.path} has no rank {rank}; its traces carry no rank (pids {pids}); leave out --rank")
    return chosen


def target_spec(args: argparse.Namespace):
    """The ``analysis.rank.TargetSpec`` of :func:`add_target`'s flags (parsed, validated)."""
    from memtrace.analysis.analysed.rank import TargetSpec

    return TargetSpec(**target_args(args))


def missing_ranks(path: str | Path) -> list:
    """The run's traces that ``nodes.json`` lists and its directory lacks (``analysis.run.MissingRank``)."""
    from memtrace.analysis.analysed.run import MissingRank
    from memtrace.gather import elsewhere

    p = Path(path)
    if not p.is_dir():
        return []
    return [MissingRank(m.file, m.rank, m.host or m.node_ip, m.status, m.error, m.fetch_hint(p)) for m in elsewhere(p)]


def analysed(
    args: argparse.Namespace, dest: str = "run_path", *, rank: int | None = None, top: int = 10, progress: bool = True
):
    """load -> select ``--rank`` -> ``analysis.run.analyse`` with the command's target flags: the analysed run
    every command renders."""
    from memtrace.analysis.analysed.run import analyse

    path = getattr(args, dest)
    run = load(path, allow_pickle=getattr(args, "allow_pickle", False), progress=progress)
    chosen = {id(t) for t in select(run, rank if rank is not None else getattr(args, "rank", None))}
    done = analyse(run.traces, target_spec(args), path=str(path), missing=missing_ranks(path), top=top)
    if len(chosen) == len(run.traces):
        return done
    # one origin whatever --rank picks: the run is analysed whole, then shown in part
    return done.subset([r for t, r in zip(run.traces, done.ranks, strict=True) if id(t) in chosen])


def analysed_together(args: argparse.Namespace, dests: tuple[str, str], needs: tuple[str, ...] = ()) -> tuple:
    """:func:`analysed` of two runs at once (``diff``'s base and new), each with the figures ``needs`` names
    (``AnalysedRank`` properties) computed: one in a second thread, since reading a trace and numpy's work
    release the GIL, so on two cores the pair takes about the time of one. One progress line for both. An
    error of the first run is raised before one of the second, as loading them one by one would."""
    from concurrent.futures import ThreadPoolExecutor

    def one(dest: str):
        run = analysed(args, dest, progress=False)
        for r in run.ranks:
            if not r.recorded_nothing:
                for name in needs:
                    getattr(r, name)
        return run

    names = " and ".join(Path(getattr(args, d)).name or str(getattr(args, d)) for d in dests)
    with task(f"Loading and analysing {names}", total=None), ThreadPoolExecutor(1) as pool:
        first = pool.submit(one, dests[0])
        try:
            second = one(dests[1])
        except Exception:
            first.result()  # the first run's error, if it has one, is the one to report
            raise
        return first.result(), second


def events_only(run, what: str):
    """The ranks of ``run`` that recorded allocator events (the others are named on stderr), on the run's
    origin; UsageError when none did (there is nothing to draw or show)."""
    import sys

    from memtrace.analysis.analysed.run import nothing_line

    kept = run.with_events()
    if not kept:
        raise UsageError(nothing_line(run, what).replace(": not passed", ""))
    for r in run.ranks:
        if r.recorded_nothing:
            print(f"memtrace: skipping {r.label}: no allocator events", file=sys.stderr)
    return run.subset(kept)
