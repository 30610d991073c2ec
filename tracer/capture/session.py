"""A recording session: one per process, owning the trace file and every source that feeds it.

The session writes through one ``TraceWriter`` (guarded by one lock: the background writer
(:mod:`.background`, which converts drains off the traced thread), the watchdog thread, the OOM
observer and signal handlers write too), keeps the phase stack, facts, notes and hook calls, and
starts/stops the allocator history (:mod:`.allocator_history`), the NVML sidecar (:mod:`.sidecar`), the OOM
observer (:mod:`.oom_observer`) and the exit/signal handlers (:mod:`.signals`). Without torch or CUDA it still
records phases, facts and notes, after one log line saying why there are no allocator events.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from memtrace import facts as F
from memtrace.capture import clock, registry, selfcost
from memtrace.capture.registry import (  # noqa: F401  (the session's module names, as before the split)
    SAMPLE_HZ_ENV,
    STACKS,
    active_session,
    now_us,
    run_dir,
    trace_path,
    wait_finishing,
)
from memtrace.errors import MemtraceError
from memtrace.model import HookCall, Note, Phase, Process, Recording
from memtrace.store import TraceWriter

log = logging.getLogger("memtrace")

#: Ring-buffer size of the allocator history; drained long before it fills (see api docstring).
DEFAULT_MAX_ENTRIES = 200_000
#: The longest wait at close for the environment facts read from installed metadata (``_gather_installed``).
ENV_WAIT_S = 10.0
#: The longest wait for the background writer (it converts one drain in well under a second).
WAIT_WRITTEN_S = 120.0


class Session:
    """Everything one process records. Use :func:`memtrace.start` to create one."""

    def __init__(
        self,
        path: Path,
        *,
        rank: int | None = None,
        local_rank: int | None = None,
        world_size: int | None = None,
        device: Any = None,
        stacks: str = "python",
        sample_hz: float = 1000.0,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        role: str = "user",
        handle_signals: bool = True,
        cupti: bool | None = None,
        wait_for_sidecar: bool = True,
    ):
        self.pid = os.getpid()
        self._cost_before = selfcost.claimed()  # what earlier sessions of this process spent
        self._history_cost: dict[str, Any] | None = None  # history_cost.calibrate's figures, or why none
        self.path = Path(path)
        self._lock = threading.RLock()
        self.writer = TraceWriter(self.path)
        self.process = Process(
            pid=self.pid,
            hostname=socket.gethostname(),
            role=role,
            rank=rank,
            local_rank=local_rank,
            world_size=world_size,
        )
        self.recording = Recording(source="memtrace", start_us=now_us(), stacks=stacks, max_entries=max_entries)
        self.facts: dict[str, Any] = {}
        self._device_arg = device
        self._sample_hz = float(sample_hz)
        self._wait_for_sidecar = wait_for_sidecar  # False: NVML's first samples come while the program goes on
        self._handle_signals = handle_signals
        self._phases: list[Phase] = []
        self._hook_calls = 0  # hook calls recorded: the next one's index
        self._small_lock = threading.Lock()  # the two counters above and below, never held while writing
        self._facts_queued = False  # a write of the facts is waiting on the background writer
        self._complete_written = False  # start-up's completion is in the file (a flush wrote it: serving, until exit)
        self._open: list[int] = []  # indexes of open phases, outermost first
        # ``_phases`` and ``_open`` change under this lock. Without a background writer it is ``_lock`` (the writes run
        # here, under it); with one (:meth:`attach_history`) a lock of its own, which the writer never holds, so a
        # phase's start on vLLM's thread never waits for a drain being written. Taken before ``_lock`` where both are;
        # re-entrant: a signal handler that stops the session may interrupt a phase's bookkeeping on the same thread.
        self._phase_lock = self._lock
        self._ranges: dict[int, Any] = {}  # phase index -> entered record_function
        self.history = None  # AllocatorHistory when CUDA is there
        self.sidecar = None  # Sidecar process handle when NVML is there
        self._cupti_arg = cupti  # None: MEMTRACE_CUPTI decides (capture.cupti.wanted)
        self.cupti = None  # capture.cupti.CuptiSource when that optional source records
        self._cupti_flushed = 0.0
        self._bg = None  # background.Background: converts and writes drains off the traced thread
        self._env_thread: threading.Thread | None = None  # gathers env.installed_facts (start_sources)
        self._env_installed: dict[str, Any] | None = None
        self.serving = None  # serving.ServingRecorder once start-up is written (MEMTRACE_UNTIL=serving)
        self.closed = False  # recording stopped (phases, drains): set when close() begins
        self._file_closed = False  # the trace file is complete and closed
        self.writer.set_process(self.process)
        self.writer.set_recording(self.recording)

    # -- sources -------------------------------------------------------------------------------
    @selfcost.timed(selfcost.START)
    def start_sources(self) -> None:
        """Start the allocator history, sidecar, OOM observer and handlers. Never raises for a missing GPU."""
        from memtrace.capture import allocator_history, env, history_cost, signals

        self.facts[F.PROCESS_START_US] = env.process_start_us()
        self.set_fact(F.ENV, env.environment_now())
        self._env_thread = threading.Thread(target=self._gather_installed, name="memtrace-env", daemon=True)
        self._env_thread.start()  # reading installed metadata: off the program's thread
        device = allocator_history.resolve_device(self._device_arg)
        if isinstance(device, str):  # a reason why there is no GPU
            log.warning("memtrace: %s; recording phases and facts only (no allocator events)", device)
            self._history_cost = history_cost.not_measured(device)
            self.add_note("warning", f"no allocator events: {device}")
        else:
            self._start_gpu(device)
        self._start_cupti()
        self._start_watchdog()
        if self._handle_signals:
            signals.install()
        self.flush_documents()

    def _gather_installed(self) -> None:
        """The environment facts that take reading installed metadata (:func:`.env.installed_facts`), on a
        thread of memtrace's own; merged into ``facts["env"]`` now and at every later write of the facts."""
        from memtrace.capture import env

        selfcost.mark_own_thread()
        try:
            with selfcost.region(selfcost.START):  # memtrace's own thread: stated apart (memtrace_threads_ns)
                installed = env.installed_facts_apart(ENV_WAIT_S)
        except Exception as exc:  # noqa: BLE001 - a fact less, never a failed recording
            log.info("memtrace: installed versions not read: %s", exc)
            return
        with self._lock:
            self._env_installed = installed
            self._merge_installed()
            if not self._file_closed:
                self.writer.set_facts(self.facts)

    def _merge_installed(self) -> None:
        """Fill ``facts["env"]``'s keys that :meth:`_gather_installed` found and nobody set (under the lock)."""
        if self._env_installed and F.ENV in self.facts:
            env = self.facts[F.ENV]
            for key, value in self._env_installed.items():
                if env.get(key) is None:
                    env[key] = value

    def _start_gpu(self, device: int) -> None:
        from memtrace.capture import allocator_history, env, oom_observer, sidecar

        self.process.device_index = device
        gpu = env.gpu_facts(device)
        self.process.device_total_bytes = gpu.get("total_memory_bytes")
        self.facts[F.ENV].update(gpu)
        self.history = allocator_history.AllocatorHistory(
            device=device,
            stacks=self.recording.stacks,
            max_entries=self.recording.max_entries or DEFAULT_MAX_ENTRIES,
            intern_stack=self._intern_stack,
            on_batch=self._on_batch,
            add_note=self.add_note,
            lock=self._lock,
        )
        self.attach_history(self.history)
        # The sidecar starts first and is waited for last: its 0.1-1 s of starting Python and NVML
        # overlaps the symbolizer import, and samples are flowing before recording starts (a sidecar
        # left to come up later missed 17 of 20 2-ms cudaMallocs on the H200, and a SIGKILL right
        # after start left no sidecar fact).
        if self._sample_hz > 0:  # answered on a thread, joined below
            started = sidecar.start_sidecar(
                self.path,
                gpu,
                self._sample_hz,
                wait=False,
                on_ready=self._sidecar_ready,
                on_unavailable=self._no_nvml,
                reserved_bytes=self.history.reserved_bytes(),
            )
            if isinstance(started, str):
                self._no_nvml(started)
            else:
                self.sidecar = started
        self._preimport_symbolizer()
        self._calibrate()
        self.history.enable()
        oom_observer.attach()
        if self.sidecar is not None and self._wait_for_sidecar:  # its own source: the wait for NVML's first samples
            with selfcost.region(selfcost.START_SIDECAR_WAIT):
                self.sidecar.join_started()

    @selfcost.timed(selfcost.CALIBRATION)
    def _calibrate(self) -> None:
        """Estimate what PyTorch's history recording costs per allocation (:mod:`.history_cost`)."""
        from memtrace.capture import history_cost

        h = self.history
        try:
            self._history_cost = history_cost.calibrate(
                h.torch, h.device, lambda: h._record(clear=True), lambda: h._record(clear=True, enabled=None)
            )
        except Exception as exc:  # an estimate only: never worth a failed start
            log.info("memtrace: the allocator history's cost was not calibrated: %s", exc)
            self._history_cost = history_cost.not_measured(f"calibration failed: {exc!r}")

    def _start_cupti(self) -> None:
        """The optional CUPTI source (``capture.cupti``), when asked for; its absence is a note, never an error."""
        from memtrace.capture import cupti

        if not cupti.wanted(self._cupti_arg):
            return
        self.cupti = cupti.start_source(self)
        self.facts[F.CUPTI] = self.cupti.fact() if self.cupti is not None else {"on": False}

    def _start_watchdog(self) -> None:
        """The drain watchdog, unless CUPTI's API callbacks are on: a callback inside PyTorch's
        ``cudaMalloc`` (the allocator's mutex held, the GIL released) waits for the GIL, so no other
        thread of ours may hold the GIL while it waits for that mutex — the watchdog's counters and drains
        do exactly that (it deadlocked on the H200). Drains then happen at phase boundaries and at close on
        the traced thread; a ring buffer that wraps before one is still reported (``recording.truncated``)."""
        if self.history is None:
            return
        if self.cupti is not None and self.cupti.stacks_on:
            self.add_note(
                "info",
                "drain watchdog off while CUPTI's API callbacks are on: the allocator history is drained at "
                "phase boundaries and at close (a ring buffer that wraps before that is reported)",
            )
            return
        self.history.start_watchdog()

    def _flush_cupti(self, *, stop: bool = False, throttle_s: float = 0.0) -> None:
        """Write the CUPTI records delivered so far (at drains, top-level phase boundaries, close)."""
        if self.cupti is None:
            return
        now = time.monotonic()
        if not stop and now - self._cupti_flushed < throttle_s:
            return
        self._cupti_flushed = now
        try:
            self.cupti.stop() if stop else self.cupti.flush()
        except Exception as exc:  # a bug must not lose the rest of the trace
            log.warning("memtrace: CUPTI records not written: %s", exc)
            self.add_note("error", f"CUPTI records not written: {exc!r}")
        with self._lock:
            self.facts[F.CUPTI] = self.cupti.fact()

    def _on_device_allocs(self, records) -> None:
        with self._lock:
            if not self._file_closed:
                self.writer.append_device_allocs(records)

    def _sidecar_ready(self, info: dict[str, Any]) -> None:
        if self._wait_for_sidecar:
            with self._lock:
                self.facts[F.SIDECAR] = info  # written with the next documents (an OOM flush, the close)
            return
        # not waited for: the program went on, so the fact is written at once (a SIGKILL keeps it) and the trace
        # says from when device-level samples exist
        late_ms = (now_us() - self.recording.start_us) / 1000
        info["ready_after_start_ms"] = round(late_ms, 1)  # the handle's own dict: the stop's figures join it
        self.set_fact(F.SIDECAR, info)
        self.add_note(
            "info",
            f"NVML samples begin {late_ms:,.0f} ms after recording began: the sidecar was not waited for on the "
            "program's thread (device-level memory before then is not sampled; PyTorch's allocations are all recorded)",
        )

    def _no_nvml(self, reason: str) -> None:
        log.warning("memtrace: no NVML samples: %s", reason)
        self.add_note("warning", f"no NVML samples: {reason}")

    def attach_history(self, history: Any) -> None:
        """Record ``history`` (an AllocatorHistory); its drains are converted on the background writer
        unless ``MEMTRACE_CAPTURE_SYNC=1``. (Separate so a benchmark can attach a FakeTorch history.)"""
        from memtrace.capture import background

        self.history = history
        if not background.synchronous():
            self._bg = background.Background(on_error=lambda text: self.add_note("error", text))
            history.defer = self._bg.submit
            self._phase_lock = threading.RLock()  # writes queue for the writer now: phases need not wait for it

    def _preimport_symbolizer(self) -> None:
        """Import torch._inductor now if Python stacks will be symbolized.

        PyTorch's Python-stack symbolizer asks ``hasattr(torch, "_inductor")``, which imports
        torch._inductor on the first snapshot with stacks: about 5 s once per process on the H200
        (measured with tests/gpu/probe_first_snapshot.py). vLLM imports it anyway; doing it here keeps
        that cost out of the first drain (and out of whatever phase it would have landed in).
        """
        import sys

        if self.recording.stacks == "none" or "torch._inductor" in sys.modules:
            return
        t0 = time.perf_counter()
        try:
            import torch._inductor  # noqa: F401
        except Exception as exc:  # a broken inductor only costs the first drain its import attempt
            log.info("memtrace: could not pre-import torch._inductor: %s", exc)
        self.facts[F.CAPTURE_PREIMPORT_S] = round(time.perf_counter() - t0, 3)

    def _intern_stack(self, frames) -> int:
        with self._lock:
            return self.writer.intern_stack(frames)

    def intern_stack(self, frames) -> int:
        """The id of a stack given as (filename, line, name) tuples, innermost first (hooks' own stacks)."""
        return self._intern_stack(frames)

    def _on_batch(self, events) -> None:
        if self.serving is not None:  # after start-up, in serving mode: the bounded ring, not the file
            self.serving.add_events(events)
            return
        with self._lock:
            if not self._file_closed:
                self.writer.append_events(events)

    # -- facts, notes, hook calls --------------------------------------------------------------
    # Writes of the trace file run on the background writer when there is one (in the order they were asked for,
    # after the drains handed to it before): the program's thread changes the session's own state and goes on.
    # Everything that promises a complete file waits for them (flush, close, the OOM path, SIGTERM, exit).
    def _write(self, write) -> None:
        """Run ``write`` (a write of the trace file) under the lock while the file is open: on the background
        writer when there is one, else here."""

        def task() -> None:
            with self._lock:
                if not self._file_closed:
                    write()

        self._later(task)

    def _queue_facts(self) -> None:
        """Write the facts as they will stand when the write runs (one write for any number of changes before it).
        Start-up's completion is left out until :meth:`flush_documents` wrote it with the finished start-up (a watcher,
        ``memtrace run``, takes it for "the trace is complete"), and kept after that. Neither this nor the setters take
        the session's lock, which the background writer holds while it converts a drain: the program's thread would
        wait for it (27 ms of ``writes`` in one H100 start-up); a fact is one dict item, replaced under the GIL."""
        with self._small_lock:
            if self._facts_queued:
                return
            self._facts_queued = True

        def write() -> None:
            self._facts_queued = False
            facts = dict(self.facts)  # one copy under the GIL: a setter's new item never lands mid-encoding
            if not self._complete_written:
                facts.pop(F.VLLM_STARTUP_COMPLETE_US, None)
            self.writer.set_facts(facts)

        self._write(write)

    @selfcost.timed(selfcost.WRITES)
    def set_fact(self, key: str, value: Any) -> None:
        """Store a JSON-compatible fact (written to the file at once, or by the background writer)."""
        self.facts[key] = value
        self._queue_facts()

    @selfcost.timed(selfcost.WRITES)
    def set_facts(self, facts: dict[str, Any]) -> None:
        """Store several JSON-compatible facts (with one write of the file, not one each)."""
        self.facts.update(facts)
        self._queue_facts()

    @selfcost.timed(selfcost.WRITES)
    def add_note(self, level: str, text: str) -> None:
        """Store a note a reader must see ("info", "warning", "error")."""
        note = Note(now_us(), level, text)
        self._write(lambda: self.writer.add_note(note))

    @selfcost.timed(selfcost.WRITES)
    def record_hook_call(self, call: HookCall) -> int:
        """Store one call of a hooked function; returns its index (the ``parent`` of nested calls)."""
        with self._small_lock:
            if self.closed:
                return -1
            index, self._hook_calls = self._hook_calls, self._hook_calls + 1
        self._write(lambda: self.writer.add_hook_call(call))
        return index

    @selfcost.timed(selfcost.WRITES)
    def record_vmm(self, records, frames=None) -> None:
        """Store calls of CUDA's virtual-memory API (``model.VMM_DTYPE`` rows: vLLM's extensible KV cache);
        ``frames``: the caller's stack for the rows' ``stack`` column, interned where the rows are written."""
        if self.closed:
            return

        def write() -> None:
            if frames:
                records["stack"] = self.writer.intern_stack(frames)
            self.writer.append_vmm(records)

        self._write(write)

    # -- phases --------------------------------------------------------------------------------
    def phase_path(self) -> str:
        """The open phases as a path, ``compile_or_warm_up/capture_model``; "" outside any phase."""
        with self._phase_lock:
            return "/".join(self._phases[i].name for i in self._open)

    @selfcost.timed(selfcost.WRITES)
    def add_phase(self, name: str, start_us: int, end_us: int, source: str = "user") -> int:
        """Record a phase that already ended (e.g. vLLM's ``init_device``: recording starts when it
        returns). It nests under the phase open now, if any. Returns its index, -1 once closed."""
        if self.closed:
            return -1
        with self._phase_lock:
            parent = self._open[-1] if self._open else None
            return self._new_phase(
                Phase(name=name, start_us=int(start_us), end_us=int(end_us), parent=parent, source=source)
            )

    def _new_phase(self, ph: Phase) -> int:
        """Keep ``ph`` and write it (under the phase lock); its index is its row's, as phases are written in order."""
        index = len(self._phases)
        self._phases.append(ph)
        row = Phase(ph.name, ph.start_us, ph.end_us, ph.parent, ph.source)  # as it is now: ends are written apart
        self._write(lambda: self.writer.add_phase(row))
        return index

    def _end_phase(self, index: int, t: int) -> None:
        self._phases[index].end_us = t
        self._write(lambda: self.writer.end_phase(index, t))

    @selfcost.timed(selfcost.PHASES)
    def phase_enter(self, name: str, source: str = "user") -> int:
        """Open a phase now; returns the token for :meth:`phase_exit`."""
        if self.closed:
            return -1
        if self.history is not None:  # drain first, so its cost never lands inside the phase
            self._hint_sidecar(self.history.boundary(top_level=not self._open))
        if not self._open:
            self._flush_cupti(throttle_s=0.5)
        with self._phase_lock:
            parent = self._open[-1] if self._open else None
            index = self._new_phase(Phase(name=name, start_us=now_us(), end_us=None, parent=parent, source=source))
            self._open.append(index)
        if self.history is not None:
            self._ranges[index] = self.history.enter_range(f"memtrace:{name}")
        return index

    @selfcost.timed(selfcost.PHASES)
    def phase_exit(self, index: int) -> None:
        """Close the phase ``index`` (and any phase still open inside it)."""
        if index < 0 or self.closed:
            return
        rng = self._ranges.pop(index, None)
        if rng is not None:
            self.history.exit_range(rng)
        with self._phase_lock:
            if index not in self._open:
                return
            t = now_us()
            while self._open:
                top = self._open.pop()
                self._end_phase(top, t)
                if top == index:
                    break
                self.add_note("warning", f"phase {self._phases[top].name!r} was still open when its parent ended")
            top_level = not self._open
        if self.history is not None:
            self._hint_sidecar(self.history.boundary(top_level=top_level))
        if top_level:
            self._flush_cupti(throttle_s=0.5)

    def _hint_sidecar(self, reserved: int | None) -> None:
        """Tell the sidecar PyTorch's reserved bytes (how it finds us by memory inside a container)."""
        if self.sidecar is not None and reserved is not None:
            self.sidecar.hint(reserved)

    # -- writing -------------------------------------------------------------------------------
    def flush_documents(self) -> None:
        from memtrace.capture import env

        with self._lock:
            if self._file_closed:
                return
            if self.history is not None:
                self.history.update_recording(self.recording)
                self.facts[F.CAPTURE] = self.history.capture_fact(self._phases)
                if isinstance(self.history.allocator_settings, dict):  # torch's own view of its settings
                    self.facts[F.ALLOCATOR_SETTINGS] = self.history.allocator_settings
            self.facts[F.INSTALL_PATHS] = env.install_paths()  # what is imported by now (no import)
            self._merge_installed()
            if self.serving is None or F.SELF_COST not in self.facts:  # start-up's, kept as it ended in serving
                self.facts[F.SELF_COST] = self.self_cost()  # (the window states its own: ServingWindow.cost)
            self.writer.set_process(self.process)
            self.writer.set_recording(self.recording)
            self.writer.set_facts(self.facts)
            self._complete_written = F.VLLM_STARTUP_COMPLETE_US in self.facts  # later writes keep it

    def self_cost(self) -> dict[str, Any]:
        """memtrace's own time on this process's threads so far (:mod:`.selfcost`), with the allocator
        history's calibration and the allocations it recorded (the analysis estimates its cost from them)."""
        fact = selfcost.totals(since=self._cost_before)
        history = dict(self._history_cost or history_cost_unknown())
        if self.history is not None:
            history["recorded_allocs"] = int(self.history.recorded_allocs())
        fact["history"] = history
        return fact

    def later(self, task) -> None:
        """Run ``task`` on the background writer, after what was handed to it before (at once, here,
        without one): work the traced program need not wait for (facts that take milliseconds to gather)."""
        self._later(task)

    def _later(self, task) -> None:
        """Run ``task`` on the background writer, after the drains handed to it (here without one)."""
        if self._bg is not None:
            self._bg.submit(task)
        else:
            task()

    def wait_written(self, timeout: float | None = WAIT_WRITTEN_S) -> bool:
        """Return once everything handed to the background writer is in the file (False after
        ``timeout`` seconds: never hang a dying program).

        Called with the session's lock held by this thread (a signal handler that interrupted a
        session method), the lock is let go while waiting, or the writer could never take it.
        """
        if self._bg is None:
            return True
        if not self._lock._is_owned():
            return self._bg.wait(timeout)
        state = self._lock._release_save()
        try:
            return self._bg.wait(timeout)
        finally:
            self._lock._acquire_restore(state)

    def enter_serving(self) -> None:
        """Start-up is complete and ``MEMTRACE_UNTIL=serving``: write it, then record into bounded rings."""
        from memtrace.capture import serving_session

        serving_session.enter(self)

    def write_window(self, reason: str) -> bool:
        """Write the serving window now and go on recording (SIGUSR2, SIGINT); False when not serving."""
        from memtrace.capture import serving_session

        return serving_session.write(self, reason)

    def begin_step(self, step: dict[str, Any]) -> int | None:
        """A vLLM scheduler step begins (in progress until :meth:`record_step` gets the token returned here; None
        outside serving)."""
        return self.serving.begin_step(step) if self.serving is not None else None

    def record_step(self, step: dict[str, Any], token: int | None = None) -> None:
        """One vLLM scheduler step of the serving window, ended (kept in its bounded ring; nothing outside
        serving); ``token``: :meth:`begin_step`'s."""
        if self.serving is not None:
            self.serving.add_step(step, token)

    def _save_segments(self, snap: dict[str, Any]) -> None:
        if self.serving is not None:  # the start-up part keeps its own end state; the window has its own
            return
        try:
            segments = self.history.segments(snap)
            with self._lock:
                if not self._file_closed:
                    self.writer.set_segments(segments)
        except Exception as exc:  # a bug must not lose the rest of the trace
            log.warning("memtrace: could not save the allocator state: %s", exc)
            self.add_note("error", f"allocator state not saved: {exc!r}")

    @selfcost.timed(selfcost.FLUSH)
    def flush(self, *, segments: bool = True) -> None:
        """Drain the allocator history and commit everything now (the file is complete on disk)."""
        self._flush(segments=segments)

    def _flush(self, *, segments: bool = True) -> None:
        if self.closed:
            return
        if self.history is not None:
            snap = self.history.drain("flush")
            if segments and snap is not None:
                self._later(lambda: self._save_segments(snap))
        self._flush_cupti()
        self.wait_written()
        self.flush_documents()

    def on_oom(self, device: int, requested: int, total: int, free: int) -> None:
        """Called by the OOM observer before torch raises: record the OOM and write the trace."""
        if self.closed or self.history is None or device != self.process.device_index:
            return
        record = {
            "time_us": now_us(),
            "device": int(device),
            "requested_bytes": int(requested),
            "device_total_bytes": int(total),
            "device_free_bytes": int(free),
            "phase": self.phase_path() or ("serving" if self.serving is not None else ""),
        }
        with selfcost.region(selfcost.OOM):
            with self._lock:
                if F.OOM in self.facts:
                    self.add_note("error", f"another CUDA OOM: {record}")
                else:
                    self.facts[F.OOM] = record
                self.recording.end_reason = "oom"
            if self.serving is not None:
                self.set_fact(F.OOM, self.facts[F.OOM])
                self.write_window("oom")  # the window with the failed request, before torch raises
                return
            self._flush()  # waits for the background writer: the trace is complete before torch raises

    def close(self, reason: str = "stop") -> Path:
        """Drain, save segments, stop the sidecar and close the file. Idempotent.

        At the end of vLLM's start-up (``reason="startup-complete"``) only the final snapshot is taken
        here; converting it, saving the allocator state, stopping the sidecar and closing the file run
        on the background writer (:meth:`wait_written`; interpreter exit and SIGTERM wait for it), and
        the start-up-complete fact reaches the file last, with the finished trace. Any other reason
        returns with the file complete. The time taken here, up to the closing of the file, is charged
        to ``stop`` (:mod:`.selfcost`) in the trace's own cost.
        """
        deferred = self._bg is not None and reason == "startup-complete"
        with selfcost.region(selfcost.STOP):
            if not self._stop_recording(reason):
                return self.path
        if deferred:
            registry.finishing(self)
            self._bg.submit(self._finish)
        else:
            with selfcost.region(selfcost.STOP):
                self.wait_written()
            self._finish()
        registry.deactivate(self)
        return self.path

    def _stop_recording(self, reason: str) -> bool:
        """End the open phases, stop CUPTI and the allocator history (the final snapshot); False if closed."""
        with self._phase_lock, self._lock:
            if self.closed:
                return False
            self.closed = True
            t = now_us()
            if reason in ("stop", "exit", "startup-complete") or reason.startswith("exception"):
                for index in self._open:  # a graceful stop inside phases ends them now
                    self._end_phase(index, t)
                self._open.clear()
            if self.recording.end_reason != "oom" or reason not in ("exit", "stop"):
                self.recording.end_reason = reason
        self._flush_cupti(stop=True)
        snap = None
        if self.history is not None:
            try:
                snap = self.history.stop()
            except Exception as exc:  # a bug must not lose the rest of the trace
                log.warning("memtrace: could not save the final allocator state: %s", exc)
                self.add_note("error", f"final allocator state not saved: {exc!r}")
        if self.serving is not None:
            from memtrace.capture import serving_session

            self.serving.stop()
            self._later(lambda: serving_session.put(self, reason, snap))
        elif snap is not None:
            self._later(lambda: self._save_segments(snap))
        return True

    def _finish(self) -> None:
        """Stop the sidecar, write the documents and close the file (last of all background work)."""
        if self.sidecar is not None:
            info = self.sidecar.stop()
            if self.sidecar.unavailable is None:
                self.facts[F.SIDECAR] = info
        if self._env_thread is not None:
            self._env_thread.join(ENV_WAIT_S)  # long done: it takes ~0.1 s, start-up seconds
        with self._lock:
            self.recording.end_us = now_us()
            self.flush_documents()
            self._file_closed = True
            self.writer.close()
        selfcost.claim()
        if self._bg is not None:
            self._bg.end()
        registry.finished(self)


def history_cost_unknown() -> dict[str, Any]:
    """The history part of the self-cost fact before the session knows whether there is a GPU."""
    return {"measured": False, "why": "recording had not started its sources"}


def begin_session(path_or_dir: str | os.PathLike | None, **kwargs: Any) -> Session:
    """Create, register and start the process's session (UsageError if one is recording)."""
    link = None

    def make(path: Path, **settings: Any) -> Session:
        nonlocal link
        link = _ray_link(path)
        if link is not None:
            path = link.path
        try:
            return Session(path, **settings)
        except OSError as exc:
            raise MemtraceError(
                f"cannot write the trace {path}: {exc.strerror or exc}; choose another MEMTRACE_DIR"
            ) from None

    session = registry.claim(path_or_dir, make, **kwargs)
    _tie(session, link)
    session.start_sources()
    return session


def _ray_link(path: Path) -> Any:
    """The Ray collector's link (``ray_gather.link_for``), imported only in a process where Ray is initialised: a
    worker without Ray does not pay for importing the collector's code (~5-10 ms) on its thread."""
    ray = sys.modules.get("ray")
    if ray is None or not getattr(ray, "is_initialized", lambda: False)():
        return None
    from memtrace.capture import ray_gather

    return ray_gather.link_for(path)


def _tie(session: Session, link: Any) -> None:
    """The session's clock fact, and for a Ray worker its collector: registered, handed the file at the end."""
    if link is None:
        session.set_fact(F.CLOCK, clock.local_fact())
        return
    for key, value in link.facts().items():
        session.set_fact(key, value)
    try:
        link.register(session.process)
    except Exception as exc:  # noqa: BLE001 - the trace is recorded all the same
        log.warning("memtrace: could not register this trace with the run's collector: %s", exc)
    session.on_file_closed = link.hand_over
