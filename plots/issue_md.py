"""The upstream-issue bundle of an analysed run: issue.md, the timeline and the flame graph at the worst rank's
peak beside it, and (on request) the trace itself compressed for attaching.

A renderer over ``analysis.run.AnalysedRun``; it computes nothing. issue.md answers first: its first screen
(about 30 lines, ``answer``) is the run's verdict (``plots.verdict_text.headline``: died / crossed / within
target / recorded nothing) and a few lines saying where the peak was, the target and the crossing, who held
the memory, what the hooked workspace allocators returned and the KV figures; then the timeline; then the
environment table and the command. Long material is folded in ``<details>`` blocks (the allocator settings,
the whole report with its phase table and hook calls) so that a maintainer reading it on GitHub sees the
answer without scrolling. A run that recorded nothing draws no picture and links none. Local paths never
reach the text: the fingerprint shortens them, and the report is rendered without file paths.
"""

from __future__ import annotations

import io
from pathlib import Path

from memtrace.analysis.analysed.fingerprint import allocator_settings, command_line, environment
from memtrace.analysis.analysed.titles import timeline_title, what_ran
from memtrace.analysis.analysed.verdict import NOTHING
from memtrace.analysis.holders.live import knows_holders
from memtrace.analysis.holders.moment import headline_words
from memtrace.analysis.memory.categories import outermost_hook_calls
from memtrace.analysis.memory.quantities import ALLOCATED, BEFORE_RECORDING, DEVICE_USED, HELD, RESERVED, holds_reserved
from memtrace.analysis.memory.target import describe
from memtrace.plots import verdict_text
from memtrace.plots.serving_text import room_section, window_lines
from memtrace.plots.text import before_recording_figures, holder_text
from memtrace.units import count_of, format_gib

#: every file the bundle may write (an existing bundle holding any of them is only replaced with --force)
FILES = ("issue.md", "timeline.png", "flame.svg", "flame.folded")
IMAGES = ("timeline.png", "flame.svg", "flame.folded")
_HOLDERS = 3  # holders named on the first screen
_HOOKS = 4  # hooked functions named on the first screen


def _at(rank, t_us: int) -> str:
    return f"{rank.seconds(t_us):.2f} s"


def _in(path: str) -> str:
    return f"in `{path}`" if path else "outside any phase"


def _peak_line(run) -> str:
    r = run.worst
    pk = r.peak
    before = " before it died" if r.oom is not None else ""
    h = r.headline
    if h.quantity == HELD.key:  # the run's headline (``AnalysedRank.headline``) leads
        head = f"{HELD.label} {format_gib(h.point.bytes)} at {_at(r, h.point.time_us)}"
        more = f" {_in(h.point.phase_path)}; {RESERVED.label} {format_gib(pk.reserved_bytes)} at {_at(r, pk.time_us)}"
    elif holds_reserved(r.trace.process):
        head = f"{RESERVED.label} {r.peak_bound.words}{format_gib(pk.reserved_bytes)} at {_at(r, pk.time_us)}"
        more = f" {_in(pk.phase_path)}; {ALLOCATED.label} {format_gib(pk.allocated_bytes)} at its fullest"
    else:  # the CPU's trace holds allocated alone
        pa = r.peak_allocated
        head = f"{ALLOCATED.label} {r.peak_bound.words}{format_gib(pa.bytes)} at {_at(r, pa.time_us)}"
        more = f" {_in(pa.phase_path)}"
    if r.peak_device_used is not None:
        more += f"; {DEVICE_USED.label} (NVML) up to {format_gib(r.peak_device_used.bytes)}"
    if r.peak_bound.lower_bound:
        more += f" (a lower bound: {r.peak_bound.why})"
    return f"- **Peak{before}:** {head}{more}."


def _target_line(run) -> str:
    r = run.worst
    target = r.target.target_bytes
    if target is None:
        return "- **Target:** none recorded or given (`--util` / `--target` set one)."
    src = f"from {describe(r.target)}"
    c = r.first_crossing
    if c is None:
        return f"- **Target:** {format_gib(target)} ({src}): never crossed."
    return (
        f"- **Target:** {format_gib(target)} ({src}). {verdict_text.label(c.curve).capitalize()} first crossed the target "
        f"({format_gib(target)}) {_in(c.phase_path)} at {_at(r, c.time_us)}; its highest point above it was "
        f"{format_gib(c.max_bytes)} (+{format_gib(c.overshoot_bytes)}) at {_at(r, c.max_us)}."
    )


def _holders_line(run) -> str | None:
    r = run.worst
    if not r.holders:
        return None
    named = ", ".join(
        f"{format_gib(h.bytes)} ({h.share * 100:.0f} %) `{holder_text(h)}`"
        + (f" ({count_of(h.count, 'block')})" if h.count else "")
        for h in r.holders[:_HOLDERS]
    )
    more = f"; {len(r.holders) - _HOLDERS} more in the report below" if len(r.holders) > _HOLDERS else ""
    return f"- **Who held it** at the peak: {named}{more}."


def _hooks_line(run) -> str | None:
    from memtrace.analysis.holders.flame import hook_short_name

    r = run.worst
    if (top := outermost_hook_calls(r.trace)) is None:
        return None
    calls, returned = top
    each = ", ".join(
        f"`{hook_short_name(h.name)}` {format_gib(h.returned_bytes)} ({h.calls:,} calls)"
        for h in r.hook_totals[:_HOOKS]
    )
    more = f", {len(r.hook_totals) - _HOOKS} more" if len(r.hook_totals) > _HOOKS else ""
    return (
        f"- **Hooked workspace allocators** returned {format_gib(returned)} in {calls:,} outermost "
        f"calls; by function (a nested call counts under each function it ran in): {each}{more}."
    )


def _kv_line(run) -> str | None:
    r = run.worst
    lm = r.landmarks
    parts = []
    if lm.before_kv_bytes is not None:
        parts.append(f"Memory in use before KV sizing: {format_gib(lm.before_kv_bytes)}.")
    e = r.extensible
    if e is not None and r.vmm is not None:
        parts.append(
            f"KV cache: {format_gib(r.vmm.kv_cache_bytes)} ({count_of(e.num_blocks, 'block')}) committed through CUDA's VMM "
            "API after warm-up, outside PyTorch's allocator (vLLM's extensible KV cache)."
        )
    elif lm.vllm_available_kv_bytes is not None:
        parts.append(f"vLLM's available KV cache: {format_gib(lm.vllm_available_kv_bytes)}.")
    if lm.post_kv_transient_bytes is not None:
        where = f" in `{lm.post_kv_peak.phase}`" if lm.post_kv_peak and lm.post_kv_peak.phase else ""
        parts.append(f"Transient after the KV cache was allocated: {format_gib(lm.post_kv_transient_bytes)}{where}.")
    return "- **KV cache:** " + " ".join(parts) if parts else None


def answer(run) -> list[str]:
    """The first screen: the verdict in bold, then what a maintainer asks next (see the module docstring)."""
    lines = [f"**{verdict_text.headline(run)}**"]
    if run.verdict == NOTHING:  # a CPU worker's serving window still holds its scheduler steps
        window = _window_lines(run)
        return lines + ([""] + window if window else [])
    lines.append("")
    if run.multi:
        r = run.worst
        lines += [f"Figures of {r.label}, the worst of {len(run.ranks)} ranks ({r.verdict}); every rank is in the report below.", ""]  # fmt: skip
    lines.append(_peak_line(run))
    lines.append(_target_line(run))
    lines += [x for x in (_holders_line(run), _before_line(run), _hooks_line(run), _kv_line(run)) if x]
    return lines + _window_lines(run)


def _window_lines(run) -> list[str]:
    """The worst rank's serving window (``serving_text.window_lines``) as the first screen's bullets."""
    out = []
    for line in window_lines(run.worst.window, run.origin.t0_us):
        head, _, rest = line.partition(": ")
        out.append(f"- **{head}:** {rest}")
    return out


def _before_line(run) -> str | None:
    """The memory present before the worst rank's recording began, when there was any (a trace that begins
    mid-run: a wrapped history, a snapshot's last entries, allocations before the plugin started recording)."""
    b = run.worst.before_recording
    if b is None or not b.nonzero:
        return None
    return f"- **{BEFORE_RECORDING.label.capitalize()}:** {before_recording_figures(b)}."


def _details(summary: str, body: list[str]) -> list[str]:
    """A folded block GitHub renders (blank lines around the Markdown inside; ``markdown="1"`` lets Python's
    ``markdown`` md_in_html render it too)."""
    return ['<details markdown="1">', f"<summary>{summary}</summary>", "", *body, "", "</details>", ""]


def _environment(run) -> list[str]:
    r = run.worst
    env = environment(r.trace)
    out = ["## Environment", ""]
    if env:
        out += ["| | |", "| --- | --- |"]
        out += [f"| {k} | {v.replace('|', '/')} |" for k, v in env]
    else:
        out += ["_The trace recorded no environment (GPU, driver, CUDA, torch versions): please add them._"]
    cmd = command_line(r.trace)
    if cmd:
        out += ["", "Command:", "", "```", cmd, "```"]
    out.append("")
    settings = allocator_settings(r.trace)
    if settings:
        rows = ["| setting | value |", "| --- | --- |"]
        rows += [f"| {k} | {v.replace('|', '/') if v else '(set)'} |" for k, v in sorted(settings.items())]
        out += _details(f"PyTorch caching allocator settings ({len(settings)})", rows)
    return out


def _report(run) -> list[str]:
    from memtrace.plots.report import render as render_report

    buf = io.StringIO()
    render_report(run, buf, markdown=True)
    r = run.worst
    what = [f"{len(r.phases)} phase" + ("s" if len(r.phases) != 1 else "")] if r.phases else []
    what += ["the peak", "the target"] if run.verdict != NOTHING else []
    what += ["top holders"] if r.holders else []
    what += [f"{len(r.trace.hook_calls):,} hook calls"] if r.trace.hook_calls else []
    ranks = f" of {len(run.ranks)} ranks" if run.multi else ""
    return _details(f"The whole report{ranks}: {', '.join(what + ['definitions'])}", [buf.getvalue().rstrip()])


def render_issue(run, drawn: bool = True) -> str:
    """The issue text (GitHub-flavoured Markdown) of ``run``; ``drawn``: the images were written beside it."""
    from memtrace.plots.whatif_text import boot_section

    r = run.worst
    out = [f"## {timeline_title(run)}", ""]
    out += answer(run)
    out += ["", f"_Times: {run.origin.sentence}. {_made_by(run)}._", ""]
    if drawn:
        out += [f"![{what_ran(run)}](timeline.png)", ""]
    else:
        out += ["_No picture: no allocator event was recorded to draw._", ""]
    out += _environment(run)
    # a serving OOM where the device ran out answers the serving question; else fits --suggest on the recorded card
    out += room_section(r) or boot_section(run)
    if drawn and not knows_holders(r.trace):  # sizes without addresses: nothing to draw a flame graph of
        out += [f"_No flame graph: {r.trace.label}'s file cannot tell who held what (sizes without addresses)._", ""]
    elif drawn:
        peak_of = f" ({r.label}, the worst rank)" if run.multi else ""
        peak = headline_words(r.headline, r.trace.process)
        moment = "the OOM, in the serving window" if flame_at(run) == "oom" else peak
        out += [f"## What held memory at {moment}{peak_of}", "", f"![flame graph at {moment}](flame.svg)", ""]
        out += ["Folded stacks for speedscope / flamegraph.pl: `flame.folded`.", ""]
    out += _report(run)
    return "\n".join(out).rstrip() + "\n"


def _made_by(run) -> str:
    """Who recorded the run: memtrace, or (an imported torch snapshot or profiler trace) not memtrace, which read it."""
    from memtrace import facts as F

    if any(F.IMPORT in t.facts for t in run.traces):
        return "Read by memtrace; recorded by PyTorch (see Environment), not by memtrace"
    return "Recorded with memtrace"


def flame_at(run) -> str:
    """The moment the bundle's flame graph shows: the OOM when the worst rank died in its serving window (what
    filled the GPU before it), else the peak."""
    ws = run.worst.window
    return "oom" if ws is not None and ws.oom is not None else "peak"


def render(run, out: str | Path) -> list[str]:
    """Write the bundle of ``run`` into the existing directory ``out``, each file atomically; return the names
    of the files written (no images for a run that recorded no allocator event)."""
    from memtrace.outputs import atomic_write
    from memtrace.plots import flame_svg, folded, timeline

    out = Path(out)
    drawn = run.with_events()
    written = []
    if drawn:
        with atomic_write(out / "timeline.png") as tmp:
            timeline.render(run.subset(drawn), tmp)
        written.append("timeline.png")
    if drawn and knows_holders(run.worst.trace):
        with atomic_write(out / "flame.svg") as tmp:
            flame_svg.render(run, tmp, at=flame_at(run))
        with atomic_write(out / "flame.folded") as tmp:
            folded.render(run, tmp, at=flame_at(run))
        written += [f for f in IMAGES if f != "timeline.png"]
    with atomic_write(out / "issue.md") as tmp:
        tmp.write_text(render_issue(run, drawn=bool(drawn)), encoding="utf-8")
    return ["issue.md", *written]
