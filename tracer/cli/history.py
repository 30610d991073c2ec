"""Keep a history of runs and gate each new run against the last accepted one of the same environment.

The history is an SQLite file (--db, default memtrace-history.sqlite). Runs are filed under their
matrix key: GPU, driver, CUDA, torch, vLLM, FlashInfer, model and the flags that change memory.

  memtrace history add RUN               record RUN as the accepted reference for its key
  memtrace history check RUN --add       compare RUN with the last accepted run of its key (exit 1 on
                                         growth past --fail-over, as memtrace diff), then record it:
                                         accepted when it passed, refused when it did not
  memtrace history show -o trend.png     the runs per key, and their trend as a PNG
  memtrace history accept N              accept run #N after all (a growth that was intended)

check exits 0 when nothing grew past --fail-over, 1 when something did (or the new run died of OOM
where the reference did not), 2 on bad input. With no accepted run of the key nothing was compared: it
says so on stderr, with the closest stored key and how it differs, and exits 1, unless --allow-new (the
first run of a new environment; with --add it then becomes the key's reference). The same recording added
twice (add, or check --add) is stored once.
"""

from __future__ import annotations

import argparse
import json
import sys

NAME = "history"


def _db(p: argparse.ArgumentParser) -> None:
    from memtrace.history_store import DEFAULT_DB

    p.add_argument("--db", default=DEFAULT_DB, metavar="FILE", help=f"the history file (default {DEFAULT_DB})")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from memtrace.cli._runs import add_input, add_output, add_rank

    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    a = sub.add_parser("add", help="record a run as the accepted reference of its key")
    add_input(a)
    _db(a)
    a.add_argument("--label", help="the run's name in the history (default: the run's own name)")
    add_rank(a)
    c = sub.add_parser("check", help="compare a run with the last accepted run of its key; exit 1 on growth")
    add_input(c)
    _db(c)
    c.add_argument("--fail-over", default="2%", metavar="LIMIT", help="allowed growth: 2%% or 512MiB (default 2%%)")
    add_rank(c)
    c.add_argument("--add", action="store_true", help="then record the run: accepted if it passed, refused if not")
    c.add_argument("--label", help="the run's name in the history, with --add")
    c.add_argument(
        "--allow-new", action="store_true", help="exit 0 when the history holds no run of this key (nothing compared)"
    )
    c.add_argument("--json", action="store_true", help="print the comparison as JSON (as memtrace diff --json)")
    s = sub.add_parser("show", help="list the runs per key and draw their trend (PNG or SVG)")
    _db(s)
    add_output(
        s, "the trend figure (default <db name>-trend.png, redrawn each time)", force="replace an existing figure"
    )
    s.add_argument("--key", help="only this matrix key")
    s.add_argument("--no-plot", action="store_true", help="only the text listing")
    acc = sub.add_parser("accept", help="accept run #N (all its ranks) as the reference of its key")
    _db(acc)
    acc.add_argument("batch", type=int, metavar="N", help="the run's number, as history show lists it")


def _recorded(args: argparse.Namespace, what: str) -> list:
    from memtrace.analysis.gate.history import record_run
    from memtrace.cli._runs import analysed

    return record_run(analysed(args), what)


def _rows(recs: list, args: argparse.Namespace, accepted: bool) -> list:
    from memtrace.analysis.gate.history import figures_doc
    from memtrace.history_store import NewRow
    from memtrace.outputs import run_name

    label = args.label or run_name(args.run_path)
    return [
        NewRow(
            r.key,
            r.fingerprint,
            label,
            str(args.run_path),
            r.rank,
            r.recorded_us,
            accepted,
            figures_doc(r.reserved),
            figures_doc(r.device) if r.device is not None else None,
        )  # fmt: skip
        for r in recs
    ]


def _add(args: argparse.Namespace) -> int:
    from memtrace.analysis.gate.history_key import describe
    from memtrace.history_store import accept_batch, add_rows, connect, stored_batch
    from memtrace.units import count_of

    recs = _recorded(args, "keep as a reference")
    rows = _rows(recs, args, accepted=True)
    with connect(args.db, create=True) as db:
        same = stored_batch(db, rows)
        if same is not None:  # one recording is one run: accepted now if it was refused before
            accept_batch(db, same)
            print(f"{args.run_path} is already in {args.db} as run #{same} (the same recording): not added again; "
                  "it is the accepted reference of its key")  # fmt: skip
            return 0
        ids = add_rows(db, rows)
        batch = db.execute("SELECT batch FROM runs WHERE id = ?", (ids[0],)).fetchone()[0]
    print(
        f"added run #{batch} ({count_of(len(ids), 'process', 'processes')}) to {args.db} as the reference of key {recs[0].key}:"
    )
    print(f"  {describe(recs[0].fingerprint)}")
    return 0


def _check(args: argparse.Namespace) -> int:
    from memtrace.analysis.gate.history import Recorded, check, closest, figures_from_doc
    from memtrace.history_store import accept_batch, add_rows, all_rows, connect, last_accepted, stored_batch
    from memtrace.plots.diff_text import diff_to_json, render_diff
    from memtrace.units import parse_threshold

    threshold = parse_threshold(args.fail_over)
    recs = _recorded(args, "check")
    diffs, refs, missing = [], [], []
    with connect(args.db, create=args.add) as db:
        for r in recs:
            row = last_accepted(db, r.key, r.rank)
            if row is None:
                missing.append(r)
                continue
            device = figures_from_doc(row.figures_device) if row.figures_device else None
            base = Recorded(row.key, row.fingerprint, row.rank, row.recorded_us,
                            figures_from_doc(row.figures_reserved), device)  # fmt: skip
            diffs.append(check(base, r, threshold, label=f"rank {r.rank}" if r.rank is not None else ""))
            refs.append(row)
        failed = any(d.failed for d in diffs) or (bool(missing) and not args.allow_new)
        near = closest({row.key: row.fingerprint for row in all_rows(db)}, missing[0].fingerprint) if missing else None
        same = None
        if args.add:
            rows = _rows(recs, args, accepted=not failed)
            same = stored_batch(db, rows)
            if same is None:
                add_rows(db, rows)
            elif not failed:  # one recording is one run: passed now, it becomes the reference
                accept_batch(db, same)
    base_name = f"{args.db} run #{refs[0].batch} ({refs[0].label})" if refs else str(args.db)
    for r in missing:  # on stderr, whatever the output format
        _say_missing(r, near, args)
    if args.json:
        doc = diff_to_json(diffs, base_name, str(args.run_path))
        doc.update(failed=failed, without_reference=[r.rank for r in missing])
        json.dump(doc, sys.stdout, indent=2)
        print()
    else:
        if diffs:
            sys.stdout.write(render_diff(diffs, base_name, str(args.run_path), title="memtrace history check"))
        if args.add and same is not None:
            now = "" if failed else "; accepted"
            print(f"already in {args.db} as run #{same} (the same recording): not added again{now}")
        elif args.add:
            print(f"recorded in {args.db} as {'refused' if failed else 'accepted'}")
    return 1 if failed else 0


def _say_missing(rec, near, args: argparse.Namespace) -> None:
    """No accepted run of the key: nothing was compared, said on stderr (the gate fails unless --allow-new)."""
    from memtrace.analysis.gate.history_key import describe

    rank = f" rank {rec.rank}" if rec.rank is not None else ""
    verdict = "allowed by --allow-new" if args.allow_new else "not passed (exit 1; --allow-new for a new environment)"
    print(
        f"memtrace: no accepted run of key {rec.key}{rank} in {args.db} ({describe(rec.fingerprint)}): "
        f"nothing compared, {verdict}",
        file=sys.stderr,
    )
    if near is not None:
        key, diff = near
        what = "; ".join(f"{k} {b} → {n}" for k, b, n in diff[:6]) + (" …" if len(diff) > 6 else "")
        print(f"  the closest stored key {key} differs in: {what}", file=sys.stderr)


def _show(args: argparse.Namespace) -> int:
    from pathlib import Path

    from memtrace.analysis.gate.history import trends
    from memtrace.errors import UsageError
    from memtrace.history_store import all_rows, connect
    from memtrace.outputs import atomic_write, output_file
    from memtrace.plots.history_png import history_table, render_history

    out = None
    if not args.no_plot:  # the default figure is the history's own picture: redrawn each time, as the db grows
        name = args.output or f"{Path(args.db).stem}-trend.png"
        force = args.force or args.output is None
        out = output_file(args.db, name, default_suffix="-trend.png", suffixes=(".png", ".svg"), force=force)
    with connect(args.db, create=False) as db:
        rows = all_rows(db, args.key)
    if not rows:
        raise UsageError(f"{args.db} holds no run" + (f" of key {args.key}" if args.key else ""))
    ts = trends(rows)
    sys.stdout.write(history_table(ts, rows))
    if out is not None:
        with atomic_write(Path(out)) as tmp:
            render_history(ts, tmp, title=f"memtrace history: {Path(args.db).name}")
        print(f"wrote {out}")
    return 0


def _accept(args: argparse.Namespace) -> int:
    from memtrace.errors import UsageError
    from memtrace.history_store import accept_batch, connect
    from memtrace.units import count_of

    with connect(args.db, create=False) as db:
        n = accept_batch(db, args.batch)
    if not n:
        raise UsageError(f"{args.db} holds no run #{args.batch}; 'memtrace history show --db {args.db}' lists them")
    print(f"run #{args.batch} ({count_of(n, 'process', 'processes')}) is now the accepted reference of its key")
    return 0


def run(args: argparse.Namespace) -> int:
    return {"add": _add, "check": _check, "show": _show, "accept": _accept}[args.action](args)
