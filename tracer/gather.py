"""Where each rank's trace of a run lies: the run directory's ``nodes.json``.

A run traced on several nodes has one run directory, on the node where the run was started (the
driver's). Ray workers on other nodes write their trace on their own disk and hand it over through Ray
(:mod:`memtrace.capture.ray_gather`); memtrace's collector on the driver's node keeps this manifest,
one entry per worker, so that a reader always knows which rank's file is where, and how to fetch one
that never arrived. Plain JSON, written atomically; no Ray here::

    {"format": "memtrace-nodes", "version": 1,
     "driver": {"host": "a", "node_id": "...", "node_ip": "10.0.0.1", "run_dir": "/runs/x"},
     "traces": [{"file": "b-pid7-rank1.memtrace", "rank": 1, "pid": 7, "host": "b", "node_id": "...",
                 "node_ip": "10.0.0.2", "local_path": "/tmp/ray/memtrace/x/b-pid7-rank1.memtrace",
                 "status": "gathered", "bytes": 65536, "error": null}]}

``status``: ``here`` (written straight into the run directory: the worker is on the driver's node),
``on-node`` (written on its own node, not handed over yet), ``gathered`` (handed over through Ray:
the file in the run directory is a byte-for-byte copy, checked by SHA-256) or ``failed`` (the hand-over
failed; ``error`` says why and the file is still on its node).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MANIFEST = "nodes.json"
FORMAT = "memtrace-nodes"
VERSION = 1


@dataclass
class Placed:
    """One worker's trace: who wrote it, on which node, and whether it reached the run directory."""

    file: str
    rank: int | None = None
    pid: int | None = None
    host: str = ""
    node_id: str = ""
    node_ip: str = ""
    local_path: str = ""
    status: str = "on-node"
    bytes: int | None = None
    error: str | None = None

    def fetch_hint(self, run_dir: str | os.PathLike) -> str:
        """How to bring the file into the run directory by hand."""
        where = self.node_ip or self.host
        return f"scp {where}:{self.local_path} {Path(run_dir)}/"


@dataclass
class Manifest:
    """The run's driver and every Ray worker's trace placement, by file name."""

    driver: dict[str, Any] = field(default_factory=dict)
    traces: dict[str, Placed] = field(default_factory=dict)

    def to_json(self) -> str:
        doc = {
            "format": FORMAT,
            "version": VERSION,
            "driver": self.driver,
            "traces": [asdict(p) for p in sorted(self.traces.values(), key=_order)],
        }
        return json.dumps(doc, indent=1, sort_keys=False) + "\n"


def _order(p: Placed) -> tuple:
    return (p.rank if p.rank is not None else 1 << 30, p.host, p.pid or 0, p.file)


def write_manifest(run_dir: str | os.PathLike, manifest: Manifest) -> Path:
    """Write ``nodes.json`` atomically (a reader never sees half a file)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    out = run_dir / MANIFEST
    fd, tmp = tempfile.mkstemp(prefix=".nodes-", suffix=".json", dir=run_dir)
    with os.fdopen(fd, "w") as f:
        f.write(manifest.to_json())
    os.replace(tmp, out)
    return out


def read_manifest(run_dir: str | os.PathLike) -> Manifest | None:
    """The manifest of a run directory; None when the run kept none (no Ray workers) or it is unreadable."""
    path = Path(run_dir) / MANIFEST
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        return None
    known = set(Placed.__dataclass_fields__)
    traces = {}
    for entry in doc.get("traces") or []:
        if isinstance(entry, dict) and isinstance(entry.get("file"), str):
            placed = Placed(**{k: v for k, v in entry.items() if k in known})
            traces[placed.file] = placed
    return Manifest(driver=dict(doc.get("driver") or {}), traces=traces)


def elsewhere(run_dir: str | os.PathLike) -> list[Placed]:
    """The traces the manifest lists that are not in the run directory (still on their node, or lost),
    in rank order. A trace compressed in place (``.memtrace.xz``/``.gz``) is there."""
    manifest = read_manifest(run_dir)
    if manifest is None:
        return []
    here = Path(run_dir)
    return sorted(
        (p for p in manifest.traces.values() if not any((here / (p.file + c)).exists() for c in ("", ".xz", ".gz"))),
        key=_order,
    )
