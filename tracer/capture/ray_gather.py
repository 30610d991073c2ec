"""Traces of Ray workers on other nodes reach the run directory on the driver's node through Ray itself.

No shared filesystem is assumed. The driver (vLLM's engine core, through the plugin's hook on
``initialize_ray_cluster``; or any program with :func:`start_collector`) starts one **collector**: a Ray
actor pinned to the driver's node (no CPU reserved) that owns the run directory there and keeps its
manifest (:mod:`memtrace.gather`). Its name travels to the workers in ``MEMTRACE_RAY_COLLECTOR``, with
memtrace's other switches (vLLM copies them once ``MEMTRACE`` is among its prefixes:
:mod:`memtrace.plugins.ray_env`; a plain Ray program passes :func:`runtime_env`).

A session starting inside a Ray worker with a collector named (:func:`link_for`):

1. measures its clock against the collector's (:func:`memtrace.capture.clock.measure_offset`: round
   trips through Ray, the smallest kept) and records it, with its node, in the facts ``clock`` and ``ray``;
2. on the driver's node writes straight into the run directory; on any other node writes into that
   node's own Ray temporary folder (``<temp_dir>/memtrace/<run name>/``), since the run directory's path
   means nothing there, and registers with the collector (rank, host, node, where the file lies);
3. when its file is complete (end of start-up, or stop), hands the bytes to the collector in chunks of
   :data:`CHUNK_BYTES`; the collector checks their SHA-256 and moves the copy into the run directory.
   A hand-over that fails leaves the file on its node, and the manifest says where (``memtrace run``
   prints how to fetch it).

Ray is imported only in a process that already imported it; nothing here runs without a collector.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memtrace import facts as F
from memtrace import gather
from memtrace.capture import clock
from memtrace.store import SUFFIX

log = logging.getLogger("memtrace")

#: ``<name>`` of the collector actor (in the namespace :data:`NAMESPACE`), for every worker of the run.
COLLECTOR_ENV = "MEMTRACE_RAY_COLLECTOR"
NAMESPACE = "memtrace"
#: The size of each piece of a trace handed to the collector (well under Ray's object size limits).
CHUNK_BYTES = 8 * 1024 * 1024
#: The longest wait for one Ray call of the hand-over.
CALL_TIMEOUT_S = 60.0

_collector: Any = None  # the driver's handle: a non-detached actor lives as long as a handle to it


class Collector:
    """The Ray actor on the driver's node that receives traces and keeps the run's manifest."""

    def __init__(self, run_dir: str, driver: dict[str, Any]):
        import ray

        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        context = ray.get_runtime_context()
        self.manifest = gather.Manifest(
            driver={
                **driver,
                "node_id": context.get_node_id(),
                "node_ip": ray.util.get_node_ip_address(),
                "run_dir": str(self.run_dir),
            }
        )
        self._parts: dict[str, tuple[Any, Any]] = {}  # file -> (open .part file, sha256)
        gather.write_manifest(self.run_dir, self.manifest)

    def info(self) -> dict[str, Any]:
        return dict(self.manifest.driver)

    def now_us(self) -> int:
        return clock.now_us()

    def register(self, entry: dict[str, Any]) -> None:
        placed = gather.Placed(**entry)
        check_trace_name(placed.file)
        self.manifest.traces[placed.file] = placed
        gather.write_manifest(self.run_dir, self.manifest)

    def put(self, name: str, offset: int, data: bytes) -> int:
        """Append ``data`` (at ``offset``) to the copy of ``name`` being received."""
        check_trace_name(name)
        if offset == 0 or name not in self._parts:
            self._drop(name)
            part = open(self.run_dir / (name + ".part"), "wb")  # noqa: SIM115 - closed in done/_drop
            self._parts[name] = (part, hashlib.sha256())
        part, digest = self._parts[name]
        if part.tell() != offset:
            raise ValueError(f"{name}: piece at {offset} does not follow byte {part.tell()}")
        part.write(data)
        digest.update(data)
        return part.tell()

    def done(self, name: str, size: int, sha256: str) -> str:
        """Check the copy of ``name`` and move it into the run directory; returns its path there."""
        part, digest = self._parts.pop(name)
        part.close()
        tmp = self.run_dir / (name + ".part")
        got = tmp.stat().st_size
        if got != size or digest.hexdigest() != sha256:
            tmp.unlink(missing_ok=True)
            self.failed(name, f"copy damaged in transit ({got} of {size} bytes, checksum mismatch)")
            raise ValueError(f"{name}: the copy does not match the original")
        out = self.run_dir / name
        os.replace(tmp, out)
        placed = self.manifest.traces.setdefault(name, gather.Placed(file=name))
        placed.status, placed.bytes, placed.error = "gathered", size, None
        gather.write_manifest(self.run_dir, self.manifest)
        return str(out)

    def failed(self, name: str, why: str) -> None:
        self._drop(name)
        placed = self.manifest.traces.setdefault(name, gather.Placed(file=name))
        placed.status, placed.error = "failed", why
        gather.write_manifest(self.run_dir, self.manifest)

    def _drop(self, name: str) -> None:
        part = self._parts.pop(name, None)
        if part is not None:
            part[0].close()
            (self.run_dir / (name + ".part")).unlink(missing_ok=True)


def check_trace_name(name: str) -> None:
    """Raise ValueError unless ``name`` is a trace's file name and nothing else (no folder, no ``..``, the
    trace suffix): the collector checks every name a worker sends, so it never writes outside the run directory."""
    if Path(name).name != name or not name.endswith(SUFFIX) or name.startswith("."):
        raise ValueError(f"{name!r} is not a trace file name")


def start_collector(run_dir: str | os.PathLike | None = None) -> Any:
    """Start the run's collector on this (the driver's) node and name it to every worker through the
    environment. Call after ``ray.init``. Idempotent per process; returns the actor handle.

    Args:
        run_dir: the run directory (default ``$MEMTRACE_DIR``, else a new ``memtrace-YYYYmmdd-HHMMSS/``,
            exported to ``MEMTRACE_DIR``).
    """
    global _collector
    if _collector is not None:
        return _collector
    import ray
    from memtrace.capture.registry import run_dir as resolve_run_dir
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    path = resolve_run_dir(run_dir).resolve()
    os.environ["MEMTRACE_DIR"] = str(path)
    host = clock.export_driver_host()
    name = f"collector-{host}-{os.getpid()}-{time.time_ns() // 1000}"
    here = ray.get_runtime_context().get_node_id()
    handle = (
        ray.remote(Collector)
        .options(
            name=name,
            namespace=NAMESPACE,
            num_cpus=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=here, soft=False),
        )
        .remote(str(path), {"host": host, "pid": os.getpid()})
    )
    ray.get(handle.info.remote(), timeout=CALL_TIMEOUT_S)
    _collector = handle
    os.environ[COLLECTOR_ENV] = name
    log.info("memtrace: collecting Ray workers' traces into %s (collector %s on this node)", path, name)
    return handle


def runtime_env(base: dict[str, Any] | None = None, environ: dict[str, str] | None = None) -> dict[str, Any]:
    """A Ray ``runtime_env`` carrying memtrace's switches (every ``MEMTRACE*`` variable set here,
    the collector's name included) to an actor or task; variables ``base`` already sets win."""
    environ = os.environ if environ is None else environ
    env = dict(base or {})
    env_vars = dict(env.get("env_vars") or {})
    for key, value in environ.items():
        if key.startswith("MEMTRACE"):
            env_vars.setdefault(key, value)
    env["env_vars"] = env_vars
    return env


@dataclass
class WorkerLink:
    """A session's tie to the run's collector, from a Ray worker."""

    handle: Any
    collector: str
    driver: dict[str, Any]
    node_id: str
    node_ip: str
    offset: clock.Offset
    path: Path
    on_driver_node: bool
    entry: dict[str, Any] = field(default_factory=dict)

    def facts(self) -> dict[str, Any]:
        return {
            F.CLOCK: clock.measured_fact(
                self.offset, self.driver.get("host", ""), reference_node_id=self.driver.get("node_id")
            ),
            F.RAY: {
                "node_id": self.node_id,
                "node_ip": self.node_ip,
                "driver_node_id": self.driver.get("node_id"),
                "on_driver_node": self.on_driver_node,
                "collector": self.collector,
                "local_path": str(self.path),
            },
        }

    def register(self, process: Any) -> None:
        """Tell the collector where this worker's trace lies (before there is anything to hand over)."""
        import ray

        self.entry = {
            "file": self.path.name,
            "rank": process.rank,
            "pid": process.pid,
            "host": process.hostname,
            "node_id": self.node_id,
            "node_ip": self.node_ip,
            "local_path": str(self.path),
            "status": "here" if self.on_driver_node else "on-node",
        }
        ray.get(self.handle.register.remote(self.entry), timeout=CALL_TIMEOUT_S)

    def hand_over(self, path: Path) -> str | None:
        """Send the finished trace to the collector; returns its path in the run directory, None when it
        stays here (on the driver's node it is already there). Logs and records a failure, never raises."""
        if self.on_driver_node:
            return None
        import ray

        try:
            digest = hashlib.sha256()
            offset = 0
            with open(path, "rb") as f:
                while True:  # at least one piece; the last one is shorter than CHUNK_BYTES (maybe empty)
                    data = f.read(CHUNK_BYTES)
                    digest.update(data)
                    offset = ray.get(self.handle.put.remote(path.name, offset, data), timeout=CALL_TIMEOUT_S)
                    if len(data) < CHUNK_BYTES:
                        break
            out = ray.get(self.handle.done.remote(path.name, offset, digest.hexdigest()), timeout=CALL_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - the trace stays on this node; the manifest says so
            why = f"{type(exc).__name__}: {exc}"
            log.warning("memtrace: could not hand %s to the driver's node (%s); it stays on this node", path, why)
            try:
                ray.get(self.handle.failed.remote(path.name, why[:500]), timeout=CALL_TIMEOUT_S)
            except Exception:  # noqa: BLE001
                pass
            return None
        log.info("memtrace: trace handed to the driver's node: %s (%d bytes)", out, offset)
        return out


def _node_temp_dir() -> Path:
    """This node's Ray temporary folder (each node of a cluster has its own), else the system's."""
    try:
        import ray._private.worker as worker

        return Path(worker.global_worker.node.get_temp_dir_path())
    except Exception:  # noqa: BLE001 - a Ray without that attribute
        return Path(tempfile.gettempdir())


def link_for(default_path: Path, environ: dict[str, str] | None = None) -> WorkerLink | None:
    """The collector link of a session about to write ``default_path``, or None: not a Ray worker (Ray
    not imported or not initialised here), or no collector named. A collector that cannot be reached is
    logged and the session writes where it would have without Ray."""
    environ = os.environ if environ is None else environ
    name = environ.get(COLLECTOR_ENV, "").strip()
    ray = sys.modules.get("ray")
    if not name or ray is None or not getattr(ray, "is_initialized", lambda: False)():
        return None
    try:
        handle = ray.get_actor(name, namespace=NAMESPACE)
        driver = ray.get(handle.info.remote(), timeout=CALL_TIMEOUT_S)
        offset = clock.measure_offset(lambda: ray.get(handle.now_us.remote(), timeout=CALL_TIMEOUT_S))
        node_id = ray.get_runtime_context().get_node_id()
        node_ip = ray.util.get_node_ip_address()
    except Exception as exc:  # noqa: BLE001 - tracing goes on without the collector
        log.warning("memtrace: the run's collector %r is unreachable (%s); this trace stays on this node", name, exc)
        return None
    on_driver_node = node_id == driver.get("node_id")
    if on_driver_node:
        path = default_path
    else:
        run_name = Path(driver.get("run_dir") or default_path.parent).name
        path = _node_temp_dir() / "memtrace" / run_name / default_path.name
        path.parent.mkdir(parents=True, exist_ok=True)
    return WorkerLink(handle, name, driver, node_id, node_ip, offset, path, on_driver_node)
