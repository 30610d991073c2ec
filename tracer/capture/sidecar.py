"""The NVML sidecar: a separate process sampling device-used memory into the trace file.

Why a process: no GIL contention with the traced program, and it outlives a traced process that is
killed (it flushes and exits when its parent dies). It never imports torch, so it never creates a
CUDA context; it finds the traced device by UUID (then PCI bus id) from torch, never by index,
which CUDA_VISIBLE_DEVICES renumbers.

Samples are ``(time_us, used_bytes)`` on the Unix-µs clock (the midpoint of the NVML call); every
``PROCESSES_EVERY_S`` it also reads NVML's per-process list and samples the memory of the *other*
processes on the device (:mod:`.processes`). Both series go to the trace file through the store's
``SampleAppender`` (its own SQLite connection: the file is in WAL mode, so the two writers
interleave; only the sidecar writes samples). Its stdin also takes ``reserved N`` lines: the traced
process's PyTorch reserved bytes, for finding it by memory inside a container. Runs of equal values are compressed without losing a
step: a sample is kept when its value differs from the previous one, together with the last sample
of the run before it, plus one heartbeat every ``HEARTBEAT_US``.

Protocol with the traced process: the sidecar prints one line, ``ready {json}`` or
``unavailable <reason>``; it stops on ``stop`` or EOF on its stdin, or when its parent pid changes,
and prints ``done {json}`` with its statistics. Run as ``python -m memtrace.capture.sidecar``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memtrace.capture.processes import Others
from memtrace.model import Note

log = logging.getLogger("memtrace")

HEARTBEAT_US = 50_000
FLUSH_EVERY_S = 0.2
#: How often the per-process list is read (for the other processes' memory).
PROCESSES_EVERY_S = 0.01
READY_TIMEOUT_S = 20.0


# -- the traced process's side -------------------------------------------------------------------
class Sidecar:
    """Handle on a running sidecar process. Its ``ready``/``unavailable`` line is read by
    :meth:`wait_ready`, on the caller's thread or on a background one (``start_sidecar(wait=False)``)."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.info: dict[str, Any] = {"pid": proc.pid}
        self.unavailable: str | None = None
        self._waiter: threading.Thread | None = None

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> str | None:
        """Read the sidecar's first line; the reason it is unavailable, or None once it samples."""
        proc = self.proc
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        line = proc.stdout.readline().decode(errors="replace").strip() if ready else ""
        if line.startswith("ready "):
            self.info.update(json.loads(line[6:]))
            return None
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        self.unavailable = line.removeprefix("unavailable ") or f"the sidecar did not answer within {timeout:.0f} s"
        return self.unavailable

    def join_started(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Wait until a sidecar started with ``wait=False`` has answered (sampling or unavailable)."""
        if self._waiter is not None:
            self._waiter.join(timeout)

    def hint(self, reserved_bytes: int) -> None:
        """Tell the sidecar the traced process's PyTorch reserved bytes (see ``processes.Others``)."""
        try:
            if self.proc.poll() is None:
                self.proc.stdin.write(f"reserved {int(reserved_bytes)}\n".encode())
                self.proc.stdin.flush()
        except (OSError, ValueError):
            pass

    def stop(self, timeout: float = 10.0) -> dict[str, Any]:
        """Ask the sidecar to flush and exit; returns its info and statistics."""
        if self._waiter is not None:
            self._waiter.join(READY_TIMEOUT_S + 1)
        proc = self.proc
        try:
            if proc.poll() is None:
                proc.stdin.write(b"stop\n")
                proc.stdin.flush()
        except (OSError, ValueError):
            pass
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            self.info["error"] = f"did not stop within {timeout:.0f} s; killed"
        for line in (out or b"").decode(errors="replace").splitlines():
            if line.startswith("done "):
                self.info.update(json.loads(line[5:]))
        self.info["exit_code"] = proc.returncode
        return self.info


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    import memtrace

    pkg = Path(memtrace.__file__).resolve().parent
    if pkg.name == "memtrace":  # a normal install: make sure the child finds the same copy
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(pkg.parent), env.get("PYTHONPATH")) if p)
    return env


def start_sidecar(
    db_path: str | os.PathLike,
    gpu: dict[str, Any],
    hz: float,
    *,
    wait: bool = True,
    on_ready: Callable[[dict[str, Any]], None] | None = None,
    on_unavailable: Callable[[str], None] | None = None,
    reserved_bytes: int | None = None,
) -> Sidecar | str:
    """Start the sampler for the device described by ``gpu`` (env.gpu_facts); a reason string if not.

    ``reserved_bytes`` (PyTorch's reserved bytes now; later ones through :meth:`Sidecar.hint`) lets
    the sidecar find the traced process by memory where NVML's pids are not ours (a container).
    ``wait=False`` returns at once (starting Python and NVML takes the child 0.1-1 s, which the
    traced program need not wait for): a thread reads the answer and calls ``on_ready(info)`` or
    ``on_unavailable(reason)``.
    """
    cmd = [sys.executable, "-m", "memtrace.capture.sidecar", "--db", str(db_path), "--hz", str(hz)]
    cmd += ["--parent", str(os.getpid()), "--index", str(gpu.get("device_index", 0))]
    if gpu.get("gpu_uuid"):
        cmd += ["--uuid", gpu["gpu_uuid"]]
    if gpu.get("pci_bus_id"):
        cmd += ["--pci", gpu["pci_bus_id"]]
    if gpu.get("total_memory_bytes"):
        cmd += ["--cuda-total", str(int(gpu["total_memory_bytes"]))]
    if reserved_bytes is not None:
        cmd += ["--reserved", str(int(reserved_bytes))]
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_child_env(), close_fds=True)
    except OSError as exc:
        return f"could not start the sidecar process ({exc})"
    sc = Sidecar(proc)

    def answer() -> str | None:
        reason = sc.wait_ready()
        callback = on_ready if reason is None else on_unavailable
        if callback is not None:
            callback(sc.info if reason is None else reason)
        return reason

    if wait:
        reason = answer()
        return reason if reason is not None else sc
    sc._waiter = threading.Thread(target=answer, name="memtrace-sidecar-start", daemon=True)
    sc._waiter.start()
    return sc


# -- the sidecar process -------------------------------------------------------------------------
def _open_device(pynvml: Any, uuid: str | None, pci: str | None, index: int) -> tuple[Any, str]:
    errors = []
    if uuid:
        try:
            return pynvml.nvmlDeviceGetHandleByUUID(uuid), "uuid"
        except pynvml.NVMLError as exc:
            errors.append(f"uuid {uuid}: {exc}")
    if pci:
        try:
            return pynvml.nvmlDeviceGetHandleByPciBusId(pci), "pci"
        except pynvml.NVMLError as exc:
            errors.append(f"pci {pci}: {exc}")
    if not uuid and not pci:
        return pynvml.nvmlDeviceGetHandleByIndex(index), "index"
    raise LookupError("; ".join(errors))


class StepSeries:
    """Compresses one sample series without losing a step: a sample is kept when its value differs
    from the previous one, together with the last sample of the run before it, plus one heartbeat
    every ``HEARTBEAT_US``. Buffers are flat ``array('q')`` of (time_us, value) pairs.

    ``add(t, v)`` offers a sample; ``take(final)`` returns the pairs kept since the last take (None when
    none), ``final`` keeping the last sample too (the series ends there)."""

    def __init__(self) -> None:
        self.buf = array("q")
        self.kept = 0
        self.last_value: int | None = None
        self.last_kept_t = 0
        self.pending: tuple[int, int] | None = None

    def add(self, t: int, v: int) -> None:
        if v != self.last_value:
            if self.pending is not None:
                self.buf.extend(self.pending)
            self.buf.extend((t, v))
            self.last_value, self.last_kept_t, self.pending = v, t, None
        elif t - self.last_kept_t >= HEARTBEAT_US:
            self.buf.extend((t, v))
            self.last_kept_t, self.pending = t, None
        else:
            self.pending = (t, v)

    def take(self, final: bool = False) -> array | None:
        if final and self.pending is not None:
            self.buf.extend(self.pending)
            self.pending = None
        if not self.buf:
            return None
        buf, self.buf = self.buf, array("q")
        self.kept += len(buf) // 2
        return buf


class _Writer:
    """The device-used and other-processes series; a thread appends them to the trace file through
    the store's :class:`~memtrace.store.SampleAppender` (its own connection).

    The sampling loop only swaps buffers (``hand_off``), so a slow SQLite commit never delays a sample.
    """

    def __init__(self, db: str):
        self.db_path = db
        self.used = StepSeries()
        self.others = StepSeries()
        self.queue: queue.Queue = queue.Queue()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="memtrace-sidecar-writer", daemon=True)
        self.thread.start()

    def add(self, t: int, v: int) -> None:
        self.used.add(t, v)

    @property
    def kept(self) -> int:
        return self.used.kept

    def hand_off(self, final: bool = False) -> None:
        for kind, series in (("samples", self.used), ("others", self.others)):
            buf = series.take(final)
            if buf is not None:
                self.queue.put((kind, buf))

    def note(self, level: str, text: str) -> None:
        self.queue.put(("note", Note(time.time_ns() // 1000, level, text)))

    def close(self) -> None:
        """Write everything handed off and stop the thread."""
        self.queue.put(None)
        if self.thread is not None:
            self.thread.join()

    def _run(self) -> None:
        from memtrace.store import SampleAppender

        out = SampleAppender(self.db_path)
        try:
            while (item := self.queue.get()) is not None:
                kind, data = item
                if kind == "samples":
                    out.append_samples(data)
                elif kind == "others":
                    out.append_others(data)
                else:
                    out.add_note(data)
        finally:
            out.close()


def _sample(pynvml: Any, handle: Any, writer: _Writer, args: Any, others: Others, stop: threading.Event) -> dict:
    period = 1.0 / args.hz
    every = max(1, round(PROCESSES_EVERY_S * args.hz))  # the per-process list costs ~49 µs on the H200
    taken = errors = 0
    started = time.perf_counter()
    next_t = started
    last_flush = started
    while not stop.is_set():
        t0 = time.time_ns()
        try:
            used = pynvml.nvmlDeviceGetMemoryInfo(handle).used
        except pynvml.NVMLError as exc:
            errors += 1
            if errors == 1:
                writer.note("warning", f"NVML sample failed: {exc}")
            if errors >= 1000:
                writer.note("error", "NVML kept failing; sampling stopped")
                break
            used = None
        t1 = time.time_ns()
        if used is not None:
            writer.add((t0 + t1) // 2000, int(used))
            if taken % every == 0:
                t2 = time.time_ns()
                value = others.sample(int(used))
                if value is not None:
                    writer.others.add((t2 + time.time_ns()) // 2000, value)
            taken += 1
        now = time.perf_counter()
        if now - last_flush >= FLUSH_EVERY_S:
            writer.hand_off()
            last_flush = now
            if os.getppid() != args.parent:  # the traced process died: flush and go
                stop.set()
        next_t += period
        delay = next_t - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        else:
            next_t = time.perf_counter()
    elapsed = time.perf_counter() - started
    writer.hand_off(final=True)
    return {
        "taken": taken,
        "kept": writer.kept,
        "others_kept": writer.others.kept,
        "errors": errors,
        "achieved_hz": round(taken / elapsed, 1) if elapsed else 0.0,
        **others.stats(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m memtrace.capture.sidecar")
    parser.add_argument("--db", required=True)
    parser.add_argument("--hz", type=float, default=1000.0)
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--uuid")
    parser.add_argument("--pci")
    parser.add_argument("--cuda-total", type=int, default=0, help="CUDA's total bytes (NVML's total - driver reserve)")
    parser.add_argument("--reserved", type=int, help="the traced process's PyTorch reserved bytes at start")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the traced program; it stops us
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: stop.set())

    def say(line: str) -> None:
        try:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
        except (BrokenPipeError, ValueError):
            pass  # the traced process is gone; the samples are already in the file

    try:
        import pynvml
    except ImportError:
        say("unavailable nvidia-ml-py is not installed (pip install nvidia-ml-py)")
        return 0
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        say(f"unavailable NVML could not start ({exc}); is the NVIDIA driver loaded?")
        return 0
    try:
        handle, how = _open_device(pynvml, args.uuid, args.pci, args.index)
        name = pynvml.nvmlDeviceGetName(handle)
        info = {
            "nvml_device": name if isinstance(name, str) else name.decode(),
            "matched_by": how,
            "driver": _text(pynvml.nvmlSystemGetDriverVersion()),
            "hz": args.hz,
            "total_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
        }
    except (pynvml.NVMLError, LookupError) as exc:
        say(f"unavailable the traced GPU was not found by NVML ({exc})")
        return 0

    reserve = max(info["total_bytes"] - args.cuda_total, 0) if args.cuda_total else 0
    others = Others(pynvml, handle, args.parent, reserve, args.reserved)

    def watch_stdin() -> None:
        for line in sys.stdin:
            word, _, value = line.strip().partition(" ")
            if word == "stop":
                break
            if word == "reserved" and value.isdigit():
                others.hint = int(value)
        stop.set()  # "stop", or EOF: the traced process closed the pipe or died

    threading.Thread(target=watch_stdin, daemon=True).start()
    writer = _Writer(args.db)
    writer.start()
    say("ready " + json.dumps(info))
    try:
        stats = _sample(pynvml, handle, writer, args, others, stop)
    finally:
        writer.close()
    pynvml.nvmlShutdown()
    say("done " + json.dumps(stats))
    return 0


def _text(value: Any) -> str:
    return value if isinstance(value, str) else value.decode()


if __name__ == "__main__":
    sys.exit(main())
