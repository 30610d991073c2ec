"""The public recording API: ``memtrace.trace``, ``start``, ``stop``, ``phase``, ``current_session``.

One recording session per process, writing ``<run_dir>/<host>-pid<pid>[-rank<r>].memtrace``::

    import memtrace

    with memtrace.trace("out/"):            # or memtrace.start("out/") ... memtrace.stop()
        with memtrace.phase("load_model"):
            model = build()

    @memtrace.phase("profile_run")          # phase() is also a decorator
    def profile_run(): ...

API (stable; the vLLM plugin codes against it):

- ``start(path_or_dir=None, *, rank=None, local_rank=None, world_size=None, device=None,
  stacks="python", sample_hz=1000, max_entries=DEFAULT_MAX_ENTRIES, role="user", sidecar=True,
  handle_signals=True, cupti=None) -> Session``. ``path_or_dir`` is a run directory (default: ``$MEMTRACE_DIR``,
  else ``memtrace-YYYYmmdd-HHMMSS/`` in the cwd, exported to ``MEMTRACE_DIR`` so child processes
  write next to it) or a path ending in ``.memtrace``. ``device`` is a CUDA index, ``"cuda:N"`` or a
  ``torch.device`` (default: the current device). ``stacks`` is "none", "python" or "all". A second
  ``start()`` in the same process raises :class:`memtrace.errors.UsageError`. Without torch or a
  GPU, one log line says so and the session records phases, facts and notes only. ``cupti=True`` (or
  ``MEMTRACE_CUPTI=1``) adds the optional CUPTI source (:mod:`memtrace.capture.cupti`): every device
  allocation outside PyTorch's allocator, with its Python stack.
- ``stop(reason="stop") -> Path | None``: drain the allocator history, save the final segments,
  stop the NVML sidecar, close the file; returns its path (None when nothing was recording).
  Idempotent. Also runs at interpreter exit, on SIGTERM and SIGINT, and on a CUDA OOM (the trace is
  written before ``torch.OutOfMemoryError`` propagates).
- ``trace(path_or_dir=None, **start_kwargs)``: context manager around start/stop; yields the Session.
- ``phase(name, *, source="user")``: context manager and decorator; a no-op when nothing records.
  Phases nest. Each is stored with Python times (``time.time_ns()//1000``) and also emitted as a
  ``torch.profiler.record_function("memtrace:<name>")`` range, which lands in the allocator's
  ``external_annotations`` on its own clock.
- ``current_session() -> Session | None``. A Session offers ``set_fact(key, value)`` (JSON values),
  ``add_note(level, text)`` ("info"/"warning"/"error"), ``record_hook_call(HookCall) -> int``,
  ``add_phase(name, start_us, end_us, source)`` (a phase that already ended),
  ``flush()`` (drain allocator history and commit everything now), ``path``, ``phase_path()``.

Defaults, from measurements on an H200 (torch 2.11; ``tests/data/h200/README.md``,
``tests/bench/bench_overhead.py``): the vLLM-shaped start-up of ``examples/record_startup.py``
(3.5 GiB of weights, profile run, KV cache, warm-up, 10 CUDA-graph captures) produces 13,922 allocator
events, drained 3-4 times; a drain of 16,700 events cost 0.12 s (0.03 s snapshot, 0.09 s
conversion). Only the snapshot stays on the traced thread: the conversion and the writes run on a
background writer thread, in order, waited for by ``flush()``, the OOM path and ``stop()`` (at vLLM's
end of start-up, ``stop("startup-complete")`` returns at once and the file is finished in the
background; exit waits for it); ``MEMTRACE_CAPTURE_SYNC=1`` keeps it all on the traced thread. Stacks
are recorded for allocations only. The history is a ring buffer of ``max_entries`` entries; memtrace drains it at
phase boundaries (at most every 0.5 s at top level, or once 2,000 entries are pending) and from a
watchdog thread when more than half of it is undrained, so 200,000 entries (about 14 such start-ups)
leaves a wide margin. Drains by the allocating thread (phase boundaries, flush, OOM, stop) lose
nothing; a watchdog drain can miss the few events another thread allocates between PyTorch's
snapshot and its clear (3 of 180,000 in a tight loop on the H200), and that is always reported
(``recording.truncated``, ``lost_events_min``, a note). With Python stacks, ``start()`` imports
``torch._inductor`` if nothing has yet (PyTorch's stack symbolizer would, ~5 s, at the first snapshot).
The NVML sidecar samples at 1 kHz (997 Hz achieved) and keeps only changes plus a 50 ms heartbeat;
every 10 ms it also reads NVML's per-process list (~49 µs) for the memory of other processes on the
device. It is started without being waited for.
Tracing adds no GPU memory: NVML device-used was unchanged across ``start()`` and the non-PyTorch
bytes at the end of a traced and an untraced run were equal.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from memtrace.capture.session import DEFAULT_MAX_ENTRIES, Session, active_session, begin_session

__all__ = ["DEFAULT_MAX_ENTRIES", "Session", "current_session", "phase", "start", "stop", "trace"]

F = TypeVar("F", bound=Callable[..., Any])


def start(
    path_or_dir: str | Path | None = None,
    *,
    rank: int | None = None,
    local_rank: int | None = None,
    world_size: int | None = None,
    device: Any = None,
    stacks: str = "python",
    sample_hz: float = 1000.0,
    max_entries: int = DEFAULT_MAX_ENTRIES,
    role: str = "user",
    sidecar: bool = True,
    handle_signals: bool = True,
    cupti: bool | None = None,
    wait_for_sidecar: bool = True,
) -> Session:
    """Start recording this process. Raises UsageError if a session is already recording.

    Args:
        path_or_dir: run directory, or a ``.memtrace`` file path. Default: ``$MEMTRACE_DIR`` or a new
            ``memtrace-YYYYmmdd-HHMMSS/`` in the current directory.
        rank, local_rank, world_size: the process's place in a distributed run (file name, reports).
        device: the CUDA device to trace (index, "cuda:N" or torch.device); default current device.
        stacks: "none", "python" (default) or "all" (C++ too; slow to symbolize): the stacks of
            allocations (frees are recorded without one).
        sample_hz: NVML sampling rate of the sidecar process (0 disables the sidecar);
            ``$MEMTRACE_SAMPLE_HZ`` overrides it (a knob for measuring what sampling costs).
        max_entries: size of the allocator's history ring buffer.
        role: free text stored in the trace ("user", "worker"...).
        sidecar: start the NVML sampler process.
        handle_signals: write the trace on SIGTERM/SIGINT (only possible from the main thread).
        cupti: record every device allocation and release through CUPTI (``capture.cupti``; needs
            ``pip install memtrace-vllm[cupti]``); None (default) leaves it to ``MEMTRACE_CUPTI=1``.
        wait_for_sidecar: return only once NVML samples (0.1-1 s of the child starting Python and NVML), so a
            program that allocates at once is sampled from its first allocation; False returns at once (the trace
            notes when samples begin): vLLM's plugin, whose worker loads weights for seconds after this.
    """
    return begin_session(
        path_or_dir,
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        device=device,
        stacks=stacks,
        sample_hz=sample_hz if sidecar else 0.0,
        max_entries=max_entries,
        role=role,
        handle_signals=handle_signals,
        cupti=cupti,
        wait_for_sidecar=wait_for_sidecar,
    )


def stop(reason: str = "stop") -> Path | None:
    """Stop recording and close the trace file; returns its path, or None if nothing was recording."""
    session = active_session()
    if session is None:
        return None
    return session.close(reason)


def current_session() -> Session | None:
    """The session recording this process, or None."""
    return active_session()


@contextlib.contextmanager
def trace(path_or_dir: str | Path | None = None, **kwargs: Any) -> Iterator[Session]:
    """Record the body of a ``with`` block: ``with memtrace.trace("out/") as session: ...``."""
    session = start(path_or_dir, **kwargs)
    reason = "stop"
    try:
        yield session
    except BaseException as exc:
        reason = "oom" if type(exc).__name__ == "OutOfMemoryError" else f"exception:{type(exc).__name__}"
        raise
    finally:
        if active_session() is session:
            session.close(reason)


class phase:
    """Mark a named phase: ``with memtrace.phase("load_model"):`` or ``@memtrace.phase("x")``.

    A no-op when no session records. ``source`` says who marked it ("user", "vllm").
    """

    def __init__(self, name: str, *, source: str = "user"):
        self.name = str(name)
        self.source = source
        self._tokens: list[Any] = []

    def __enter__(self) -> phase:
        session = active_session()
        self._tokens.append(session.phase_enter(self.name, self.source) if session is not None else None)
        return self

    def __exit__(self, *exc: Any) -> None:
        token = self._tokens.pop() if self._tokens else None
        if token is not None:
            session = active_session()
            if session is not None:
                session.phase_exit(token)

    def __call__(self, func: F) -> F:
        name, source = self.name, self.source

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with phase(name, source=source):
                return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]
