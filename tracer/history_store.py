"""The history of runs on disk: an embedded SQLite database that CI keeps between jobs.

One row per recorded process (a run of N ranks adds N rows under one ``batch``), filed under its
matrix key (``analysis.history_key``), with the gated figures of ``analysis.diff.Figures`` as JSON
documents: one at reserved level and, when the run sampled NVML, one at device level. ``accepted``
marks the rows ``history check`` compares against (the last accepted row of the same key and rank).
Plain SQL: anyone can read the file with the ``sqlite3`` shell.

The schema is versioned (``meta.version``): a reader refuses a newer major version by name, and a
file that is not a memtrace history is refused, never modified. Every error is one line (exit 2).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from memtrace.errors import TraceFormatError, UsageError

FORMAT = "memtrace-history"
VERSION = 1
DEFAULT_DB = "memtrace-history.sqlite"

_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    batch INTEGER NOT NULL,          -- one `history add` / `check --add`: all ranks of one run
    key TEXT NOT NULL,               -- matrix key: analysis.history_key.matrix_key(fingerprint)
    fingerprint TEXT NOT NULL,       -- JSON: the fields behind the key
    label TEXT NOT NULL,             -- --label, else the run's name
    source TEXT NOT NULL,            -- the path added, as given
    rank INTEGER,                    -- the process's rank; NULL for a single process without one
    recorded_us INTEGER,             -- when the recording started (Unix-epoch microseconds)
    added_us INTEGER NOT NULL,       -- when it was added (Unix-epoch microseconds): for readers of the file
    accepted INTEGER NOT NULL,       -- 1: a reference for `history check`
    figures_reserved TEXT NOT NULL,  -- JSON of analysis.diff.Figures, PyTorch reserved only
    figures_device TEXT              -- JSON of the same with non-PyTorch memory (NULL without NVML)
);
CREATE INDEX runs_key ON runs (key, rank, accepted, id);
"""


@dataclass(frozen=True)
class Row:
    """One stored process of one run."""

    id: int
    batch: int
    key: str
    fingerprint: dict[str, str]
    label: str
    source: str
    rank: int | None
    recorded_us: int | None
    accepted: bool
    figures_reserved: dict
    figures_device: dict | None


@dataclass(frozen=True)
class NewRow:
    """What ``add`` stores for one process (the id, batch and time are given by the store)."""

    key: str
    fingerprint: dict[str, str]
    label: str
    source: str
    rank: int | None
    recorded_us: int | None
    accepted: bool
    figures_reserved: dict
    figures_device: dict | None


def _fail(path: Path, exc: Exception) -> TraceFormatError:
    return TraceFormatError(f"{path}: cannot use it as a memtrace history ({exc}); give another file with --db")


def _check(db: sqlite3.Connection, path: Path) -> None:
    try:
        meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
    except sqlite3.DatabaseError as exc:
        raise TraceFormatError(f"{path} is not a memtrace history ({exc}); give another file with --db") from None
    if meta.get("format") != FORMAT:
        raise TraceFormatError(f"{path} is not a memtrace history (format {meta.get('format')!r})")
    version = int(meta.get("version", "0"))
    if version > VERSION:
        raise TraceFormatError(
            f"{path} is a memtrace history of version {version}; this memtrace reads up to {VERSION}: upgrade it"
        )


@contextmanager
def connect(path: str | os.PathLike, *, create: bool) -> Iterator[sqlite3.Connection]:
    """An open history database; ``create`` makes a new one (its folder must exist), else it must exist."""
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"--db {p} is a directory; give a file such as {p / DEFAULT_DB}")
    new = not p.exists()
    if new and not create:
        raise UsageError(f"no history at {p}; record a reference first with 'memtrace history add RUN --db {p}'")
    if new and not (p.parent if str(p.parent) else Path(".")).is_dir():
        raise UsageError(f"cannot create {p}: folder {p.parent} does not exist; create it first")
    try:
        db = sqlite3.connect(p)
    except sqlite3.Error as exc:
        raise _fail(p, exc) from None
    try:
        if new:
            with db:
                db.executescript(_SCHEMA)
                db.executemany("INSERT INTO meta VALUES (?, ?)", [("format", FORMAT), ("version", str(VERSION))])
        else:
            _check(db, p)
        yield db
    except sqlite3.Error as exc:
        raise _fail(p, exc) from None
    finally:
        db.close()


def add_rows(db: sqlite3.Connection, rows: list[NewRow]) -> list[int]:
    """Store one run's processes under one new batch; returns their ids."""
    now = int(time.time() * 1_000_000)
    ids = []
    with db:  # one write transaction: two CI jobs adding at once get distinct batches
        db.execute("BEGIN IMMEDIATE")
        (batch,) = db.execute("SELECT COALESCE(MAX(batch), 0) + 1 FROM runs").fetchone()
        for r in rows:
            cur = db.execute(
                "INSERT INTO runs (batch, key, fingerprint, label, source, rank, recorded_us, added_us, accepted,"
                " figures_reserved, figures_device) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (batch, r.key, json.dumps(r.fingerprint), r.label, r.source, r.rank, r.recorded_us, now,
                 int(r.accepted), json.dumps(r.figures_reserved),
                 json.dumps(r.figures_device) if r.figures_device is not None else None),
            )  # fmt: skip
            ids.append(int(cur.lastrowid))
    return ids


def stored_batch(db: sqlite3.Connection, rows: list[NewRow]) -> int | None:
    """The batch already holding these very processes (the same key, rank, recording start and figures: the
    same recording added again), or None."""
    found = set()
    for r in rows:
        hits = db.execute(
            "SELECT batch FROM runs WHERE key = ? AND rank IS ? AND recorded_us IS ? AND figures_reserved = ?",
            (r.key, r.rank, r.recorded_us, json.dumps(r.figures_reserved)),
        ).fetchall()
        if not hits:
            return None
        found.update(b for (b,) in hits)
    return min(found) if found else None


def _row(t: tuple) -> Row:
    return Row(t[0], t[1], t[2], json.loads(t[3]), t[4], t[5], t[6], t[7], bool(t[8]), json.loads(t[9]),
               json.loads(t[10]) if t[10] is not None else None)  # fmt: skip


_COLUMNS = "id, batch, key, fingerprint, label, source, rank, recorded_us, accepted, figures_reserved, figures_device"


def last_accepted(db: sqlite3.Connection, key: str, rank: int | None) -> Row | None:
    """The newest accepted row of ``key`` and ``rank``, or None."""
    t = db.execute(
        f"SELECT {_COLUMNS} FROM runs WHERE key = ? AND rank IS ? AND accepted = 1 ORDER BY id DESC LIMIT 1",
        (key, rank),
    ).fetchone()
    return _row(t) if t else None


def all_rows(db: sqlite3.Connection, key: str | None = None) -> list[Row]:
    """Every row (of ``key`` when given), oldest first."""
    if key is None:
        return [_row(t) for t in db.execute(f"SELECT {_COLUMNS} FROM runs ORDER BY id")]
    return [_row(t) for t in db.execute(f"SELECT {_COLUMNS} FROM runs WHERE key = ? ORDER BY id", (key,))]


def accept_batch(db: sqlite3.Connection, batch: int) -> int:
    """Mark every row of ``batch`` accepted; returns how many rows it holds."""
    with db:
        return db.execute("UPDATE runs SET accepted = 1 WHERE batch = ?", (batch,)).rowcount
