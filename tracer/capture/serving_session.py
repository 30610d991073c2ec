"""What a session does in serving mode: switch to the rings after start-up, and write the window.

:func:`enter` runs where vLLM's start-up is complete (``MEMTRACE_UNTIL=serving``): the start-up part is
flushed to the file as at the end of warm-up, PyTorch's counters give the window's start state, the
start-up NVML sidecar is stopped (its samples are start-up's), a serving NVML sampler (the device's used memory
and the other processes' on it, as the sidecar samples them) and the SIGUSR2 handler start. From then on
PyTorch's own history ring holds the allocator's events (``AllocatorHistory.hold``; or, with
``MEMTRACE_SERVING_DRAIN_S`` > 0, drains go into :class:`.serving.ServingRecorder`'s ring). :func:`write` reads
PyTorch's history (the held ring whole; else what is new, into the ring) and writes the window (its events,
samples, steps, the allocator state from the same snapshot and memtrace's own cost since serving began:
:func:`cost_since`) into the trace, replacing any earlier write: on a CUDA OOM (after the OOM fact), on SIGUSR2,
SIGTERM/SIGINT and at exit.
"""

from __future__ import annotations

import logging
from typing import Any

from memtrace import facts as F
from memtrace.capture import selfcost, serving
from memtrace.capture.registry import now_us

log = logging.getLogger("memtrace")


def enter(session: Any) -> None:
    """Start-up is complete: write it, then keep what follows in bounded rings."""
    k = serving.knobs()
    session.flush()
    history = session.history
    state: dict[str, Any] = {}
    if history is not None:
        current = history.current_bytes()
        state = (
            {**current, "exact": True, "source": "torch's counters when serving began"}
            if current
            else {"allocated_bytes": 0, "reserved_bytes": 0, "exact": False, "source": "counters unreadable"}
        )
    entries = session.recording.max_entries if history is not None else None
    stacks = serving.serving_stacks(session.recording.stacks)
    recorder = serving.ServingRecorder(
        k, startup_end_us=now_us(), start_state=state, torch_entries=entries, stacks=stacks
    )
    recorder.cost_of = cost_since(recorder.startup_end_us, history)
    with session._lock:
        session.serving = recorder
    fact = {"started_us": recorder.startup_end_us, "bounds": recorder.bounds, "on_cpu": history is None}
    session.set_fact(F.SERVING, fact)
    if history is not None:
        history.set_stacks(stacks)
        if serving.held(k):  # PyTorch's ring is the flight recorder: nothing drained while serving
            history.hold(recorder.bounds["max_events"], recorder.hold_events)
        else:
            history.max_undrained_s = k[serving.DRAIN_S_ENV]
        _stop_sidecar(session)
        uuid = (session.facts.get(F.ENV) or {}).get("gpu_uuid")
        # what this process holds, for telling it apart by memory inside a container: PyTorch's segments and the
        # KV cache vLLM 0.34+ committed outside PyTorch
        kv = (session.facts.get(F.VLLM_EXTENSIBLE_KV) or {}).get("physical_bytes") or 0
        held = int(state.get("reserved_bytes", 0)) + int(kv)
        recorder.start_sampler(
            uuid, session.add_note, cuda_total_bytes=session.process.device_total_bytes, held_bytes=held
        )
    else:
        session.add_note("info", "serving window without allocator events (no CUDA device): scheduler steps only")
    from memtrace.capture import signals

    signals.install_snapshot()
    log.info(
        "memtrace: serving: start-up written; keeping the last %d allocator events / %s s (at most %.1f MiB)",
        recorder.bounds["max_events"],
        recorder.bounds["max_age_s"],
        recorder.bounds["ring_bytes_max"] / (1 << 20),
    )


def cost_since(since_us: int, history: Any):
    """From now (``since_us``: serving's start), what memtrace spends up to a write at ``until_us``, for
    ``ServingWindow.cost``: the self-cost totals since now (``selfcost.totals``, registration included only if it
    happened since), the span, and the allocations the allocator counted meanwhile (what PyTorch's recording cost
    is estimated from, ``analysis.self_cost.serving_cost``; absent without an allocator)."""
    base = selfcost.totals()
    allocs0 = history.allocations() if history is not None else None

    def cost(until_us: int) -> dict[str, Any]:
        out = {"since_us": int(since_us), "until_us": int(until_us), **selfcost.totals(base, registration=False)}
        now = history.allocations() if history is not None else None
        if now is not None and allocs0 is not None:
            out["allocs"] = now - allocs0
        return out

    return cost


def _stop_sidecar(session: Any) -> None:
    """The start-up sidecar's samples end with start-up (its file writes would grow without bound)."""
    sidecar = session.sidecar
    if sidecar is None:
        return
    session.sidecar = None

    def stop() -> None:
        info = sidecar.stop()
        if sidecar.unavailable is None:
            session.set_fact(F.SIDECAR, info)

    session.later(stop)


def write(session: Any, reason: str) -> bool:
    """Drain into the ring and write the window now (the process goes on). False when not serving."""
    if session.serving is None or session._file_closed:
        return False
    with selfcost.region(selfcost.FLUSH):
        snap = session.history.drain("window") if session.history is not None else None
        session.wait_written()
        put(session, reason, snap)
    return True


def put(session: Any, reason: str, snap: dict[str, Any] | None) -> None:
    """Write the window as the rings hold it, with the allocator state of ``snap`` (run after its drain's
    conversion: on the background writer, or once it is waited for)."""
    try:
        segments = session.history.segments(snap) if snap is not None and session.history is not None else []
        with session._lock:
            if session._file_closed:
                return
            window = session.serving.window(now_us=now_us(), reason=reason, segments=segments)
            session.writer.set_window(window)
            session.flush_documents()
        log.info(
            "memtrace: serving window written (%s): %d events kept, %d dropped, %d steps -> %s",
            reason,
            window.events_kept,
            window.events_dropped,
            window.steps_kept,
            session.path,
        )
    except Exception as exc:  # a bug must not lose the start-up part or stop the server
        log.warning("memtrace: the serving window was not written: %s", exc)
        session.add_note("error", f"serving window not written ({reason}): {exc!r}")
