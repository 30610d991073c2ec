"""Figure titles from what a run recorded (model, vLLM version, GPU), never from its folder's name.

What ran, with what, on what is ``analysis.fingerprint.describe_run`` (``"Qwen3MoeForCausalLM, vLLM
0.25.1, NVIDIA H200"``; a run without vLLM names the program it ran); this module only words titles
around it, from an analysed run or rank (the target, the OOM and the figures are the rank's own). A run
is called a start-up unless it is an imported PyTorch snapshot; the run's name is the last resort, for traces that
recorded none of these.
"""

from __future__ import annotations

from memtrace import facts as F
from memtrace.analysis.analysed.fingerprint import describe_run
from memtrace.analysis.memory.quantities import holds_reserved, memory_of
from memtrace.units import format_bytes, format_gib


def what_ran(run) -> str:
    """``GPU memory during start-up`` for a run memtrace recorded (``... and serving`` with a serving window),
    ``GPU memory`` for imported PyTorch snapshots (a training step, an inference loop: nothing says it is a
    start-up), ``CPU (host) memory`` for a profiler trace of the CPU (``quantities.memory_of``)."""
    imported = all(isinstance(r.trace.facts.get(F.IMPORT), dict) for r in run.ranks)
    memory = memory_of([r.trace for r in run.ranks])
    serving = " and serving" if any(r.trace.window is not None for r in run.ranks) else ""
    return memory if imported else f"{memory} during start-up{serving}"


def died_prefix(rank, multi: bool = False, where: bool = True) -> str:
    """``DIED of CUDA OOM at 7.05 s in compile_or_warm_up/kernel_warmup — `` for a rank that died (its label
    first in a run of several), else "": a title of a run that died says so first."""
    o = rank.oom
    if o is None:
        return ""
    who = f"{rank.label.capitalize()} " if multi else ""
    phase = f" in {o.phase_path}" if o.phase_path and where else ""
    return f"{who}DIED of CUDA OOM at {rank.seconds(o.time_us):.2f} s{phase} — "


def timeline_title(run, fallback: str = "") -> str:
    """``GPU memory during start-up: <describe_run>`` (``GPU memory: ...`` when vLLM recorded nothing), after
    :func:`died_prefix` of the first rank to die when the run died."""
    from pathlib import Path

    what = describe_run(run.ranks[0].trace, fallback or Path(run.path).name)
    head = what_ran(run)
    died = died_prefix(run.worst, run.multi) if run.died else ""
    return died + (f"{head}: {what}" if what else head)


def flame_titles(rank, flame, moment, fallback: str = "", oom_words: str = "") -> tuple[str, str]:
    """(title, subtitle) of a flame graph of ``rank`` (``analysis.rank.AnalysedRank``): the moment and window
    shown, then what ran and the totals, the target (with its source) and the OOM the rank holds.

    Args:
        rank: the analysed rank.
        flame: ``analysis.flame.flame_at(...)``.
        moment: ``analysis.moment.Moment`` the flame shows.
        fallback: what to call the run when it recorded nothing to describe it by.
        oom_words: the rank's OOM in the renderer's words (``plots.oom_text.details``: the failed request, the
            device's free memory, the allocator's limit), shown when the moment is the OOM.
    """
    trace, curves = rank.trace, rank.curves
    secs = rank.seconds(moment.time_us)
    where = "" if moment.what.endswith(moment.phase_path) else f", in {moment.phase_path or 'no phase'}"
    phase = moment.phase_path
    whole_phase = (moment.since_what, moment.what) == (f"the start of {phase}", f"the fullest moment of {phase}")
    if moment.since_us is not None and whole_phase:
        title = f"What {phase} added and still held at its fullest moment: {secs:.3f} s"
    elif moment.since_us is not None:
        title = f"Allocated since {moment.since_what} and still live at {moment.what}: {secs:.3f} s{where}"
    else:
        at = moment.what if moment.what == f"{secs:.3f} s" else f"{moment.what}: {secs:.3f} s"  # --at 179.5: once
        title = f"Live {memory_of([trace])} at {at}{where}"
    k, now = moment.event_index, moment.time_us
    reserved, allocated = (
        int(c.bytes[k + 1]) if k is not None else c.at(now) for c in (curves.reserved, curves.allocated)
    )
    shown = f"{format_bytes(flame.torch_bytes, 2)} shown of " if moment.since_us is not None else ""
    sub = [describe_run(trace, fallback), trace.label, f"{shown}{format_gib(allocated)} allocated",
           f"reserved {format_gib(reserved)}" if holds_reserved(trace.process) else ""]  # fmt: skip
    if rank.target.target_bytes is not None:
        sub.append(f"target {format_gib(rank.target.target_bytes)}")
    if moment.what == "the OOM" and rank.oom is not None and oom_words:
        sub.append(oom_words)
    if trace.recording.stacks == "none":
        sub.append("no Python stacks recorded: grouped by phase")
    sub.append(f"times: {rank.origin.sentence}")
    if rank.oom is not None and moment.what != "the OOM":  # where it died, in the subtitle (wrapped, never cut)
        sub.insert(2, f"died of CUDA OOM {'in ' + rank.oom.phase_path if rank.oom.phase_path else 'outside any phase'}")
    return died_prefix(rank, where=False) + title, " · ".join(s for s in sub if s)
