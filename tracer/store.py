"""The on-disk store: one SQLite file per traced process, one directory per run.

Why SQLite: it is in the standard library, crash-safe (each append is a committed transaction, so
a SIGKILL leaves everything flushed before it readable), appendable while the process runs, and
open to any SQLite tool. It is never pickle.

Layout of a trace file (format ``memtrace-trace``, version ``FORMAT_VERSION``):

- ``meta(key, value)``: ``format``, ``version`` ("1.6"), ``writer`` and the JSON documents
  ``process``, ``recording``, ``facts``. Every fact key, with its type and writer, is listed in
  ``memtrace.facts`` (the one part of the file the version number does not spell out).
- ``frames(id, filename, line, name)`` and ``stacks(id, frames)`` (frame ids, innermost first,
  space-separated): the interned stacks.
- ``event_chunks(seq, count, data)``: allocator events in appended chunks; ``data`` is the raw
  little-endian bytes of a numpy array of ``EVENT_DTYPE`` (time_us i8, action i1, addr i8, size i8,
  stream i8, stack i4, packed). Chunks keep a million events loadable in well under a second;
  ``memtrace export`` turns them into other formats.
- ``sample_chunks(seq, count, data)``: device samples, ``SAMPLE_DTYPE`` (time_us i8, used_bytes i8):
  NVML's used memory of the whole device, every process included.
- ``other_chunks(seq, count, data)`` (since 1.1): memory held on the device by processes other than
  the traced one, ``OTHERS_DTYPE`` (time_us i8, others_bytes i8), from NVML's per-process list
  (sampled less often than ``sample_chunks``). How it was attributed is ``facts["sidecar"]
  ["others_method"]``: "per-process" (the traced process was found, by its pid or, inside a PID
  namespace, by its memory, ``memory_matched_pid``: the sum of every other process's used memory),
  "used-minus-ours" (found, but another process's figure was not available: device used - driver
  reserve - ours), or "not-found" (not found, or not told apart: no series, and device used stays
  the whole device's). A 1.0 file has no such table and loads with no samples.
- ``device_alloc_chunks(seq, count, data)`` (since 1.2): device allocations and releases seen by
  CUPTI's activity API (the optional source ``capture.cupti``, ``MEMTRACE_CUPTI=1``),
  ``DEVICE_ALLOC_DTYPE`` (time_us i8, address i8, bytes i8, kind i1, op i1, stack i4, pid i4,
  device i2, correlation i8, packed): PyTorch's segments and every allocation outside its allocator,
  with the Python stack of the CUDA call that made it (-1 when none was taken). A 1.0 or 1.1 file
  has no such table and loads with no records; so does a trace recorded without the source.
- ``vmm_chunks(seq, count, data)`` (since 1.3): vLLM's calls of CUDA's virtual-memory API (``cuMemCreate``,
  ``cuMemRelease``, ``cuMemAddressReserve``, ``cuMemAddressFree`` through ``vllm/utils/vmm_driver.py``),
  which back its extensible KV cache (vLLM 0.34+) outside PyTorch's allocator, ``VMM_DTYPE`` (time_us i8,
  op i1, caller i1, error i4, bytes i8, handle i8, address i8, stack i4, packed). An older file, or a
  trace of a vLLM that makes no such call, loads with none.
- ``window`` (a ``meta`` document), ``window_event_chunks``, ``window_sample_chunks``, ``window_segments``,
  ``window_blocks`` (since 1.4): the serving window of ``MEMTRACE_UNTIL=serving`` (``model.ServingWindow``:
  the gap after start-up, the counts dropped from the ring, the window's start state, the scheduler steps),
  its allocator events and NVML samples (same dtypes as above) and the allocator state at its last write.
  Each write replaces the previous window; the start-up part (every table above) is never touched by it.
  An older file, or a start-up-only trace, loads with ``Trace.window`` None. ``window_other_chunks`` (since
  1.5): other processes' memory at the window's NVML samples (``OTHERS_DTYPE``, as ``other_chunks``; how it was
  attributed is the window document's ``others_how``). A 1.4 window has no such table and loads with none: its
  ``window_sample_chunks`` are the whole device's used memory, never told apart into this process's and others'.
  Since 1.6 the window document carries ``cost``, memtrace's own cost while serving; an older one loads with {}.
- ``segments`` and ``blocks``: the allocator state at the last snapshot (of start-up, in a serving trace).
- ``phases``, ``hook_calls``, ``notes``: one row each.

Readers refuse a file whose major version is newer than theirs and fill defaults for fields a
minor version added. A run directory holds ``*.memtrace`` files (one per process; ``.memtrace.xz``/``.gz``
compressed ones are read through a temporary copy: ``memtrace.packed``); a run is also
allowed to be a single file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import time
import urllib.parse
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
from memtrace.errors import TraceFormatError
from memtrace.facts import with_committed_kv_cache
from memtrace.model import (
    DEVICE_ALLOC_DTYPE,
    EVENT_DTYPE,
    FORMAT_VERSION,
    OTHERS_DTYPE,
    SAMPLE_DTYPE,
    VMM_DTYPE,
    Block,
    Frame,
    HookCall,
    Note,
    Phase,
    Process,
    Recording,
    Run,
    Segment,
    ServingWindow,
    Trace,
    empty_device_allocs,
    empty_events,
    empty_others,
    empty_samples,
    empty_vmm,
)
from memtrace.packed import SUFFIX, compression, is_trace_name, strip_trace_suffix, unpacked

FORMAT_NAME = "memtrace-trace"
#: The distribution's name on PyPI ("memtrace" there is an unrelated Valgrind tool).
DISTRIBUTION = "memtrace-vllm"
UPGRADE_HINT = f"pip install -U {DISTRIBUTION}"
SQLITE_MAGIC = b"SQLite format 3\x00"
#: How much of a trace file a reader maps into memory (SQLite's mmap_size): address space, not memory.
READ_MMAP_BYTES = 1 << 40

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS frames(id INTEGER PRIMARY KEY, filename TEXT, line INTEGER, name TEXT);
CREATE TABLE IF NOT EXISTS stacks(id INTEGER PRIMARY KEY, frames TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS event_chunks(seq INTEGER PRIMARY KEY, count INTEGER NOT NULL, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS sample_chunks(seq INTEGER PRIMARY KEY, count INTEGER NOT NULL, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS other_chunks(seq INTEGER PRIMARY KEY, count INTEGER NOT NULL, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS device_alloc_chunks(seq INTEGER PRIMARY KEY, count INTEGER NOT NULL, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS vmm_chunks(seq INTEGER PRIMARY KEY, count INTEGER NOT NULL, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS segments(id INTEGER PRIMARY KEY, address INTEGER, total_bytes INTEGER,
    stream INTEGER, segment_type TEXT, pool_id TEXT, is_expandable INTEGER);
CREATE TABLE IF NOT EXISTS blocks(segment INTEGER, address INTEGER, size_bytes INTEGER,
    requested_bytes INTEGER, state TEXT, stack INTEGER);
CREATE TABLE IF NOT EXISTS window_event_chunks(seq INTEGER PRIMARY KEY, count INTEGER NOT NULL, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS window_sample_chunks(seq INTEGER PRIMARY KEY, count INTEGER NOT NULL, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS window_other_chunks(seq INTEGER PRIMARY KEY, count INTEGER NOT NULL, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS window_segments(id INTEGER PRIMARY KEY, address INTEGER, total_bytes INTEGER,
    stream INTEGER, segment_type TEXT, pool_id TEXT, is_expandable INTEGER);
CREATE TABLE IF NOT EXISTS window_blocks(segment INTEGER, address INTEGER, size_bytes INTEGER,
    requested_bytes INTEGER, state TEXT, stack INTEGER);
CREATE TABLE IF NOT EXISTS phases(id INTEGER PRIMARY KEY, name TEXT, start_us INTEGER, end_us INTEGER,
    parent INTEGER, source TEXT);
CREATE TABLE IF NOT EXISTS hook_calls(id INTEGER PRIMARY KEY, name TEXT, start_us INTEGER, end_us INTEGER,
    args TEXT, returned_bytes INTEGER, allocated_delta_bytes INTEGER, reserved_delta_bytes INTEGER,
    error TEXT, parent INTEGER);
CREATE TABLE IF NOT EXISTS notes(id INTEGER PRIMARY KEY, time_us INTEGER, level TEXT, text TEXT);
"""


def _json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, default=str)


def _from_dict(cls, data: dict[str, Any]):
    """Build a dataclass from a dict, ignoring unknown keys and defaulting missing ones."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


class TraceWriter:
    """Appends one process's trace to a SQLite file; every method commits, so a crash loses nothing
    already written.

    Frames and stacks are interned here: pass frames as (filename, line, name) tuples to
    :meth:`intern_stack` and store the returned id in the events' ``stack`` column.
    """

    def __init__(self, path: str | os.PathLike, *, overwrite: bool = False):
        self.path = Path(path)
        if self.path.exists() and not overwrite:
            raise TraceFormatError(f"{self.path} already exists; choose another output or pass --force")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if overwrite and self.path.exists():
            self.path.unlink()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False)
        # an empty file is made without waiting on the disk (a crash meanwhile loses nothing: it held nothing);
        # the schema and the header in one transaction. 2-4 ms instead of ~4-30 ms on a traced program's thread
        self._db.execute("PRAGMA synchronous=OFF")
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(f"BEGIN;{_SCHEMA}COMMIT;")
        self._frames: dict[tuple[str, int, str], int] = {}
        self._stacks: dict[tuple[int, ...], int] = {}
        self._event_seq = 0
        with self._db:
            self._put_meta("format", FORMAT_NAME)
            self._put_meta("version", f"{FORMAT_VERSION[0]}.{FORMAT_VERSION[1]}")
            self._put_meta("writer", f"memtrace pid {os.getpid()} at {int(time.time() * 1e6)}")
        self._db.execute("PRAGMA synchronous=NORMAL")

    # -- small helpers -------------------------------------------------------------------------
    def _put_meta(self, key: str, value: str) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, value))

    def close(self) -> None:
        if self._db is not None:
            try:
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error:
                pass
            self._db.close()
            self._db = None

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- documents -----------------------------------------------------------------------------
    def set_process(self, process: Process) -> None:
        with self._db:
            self._put_meta("process", _json(dataclasses.asdict(process)))

    def set_recording(self, recording: Recording) -> None:
        with self._db:
            self._put_meta("recording", _json(dataclasses.asdict(recording)))

    def set_facts(self, facts: dict[str, Any]) -> None:
        with self._db:
            self._put_meta("facts", _json(facts))

    # -- interning -----------------------------------------------------------------------------
    def intern_frames(self, frames: Iterable[tuple[str, int, str]]) -> tuple[int, ...]:
        """Frame ids for ``frames``; new frames are stored first and remembered only once stored,
        so a failed write never leaves a gap in the ids."""
        ids = []
        new: dict[tuple[str, int, str], int] = {}
        for key in frames:
            fid = self._frames.get(key, new.get(key))
            if fid is None:
                fid = new[key] = len(self._frames) + len(new)
            ids.append(fid)
        if new:
            with self._db:
                self._db.executemany(
                    "INSERT INTO frames(id, filename, line, name) VALUES (?,?,?,?)",
                    [(fid, *key) for key, fid in new.items()],
                )
            self._frames.update(new)
        return tuple(ids)

    def intern_stack(self, frames: Iterable[tuple[str, int, str]]) -> int:
        """The stack id for ``frames`` (innermost first), adding it if new."""
        key = self.intern_frames(frames)
        sid = self._stacks.get(key)
        if sid is None:
            sid = len(self._stacks)
            with self._db:
                self._db.execute("INSERT INTO stacks(id, frames) VALUES (?, ?)", (sid, " ".join(map(str, key))))
            self._stacks[key] = sid
        return sid

    def put_interned(self, frames: list[Frame], stacks: list[tuple[int, ...]]) -> None:
        """Store a whole trace's frames and stacks with their ids as they are (an importer's or a
        loaded trace's tables). Only on a writer that has interned nothing yet."""
        if self._frames or self._stacks:
            raise ValueError("put_interned needs a writer that has interned nothing yet")
        with self._db:
            self._db.executemany(
                "INSERT INTO frames(id, filename, line, name) VALUES (?,?,?,?)",
                [(i, f.filename, f.line, f.name) for i, f in enumerate(frames)],
            )
            self._db.executemany(
                "INSERT INTO stacks(id, frames) VALUES (?,?)",
                [(i, " ".join(map(str, s))) for i, s in enumerate(stacks)],
            )
        self._frames = {(f.filename, f.line, f.name): i for i, f in enumerate(frames)}
        self._stacks = {tuple(s): i for i, s in enumerate(stacks)}

    # -- appends -------------------------------------------------------------------------------
    def append_events(self, events: np.ndarray) -> None:
        if len(events) == 0:
            return
        data = np.ascontiguousarray(events, dtype=EVENT_DTYPE).tobytes()
        with self._db:
            self._db.execute(
                "INSERT INTO event_chunks(seq, count, data) VALUES (?,?,?)", (self._event_seq, len(events), data)
            )
        self._event_seq += 1

    def append_samples(self, samples: np.ndarray) -> None:
        """Append device-used samples (``SAMPLE_DTYPE``)."""
        _insert_chunk(self._db, "sample_chunks", _records(samples, SAMPLE_DTYPE))

    def append_others(self, others: np.ndarray) -> None:
        """Append other-processes samples (``OTHERS_DTYPE``)."""
        _insert_chunk(self._db, "other_chunks", _records(others, OTHERS_DTYPE))

    def append_device_allocs(self, records: np.ndarray) -> None:
        """Append CUPTI device-allocation records (``DEVICE_ALLOC_DTYPE``)."""
        _insert_chunk(self._db, "device_alloc_chunks", _records(records, DEVICE_ALLOC_DTYPE))

    def append_vmm(self, records: np.ndarray) -> None:
        """Append virtual-memory call records (``VMM_DTYPE``)."""
        _insert_chunk(self._db, "vmm_chunks", _records(records, VMM_DTYPE))

    def set_segments(self, segments: list[Segment]) -> None:
        """Replace the stored allocator state (the last snapshot wins)."""
        with self._db:
            self._put_segments("", segments)

    def _put_segments(self, prefix: str, segments: list[Segment]) -> None:
        self._db.execute(f"DELETE FROM {prefix}segments")
        self._db.execute(f"DELETE FROM {prefix}blocks")
        for i, s in enumerate(segments):
            self._db.execute(
                f"INSERT INTO {prefix}segments VALUES (?,?,?,?,?,?,?)",
                (i, s.address, s.total_bytes, s.stream, s.segment_type, s.pool_id, int(s.is_expandable)),
            )
            self._db.executemany(
                f"INSERT INTO {prefix}blocks VALUES (?,?,?,?,?,?)",
                [(i, b.address, b.size_bytes, b.requested_bytes, b.state, b.stack) for b in s.blocks],
            )

    def set_window(self, window: ServingWindow) -> None:
        """Replace the serving window (its document, events, samples and end state) in one transaction."""
        doc = {
            f.name: getattr(window, f.name)
            for f in dataclasses.fields(window)
            if f.name not in ("events", "samples", "others", "segments")
        }
        with self._db:
            self._put_meta("window", _json(doc))
            for table, records, dtype in (
                ("window_event_chunks", window.events, EVENT_DTYPE),
                ("window_sample_chunks", window.samples, SAMPLE_DTYPE),
                ("window_other_chunks", window.others, OTHERS_DTYPE),
            ):
                self._db.execute(f"DELETE FROM {table}")
                if len(records):
                    data = np.ascontiguousarray(records, dtype=dtype)
                    self._db.execute(
                        f"INSERT INTO {table}(seq, count, data) VALUES (0,?,?)", (len(data), data.tobytes())
                    )
            self._put_segments("window_", window.segments)

    def add_phase(self, phase: Phase) -> int:
        """Store a phase and return its id (pass it as ``parent`` of nested phases)."""
        with self._db:
            cur = self._db.execute(
                "INSERT INTO phases(name, start_us, end_us, parent, source) VALUES (?,?,?,?,?)",
                (phase.name, phase.start_us, phase.end_us, phase.parent, phase.source),
            )
        return cur.lastrowid - 1  # ids are 1-based in SQLite, indexes 0-based in the model

    def end_phase(self, index: int, end_us: int) -> None:
        with self._db:
            self._db.execute("UPDATE phases SET end_us=? WHERE id=?", (end_us, index + 1))

    def add_hook_call(self, call: HookCall) -> int:
        with self._db:
            cur = self._db.execute(
                "INSERT INTO hook_calls(name, start_us, end_us, args, returned_bytes, allocated_delta_bytes,"
                " reserved_delta_bytes, error, parent) VALUES (?,?,?,?,?,?,?,?,?)",
                (
                    call.name,
                    call.start_us,
                    call.end_us,
                    _json(call.args),
                    call.returned_bytes,
                    call.allocated_delta_bytes,
                    call.reserved_delta_bytes,
                    call.error,
                    call.parent,
                ),
            )
        return cur.lastrowid - 1

    def add_note(self, note: Note) -> None:
        with self._db:
            self._db.execute(
                "INSERT INTO notes(time_us, level, text) VALUES (?,?,?)", (note.time_us, note.level, note.text)
            )


def _records(data: Any, dtype: np.dtype) -> np.ndarray:
    """``data`` as little-endian records of ``dtype``: a numpy array, or a flat ``array('q')`` of
    interleaved fields in native byte order (the sidecar's buffers, so it needs no numpy per sample)."""
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data, dtype=dtype)
    flat = np.frombuffer(memoryview(data).cast("B"), dtype=np.int64).astype("<i8")
    return flat.view(dtype)


def _insert_chunk(db: sqlite3.Connection, table: str, records: np.ndarray) -> None:
    """Append one chunk; the next ``seq`` is read in the same transaction, so two writers of one
    file (the traced process and the sidecar) never collide."""
    if len(records) == 0:
        return
    with db:
        db.execute(
            f"INSERT INTO {table}(seq, count, data) VALUES ((SELECT COALESCE(MAX(seq), -1) + 1 FROM {table}), ?, ?)",
            (len(records), records.tobytes()),
        )


class SampleAppender:
    """The second writer of a trace file: the NVML sidecar's connection (another process).

    The file is in WAL mode, so its appends interleave with the traced process's ``TraceWriter``;
    only the sidecar writes samples while a process is recorded. Every method commits.
    """

    def __init__(self, path: str | os.PathLike, *, timeout_s: float = 60.0):
        self._db = sqlite3.connect(str(path), timeout=timeout_s)
        self._db.execute(f"PRAGMA busy_timeout={int(timeout_s * 1000)}")
        self._db.executescript(_SCHEMA)  # a file written by a memtrace before 1.1 gains other_chunks

    def append_samples(self, samples: Any) -> None:
        """Device-used samples: ``SAMPLE_DTYPE`` records or an ``array('q')`` of (time_us, used) pairs."""
        _insert_chunk(self._db, "sample_chunks", _records(samples, SAMPLE_DTYPE))

    def append_others(self, others: Any) -> None:
        """Other-processes samples: ``OTHERS_DTYPE`` records or an ``array('q')`` of pairs."""
        _insert_chunk(self._db, "other_chunks", _records(others, OTHERS_DTYPE))

    def add_note(self, note: Note) -> None:
        with self._db:
            self._db.execute(
                "INSERT INTO notes(time_us, level, text) VALUES (?,?,?)", (note.time_us, note.level, note.text)
            )

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None


def save_trace(trace: Trace, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Write a whole in-memory Trace to ``path`` (an importer's result, a test fixture...)."""
    with TraceWriter(path, overwrite=overwrite) as w:
        w.set_process(trace.process)
        w.set_recording(trace.recording)
        w.set_facts(trace.facts)
        w.put_interned(trace.frames, trace.stacks)  # frames and stacks keep their ids
        chunk = 1 << 18
        for start in range(0, len(trace.events), chunk):
            w.append_events(trace.events[start : start + chunk])
        for start in range(0, len(trace.samples), chunk):
            w.append_samples(trace.samples[start : start + chunk])
        for start in range(0, len(trace.others), chunk):
            w.append_others(trace.others[start : start + chunk])
        for start in range(0, len(trace.device_allocs), chunk):
            w.append_device_allocs(trace.device_allocs[start : start + chunk])
        for start in range(0, len(trace.vmm), chunk):
            w.append_vmm(trace.vmm[start : start + chunk])
        w.set_segments(trace.segments)
        if trace.window is not None:
            w.set_window(trace.window)
        for p in trace.phases:
            w.add_phase(p)
        for c in trace.hook_calls:
            w.add_hook_call(c)
        for n in trace.notes:
            w.add_note(n)
    return Path(path)


# -- reading ------------------------------------------------------------------------------------


def _check_file(path: Path) -> bytes:
    """The first bytes of a trace file the user named; TraceFormatError when it is missing, a folder or empty."""
    if not path.exists():
        raise TraceFormatError(f"{path}: no such file or directory; pass a run directory or a .memtrace file")
    if path.is_dir():
        raise TraceFormatError(f"{path} is a directory; pass a .memtrace file, or load it as a run")
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError as exc:
        raise TraceFormatError(f"cannot read {path}: {exc.strerror or exc}; check its permissions") from None
    if size == 0:
        raise TraceFormatError(f"{path} is empty: the traced process wrote nothing; record the run again")
    return head


def _check_sqlite(head: bytes, path: Path) -> None:
    if head != SQLITE_MAGIC:
        raise TraceFormatError(
            f"{path} is not a memtrace trace (not SQLite); for a PyTorch snapshot pickle use "
            "'memtrace import' or pass --allow-pickle"
        )


def _chunks(db: sqlite3.Connection, table: str, dtype: np.dtype, empty) -> np.ndarray:
    """The chunks of ``table`` in one array, filled chunk by chunk: peak memory is the array plus one
    chunk (fetching every blob first, then concatenating, held the data twice: 0.8 GB at 10M events). The
    chunks are copied as bytes: assigning records of the packed dtype took 4x the CPU (1.1 s against 0.26 s for
    10M events)."""
    total = db.execute(f"SELECT COALESCE(SUM(count), 0) FROM {table}").fetchone()[0]
    if not total:
        return empty()
    out = np.empty(int(total), dtype=dtype)
    raw, size = out.view(np.uint8), dtype.itemsize
    pos = 0
    for count, data in db.execute(f"SELECT count, data FROM {table} ORDER BY seq"):
        if len(data) != count * size or pos + count > total:
            raise TraceFormatError(f"corrupt {table}: a chunk holds {len(data)} bytes for {count} records")
        raw[pos * size : (pos + count) * size] = np.frombuffer(data, dtype=np.uint8)
        pos += count
    return out[:pos]


def _version(db: sqlite3.Connection, path: Path) -> tuple[int, int]:
    meta = dict(db.execute("SELECT key, value FROM meta WHERE key IN ('format', 'version')").fetchall())
    if meta.get("format") != FORMAT_NAME:
        raise TraceFormatError(f"{path} is an SQLite file but not a memtrace trace (format={meta.get('format')!r})")
    try:
        major, minor = (int(x) for x in meta["version"].split("."))
    except (KeyError, ValueError):
        raise TraceFormatError(f"{path}: unreadable format version {meta.get('version')!r}") from None
    if major > FORMAT_VERSION[0]:
        raise TraceFormatError(
            f"{path} uses memtrace trace format {major}.{minor}, newer than the {FORMAT_VERSION[0]}.x this "
            f"memtrace reads; upgrade memtrace ({UPGRADE_HINT})"
        )
    return major, minor


def load_trace(path: str | os.PathLike) -> Trace:
    """Read one trace file, plain or compressed (``.memtrace.xz``/``.gz``: ``memtrace.packed``).

    Raises TraceFormatError (one line) for anything a user can cause.
    """
    path = Path(path)
    head = _check_file(path)
    kind = compression(head)
    if kind is None:
        _check_sqlite(head, path)
        return _load_sqlite(path, path)
    with unpacked(path, kind) as plain:
        with open(plain, "rb") as f:
            _check_sqlite(f.read(16), path)
        return _load_sqlite(plain, path)


def _load_sqlite(path: Path, shown: Path) -> Trace:
    """Read the SQLite trace at ``path``; messages and ``Trace.path`` name ``shown`` (the user's file)."""
    try:
        db, finished = _open_for_reading(path)
        try:
            if finished:  # a file no writer changes is read through a memory map, not copied by read():
                # a 10M-event trace's chunks load in about 2/3 of the time. Never a live trace's: a writer
                # that shrinks the file under a map would crash the reader.
                db.execute(f"PRAGMA mmap_size={READ_MMAP_BYTES}")
            return _read(db, shown)
        finally:
            db.close()
    except sqlite3.DatabaseError as exc:
        raise TraceFormatError(
            f"{shown} is corrupt or truncated ({exc}); record the run again or restore a copy"
        ) from None


def _open_for_reading(path: Path, timeout: float = 5.0) -> tuple[sqlite3.Connection, bool]:
    """A read-only connection to the trace at ``path``, and whether it is finished. A finished trace (no -wal
    beside it) is opened immutable, so reading it creates no -shm/-wal files next to the user's file (and works
    in a read-only directory); a trace still being written, or left by a crashed writer, has a -wal that must
    be read, which needs the normal mode (its writer made the -shm already)."""
    uri = "file:" + urllib.parse.quote(str(path.resolve())) + "?mode=ro"  # quoted: '#', '?', '%' are the name's
    finished = not path.with_name(path.name + "-wal").exists()
    if finished:
        uri += "&immutable=1"
    return sqlite3.connect(uri, uri=True, timeout=timeout), finished


def read_fact(path: str | os.PathLike, key: str) -> Any:
    """One fact of a trace file, read without disturbing its writers (for watching a live trace).

    None when the fact is not there yet, or the file is being created or cannot be read right now:
    the caller looks again later. Never raises for the file's state.
    """
    facts = read_document(path, "facts")
    return facts.get(key) if isinstance(facts, dict) else None


def read_document(path: str | os.PathLike, key: str) -> Any:
    """One JSON document of a plain trace file's ``meta`` (``process``, ``recording``, ``facts``, ``window``),
    read without disturbing its writers; None when it is not there yet or cannot be read right now (the caller
    looks again later). Never raises for the file's state."""
    try:
        db, _ = _open_for_reading(Path(path), timeout=1.0)
        try:
            row = db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        finally:
            db.close()
        return json.loads(row[0]) if row else None
    except (sqlite3.Error, ValueError, OSError):
        return None


def _read(db: sqlite3.Connection, path: Path) -> Trace:
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if "meta" not in tables:
        raise TraceFormatError(f"{path} is an SQLite file but not a memtrace trace (no meta table)")
    version = _version(db, path)
    meta = dict(db.execute("SELECT key, value FROM meta").fetchall())

    def doc(key: str) -> dict[str, Any]:
        return json.loads(meta[key]) if key in meta else {}

    def rows(table: str, sql: str) -> list[tuple]:
        return db.execute(sql).fetchall() if table in tables else []

    trace = Trace(
        process=_from_dict(Process, doc("process")),
        recording=_from_dict(Recording, doc("recording")),
        facts=with_committed_kv_cache(doc("facts")),  # an older plugin's extensible KV facts, as they mean now
        path=str(path),
        format_version=version,
    )
    trace.frames = [
        Frame(f or "", int(ln or 0), n or "")
        for f, ln, n in rows("frames", "SELECT filename, line, name FROM frames ORDER BY id")
    ]
    trace.stacks = [tuple(map(int, s.split())) for (s,) in rows("stacks", "SELECT frames FROM stacks ORDER BY id")]
    trace.events = (
        _chunks(db, "event_chunks", EVENT_DTYPE, empty_events) if "event_chunks" in tables else empty_events()
    )
    trace.samples = (
        _chunks(db, "sample_chunks", SAMPLE_DTYPE, empty_samples) if "sample_chunks" in tables else empty_samples()
    )
    trace.others = (
        _chunks(db, "other_chunks", OTHERS_DTYPE, empty_others) if "other_chunks" in tables else empty_others()
    )
    trace.device_allocs = (
        _chunks(db, "device_alloc_chunks", DEVICE_ALLOC_DTYPE, empty_device_allocs)
        if "device_alloc_chunks" in tables
        else empty_device_allocs()
    )
    trace.vmm = _chunks(db, "vmm_chunks", VMM_DTYPE, empty_vmm) if "vmm_chunks" in tables else empty_vmm()
    trace.segments = _segments(rows, "")
    if "window" in meta:
        trace.window = _window(db, json.loads(meta["window"]), rows, tables)
    trace.phases = [
        Phase(n, s, e, p, src or "user")
        for n, s, e, p, src in rows("phases", "SELECT name, start_us, end_us, parent, source FROM phases ORDER BY id")
    ]
    trace.hook_calls = [
        HookCall(n, s, e, json.loads(a) if a else {}, rb, ad, rd, err, par)
        for n, s, e, a, rb, ad, rd, err, par in rows(
            "hook_calls",
            "SELECT name, start_us, end_us, args, returned_bytes, allocated_delta_bytes, reserved_delta_bytes,"
            " error, parent FROM hook_calls ORDER BY id",
        )
    ]
    trace.notes = [Note(t, lv, tx) for t, lv, tx in rows("notes", "SELECT time_us, level, text FROM notes ORDER BY id")]
    n_frames = len(trace.frames)
    if max(map(max, filter(None, trace.stacks)), default=-1) >= n_frames:
        raise TraceFormatError(f"{path} is corrupt: a stack names a frame that is not stored")
    return trace


def _segments(rows: Callable, prefix: str) -> list[Segment]:
    """The allocator state stored in ``<prefix>segments`` and ``<prefix>blocks``."""
    segs: dict[int, Segment] = {}
    for sid, addr, total, stream, stype, pool, expandable in rows(
        f"{prefix}segments",
        "SELECT id, address, total_bytes, stream, segment_type, pool_id, is_expandable"
        f" FROM {prefix}segments ORDER BY id",
    ):
        segs[sid] = Segment(addr, total, stream, stype, pool, bool(expandable))
    for seg, addr, size, req, state, stack in rows(
        f"{prefix}blocks", f"SELECT segment, address, size_bytes, requested_bytes, state, stack FROM {prefix}blocks"
    ):
        if seg in segs:
            segs[seg].blocks.append(Block(addr, size, req, state, stack if stack is not None else -1))
    return list(segs.values())


def _window(db: sqlite3.Connection, doc: dict[str, Any], rows: Callable, tables: set[str]) -> ServingWindow:
    """The serving window (format 1.4; its others series since 1.5): its document, events, samples, other
    processes' samples and end state."""
    window = _from_dict(ServingWindow, doc)
    if "window_event_chunks" in tables:
        window.events = _chunks(db, "window_event_chunks", EVENT_DTYPE, empty_events)
    if "window_sample_chunks" in tables:
        window.samples = _chunks(db, "window_sample_chunks", SAMPLE_DTYPE, empty_samples)
    if "window_other_chunks" in tables:  # since 1.5
        window.others = _chunks(db, "window_other_chunks", OTHERS_DTYPE, empty_others)
    window.segments = _segments(rows, "window_")
    return window


def trace_files(run_dir: str | os.PathLike) -> list[Path]:
    """The trace files of a run directory (``*.memtrace``, ``*.memtrace.xz``, ``*.memtrace.gz``), in a stable
    order. TraceFormatError when it cannot be listed."""
    run_dir = Path(run_dir)
    try:
        names = os.listdir(run_dir)
    except OSError as exc:
        raise TraceFormatError(f"cannot list {run_dir}: {exc.strerror or exc}; check its permissions") from None
    # a compressed copy beside its plain trace is the same trace, read once (the plain one)
    kept = [
        n for n in names if is_trace_name(n) and (n.endswith(SUFFIX) or strip_trace_suffix(n) + SUFFIX not in names)
    ]
    return sorted(run_dir / n for n in kept)


def runs_below(folder: Path, depth: int = 2) -> list[Path]:
    """The run folders (holding trace files) inside ``folder``, down to ``depth`` levels, sorted; unlistable and
    hidden folders are passed over."""
    found: list[Path] = []
    try:
        subs = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return found
    for sub in subs:
        try:
            has = bool(trace_files(sub))
        except TraceFormatError:
            continue
        if has:
            found.append(sub)
        elif depth > 1:
            found += runs_below(sub, depth - 1)
    return found


def _no_traces_line(path: Path) -> str:
    """Why ``path``, a folder, is no run: the runs in its subfolders when it holds some (pass one of them),
    else how a run is recorded."""
    below = runs_below(path)
    if below:
        names = [str(p.relative_to(path)) for p in below]
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        n = len(below)
        return (
            f"{path} holds no {SUFFIX} files itself but {n} run{'s' if n > 1 else ''} in subfolders ({shown}); "
            f"pass one, e.g. {below[0]}"
        )
    return (
        f"{path} holds no {SUFFIX} files (nor .memtrace.xz/.gz); was the run recorded with memtrace "
        "(memtrace run, or MEMTRACE=1)?"
    )


def load_run(path: str | os.PathLike, each: Callable[[list[Path]], Iterable[Path]] | None = None) -> Run:
    """Read a run: a directory of ``*.memtrace`` files, or one file. Traces are ordered by rank, then pid.

    ``each`` wraps the list of a directory's files as they are read (a progress bar, say).
    """
    path = Path(path)
    if not path.exists():
        raise TraceFormatError(f"{path}: no such file or directory; pass a run directory or a .memtrace file")
    if path.is_dir():
        files = trace_files(path)
        if not files:
            raise TraceFormatError(_no_traces_line(path))
        traces = [load_trace(f) for f in (each(files) if each else files)]
    else:
        traces = [load_trace(path)]
    traces.sort(key=lambda t: (t.process.rank if t.process.rank is not None else 1 << 30, t.process.pid))
    return Run(path=str(path), traces=traces)
