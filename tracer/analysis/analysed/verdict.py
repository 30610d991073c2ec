"""The verdict of one rank: died, did not finish, crossed, within target, no target, or recorded nothing.

Pure functions over a trace and figures already computed (``analysis.rank.AnalysedRank`` calls them once and
holds the answers): :func:`recorded_nothing` (no allocator events to judge), :func:`unfinished` (a vLLM start-up
that ended before it completed, not of CUDA OOM). The run's
verdict is its worst rank's (``analysis.run``).
"""

from __future__ import annotations

from dataclasses import dataclass

from memtrace import facts as F
from memtrace.analysis.memory.phases import phase_path
from memtrace.model import Trace

#: The verdicts of a rank and of a run, worst first.
DIED = "died"
UNFINISHED = "did not finish"  # a vLLM start-up that ended before it completed, not of CUDA OOM
CROSSED = "crossed"
WITHIN = "within target"
NO_TARGET = "no target"
NOTHING = "recorded nothing"


@dataclass(frozen=True)
class Unfinished:
    """A vLLM start-up that ended before it completed, not of CUDA OOM (:func:`unfinished`)."""

    phase_path: str  # the last phase it entered
    end_us: int  # when the recording ended
    end_reason: str  # "exit", "signal:SIGTERM", "exception..."
    error_type: str | None = None  # the error that left the phase, when the plugin saw it
    error_message: str | None = None
    #: whether the plugin that recorded it keeps vLLM's error (None: its trace format cannot tell)
    plugin_keeps_errors: bool | None = None


#: The plugin keeps vLLM's start-up error (``facts.VLLM_STARTUP_ERROR``) since 2026-12-04: every memtrace writing
#: format 1.4 or later has it, none writing 1.2 or earlier did; 1.3 files were written both before and after.
KEEPS_ERRORS_FORMAT = (1, 4)
LACKS_ERRORS_FORMAT = (1, 2)


def plugin_keeps_errors(trace: Trace) -> bool | None:
    """Whether the memtrace that wrote ``trace`` keeps vLLM's start-up error, from its format (None: 1.3)."""
    if trace.format_version >= KEEPS_ERRORS_FORMAT:
        return True
    return False if trace.format_version <= LACKS_ERRORS_FORMAT else None


def recorded_nothing(trace: Trace) -> bool:
    """No allocator events: nothing to judge (a CPU-only worker, or recording never started). A snapshot of
    allocator state alone (``facts["import"]["state"] == "moment"``) has its segments to judge."""
    one_moment = (trace.facts.get(F.IMPORT) or {}).get("state") == "moment"
    return len(trace.events) == 0 and not (one_moment and trace.segments)


def unfinished(trace: Trace, last_us: int) -> Unfinished | None:
    """How a vLLM start-up ended before it completed, other than by CUDA OOM, or None.

    A trace the vLLM plugin marked (phases of source "vllm") whose recording ended at the process's exit, a
    signal or an exception without the plugin's "start-up complete" fact: vLLM stopped itself (it refused to
    start: no room for one KV block, a bad flag) or was stopped. The last phase it entered and, when the plugin
    saw it (``facts.VLLM_STARTUP_ERROR``), the error say where and why. ``last_us``: the last microsecond the
    trace knows about (``phases.recording_span``), when the recording has no end time."""
    reason = trace.recording.end_reason
    if not any(p.source == "vllm" for p in trace.phases) or F.VLLM_STARTUP_COMPLETE_US in trace.facts:
        return None
    if reason != "exit" and not reason.startswith(("signal", "exception")):
        return None
    last = max(range(len(trace.phases)), key=lambda i: (trace.phases[i].start_us, i))
    error = trace.facts.get(F.VLLM_STARTUP_ERROR) or {}
    return Unfinished(
        phase_path=phase_path(trace, last),
        end_us=trace.recording.end_us or last_us,
        end_reason=reason,
        error_type=error.get("type"),
        error_message=error.get("message"),
        plugin_keeps_errors=plugin_keeps_errors(trace),
    )
