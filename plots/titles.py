"""Figure titles from what a trace recorded (model, vLLM version, GPU), never from its folder's name.

``describe_run(trace)`` -> ``"Qwen3MoeForCausalLM, vLLM 0.25.1, NVIDIA H200"``: the model (a Hugging
Face id as given, else the architecture vLLM resolved, else the served name; a local path alone says
nothing to a reader of an upstream issue), the vLLM version, the GPU and, for a run that stood for a
smaller card, that card. A run without vLLM names the program it ran (``record_startup.py``). The run's
name is the last resort, for traces that recorded none of these.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from .. import facts as F
from ..analysis.target import card_capacity
from ..model import Trace
from ..units import format_bytes, format_gib


def _dict(trace: Trace, key: str) -> dict:
    value = trace.facts.get(key)
    return value if isinstance(value, dict) else {}


def model_name(trace: Trace) -> str:
    """The model as a reader knows it ("" when not recorded)."""
    cfg = _dict(trace, F.VLLM_CONFIG)
    model = str(cfg.get("model") or "")
    local = not model or model.startswith(("/", ".", "~")) or model.count("/") > 1
    arch = str(cfg.get("architecture") or "")
    if model and not local:
        return model
    if arch:
        return arch
    served = str(cfg.get("served_model_name") or "")
    return PurePosixPath(served or model).name


def _program(trace: Trace) -> str:
    cmd = _dict(trace, F.ENV).get("cmdline")
    if isinstance(cmd, list) and cmd:
        args = [str(c) for c in cmd]
        script = next((a for a in args if a.endswith(".py")), args[0])
        return PurePosixPath(script).name
    return ""


def gpu_name(trace: Trace) -> str:
    """The GPU, and the card the run stood for when that is smaller ("NVIDIA H200 as a 16 GiB card")."""
    gpu = str(_dict(trace, F.ENV).get("gpu_name") or "")
    stood_for, source = card_capacity(trace)  # the one owner of "the card the run stood for"
    physical = trace.process.device_total_bytes
    if source == "recorded card" and stood_for and physical and stood_for < physical:
        return f"{gpu or 'GPU'} as a {format_gib(stood_for, 2).replace('.00 ', ' ')} card"
    return gpu


def describe_run(trace: Trace, fallback: str = "") -> str:
    """What ran, with what, on what: the parts that were recorded, joined by commas."""
    version = trace.facts.get(F.VLLM_VERSION) or _dict(trace, F.ENV).get("vllm")
    parts = [model_name(trace)]
    parts.append(f"vLLM {version}" if version else _program(trace))
    parts.append(gpu_name(trace))
    parts = [p for p in parts if p]
    return ", ".join(parts) if parts else fallback


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
