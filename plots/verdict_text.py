"""The run's verdict in one sentence: the first thing every output of a run says.

One wording, from ``analysis.run.AnalysedRun.verdict`` and its worst rank, for the issue bundle's first
sentence, the view's headline and the report's first line: a run that died says so (who, when, where, the
failed request), a run that recorded nothing says so and claims no target kept, a run that crossed its
target says by how much, and a run within its target says how far below it stayed.
"""

from __future__ import annotations

from memtrace.analysis.analysed.origin import who
from memtrace.analysis.analysed.verdict import CROSSED, DIED, NOTHING, UNFINISHED, WITHIN
from memtrace.analysis.memory.quantities import BY_KEY, OTHERS, is_one_moment
from memtrace.plots import oom_text
from memtrace.units import format_gib


def label(curve: str) -> str:
    """The quantity's one label (``analysis.quantities``) for a crossing's curve."""
    q = BY_KEY.get(curve)
    return q.label if q is not None else curve


def died_sentence(run) -> str:
    """``DIED: rank 1 ran out of CUDA memory at 7.05 s in compile_or_warm_up/kernel_warmup (requested 1.00
    GiB, device free 124.73 GiB). Nothing after it was recorded.`` (the first rank to die)."""
    r = run.worst
    o = r.oom
    name = f"{r.label} ran" if run.multi else "the process ran"
    return (
        f"DIED: {name} out of CUDA memory at {r.seconds(o.time_us):.2f} s {oom_text.where(o)} "
        f"({oom_text.details(o, r.trace.process.device_total_bytes)}). Nothing after it was recorded."
    )


def unfinished_sentence(run) -> str:
    """``DID NOT FINISH: the process's start-up ended at 204.62 s (the process exited) in compile_or_warm_up/...,
    without a CUDA OOM: vLLM raised ValueError: No available memory ... Nothing after it was recorded.``"""
    r = run.worst
    u = r.unfinished
    name = f"{r.label}'s" if run.multi else "the process's"
    how = "the process exited" if u.end_reason == "exit" else u.end_reason
    return (
        f"DID NOT FINISH: {name} start-up ended at {r.seconds(u.end_us):.2f} s ({how}) in {u.phase_path}, "
        f"without a CUDA OOM: {_why(u)}. Nothing after it was recorded; no KV cache was sized to judge."
    )


def _why(u) -> str:
    """What ended an unfinished start-up: vLLM's error as the plugin kept it, else why the trace does not say."""
    if u.error_type:
        return f"vLLM raised {u.error_type}: {u.error_message}"
    if u.plugin_keeps_errors:
        return (
            "the plugin did not see the error (vLLM raised it outside the phases memtrace hooks): vLLM's log says why"
        )
    if u.plugin_keeps_errors is False:
        return "vLLM's log says why (this trace predates the plugin keeping the error)"
    return "memtrace did not see the error: vLLM's log says why"


def nothing_sentence(run) -> str:
    """``Recorded nothing: ranks 0-1 recorded no allocator events ... no peak, and no target kept or crossed.``"""
    names = who([r.label for r in run.ranks]) if run.multi else "the process"
    return (
        f"Recorded nothing: {names} recorded no allocator events (a CPU-only worker, a job that lost its GPU, "
        "or recording never started), so there is no peak to show and no target was kept or crossed."
    )


def headline(run) -> str:
    """The run's verdict in one sentence (see the module docstring)."""
    verdict = run.verdict
    if verdict == DIED:
        return died_sentence(run)
    if verdict == NOTHING:
        return nothing_sentence(run)
    if verdict == UNFINISHED:
        return unfinished_sentence(run)
    r = run.worst
    of = f" of {r.label}" if run.multi else ""
    target = r.target.target_bytes
    if verdict == CROSSED:
        c = r.first_crossing
        where = f" in {c.phase_path}" if c.phase_path else " outside any phase"
        return (
            f"CROSSED the target: {label(c.curve)}{of} went over {format_gib(target)} at "
            f"{r.seconds(c.time_us):.2f} s{where} and reached {format_gib(c.max_bytes)} "
            f"(+{format_gib(c.overshoot_bytes)})."
        )
    # the run's headline quantity and its peak, decided once (``AnalysedRank.headline``): what this process held
    # with vLLM 0.34's KV cache outside PyTorch, else the quantity its peak is compared by
    q, peak = BY_KEY[r.headline.quantity], r.headline.point.bytes
    bound = r.peak_bound
    peaked = f"peaked at no less than {format_gib(peak)}" if bound.lower_bound else f"peaked at {format_gib(peak)}"
    if verdict == WITHIN:
        within = (
            "Within the target at the snapshot's one moment" if is_one_moment(r.trace.facts) else "Within the target"
        )
        card = r.whole_device_peak_bytes
        shared = ""
        if card is not None and r.peak_others is not None and r.peak_others.bytes > 0:  # a neighbour filled it
            shared = f"; with {OTHERS.label}' memory the card held up to {format_gib(card)}"
            shared += f", {format_gib(target - card)} below it" if card <= target else ", over it"
        below = f"{format_gib(target - peak)} below the target ({format_gib(target)})"
        return f"{within}: {q.label}{of} {peaked}, {below}{shared}."
    return f"No target to compare with: {q.label}{of} {peaked}."
