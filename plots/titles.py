"""Figure titles from what a trace recorded (model, vLLM version, GPU), never from its folder's name.

What ran, with what, on what is ``analysis.fingerprint.describe_run`` (``"Qwen3MoeForCausalLM, vLLM
0.25.1, NVIDIA H200"``; a run without vLLM names the program it ran); this module only words titles
around it. The run's name is the last resort, for traces that recorded none of these.
"""

from __future__ import annotations

from ..analysis.fingerprint import describe_run
from ..model import Trace
from ..units import format_bytes, format_gib


def timeline_title(trace: Trace, fallback: str = "") -> str:
    """``GPU memory during start-up: <describe_run>``."""
    what = describe_run(trace, fallback)
    return f"GPU memory during start-up: {what}" if what else "GPU memory during start-up"


def flame_titles(trace: Trace, curves, flame, moment, fallback: str = "") -> tuple[str, str]:
    """(title, subtitle) of a flame graph: the moment and window shown, then what ran and the totals.

    Args:
        trace: the trace.
        curves: ``analysis.curves.all_curves(trace)``.
        flame: ``analysis.flame.flame_at(...)``.
        moment: ``analysis.moment.Moment`` the flame shows.
        fallback: what to call the run when it recorded nothing to describe it by.
    """
    from ..analysis.phases import recording_span
    from ..analysis.target import resolve_target

    secs = (moment.time_us - recording_span(trace)[0]) / 1e6
    where = "" if moment.what.endswith(moment.phase_path) else f", in {moment.phase_path or 'no phase'}"
    phase = moment.phase_path
    if moment.since_us is not None and (moment.since_what, moment.what) == (
        f"the start of {phase}",
        f"the fullest moment of {phase}",
    ):
        title = f"What {phase} added and still held at its fullest moment: {secs:.3f} s"
    elif moment.since_us is not None:
        title = f"Allocated since {moment.since_what} and still live at {moment.what}: {secs:.3f} s{where}"
    else:
        title = f"Live GPU memory at {moment.what}: {secs:.3f} s{where}"
    k = moment.event_index
    reserved = int(curves.reserved.bytes[k + 1]) if k is not None else curves.reserved.at(moment.time_us)
    allocated = int(curves.allocated.bytes[k + 1]) if k is not None else curves.allocated.at(moment.time_us)
    shown = f"{format_bytes(flame.torch_bytes, 2)} shown of " if moment.since_us is not None else ""
    sub = [describe_run(trace, fallback), trace.label, f"{shown}{format_gib(allocated)} allocated",
           f"reserved {format_gib(reserved)}"]  # fmt: skip
    target = resolve_target(trace).target_bytes
    if target is not None:
        sub.append(f"target {format_gib(target)}")
    if moment.what == "the OOM":
        from ..analysis.oom import find_oom

        oom = find_oom(trace)
        free = f", {format_gib(oom.free_bytes)} free on the device" if oom.free_bytes is not None else ""
        sub.append(f"the failed request: {format_bytes(oom.requested_bytes, 2)}{free}")
    if trace.recording.stacks == "none":
        sub.append("no Python stacks recorded: grouped by phase")
    return title, " · ".join(s for s in sub if s)
