"""The upstream-issue bundle of an analysed run: issue.md (environment, summary, the report), the timeline
and the flame graph at the worst rank's peak, linked beside it.

A renderer over ``analysis.run.AnalysedRun``; it computes nothing. The summary's first sentence is the
run's verdict: a run that died says so first (which rank, when, where, the failed request), then the
crossing every output names first (device used when sampled), with the target and where it came from,
then the peak and the KV figures. Local paths never reach the text: the fingerprint shortens them, and
the report is rendered without file paths.
"""

from __future__ import annotations

import io
from pathlib import Path

from ..analysis.fingerprint import command_line, environment
from ..analysis.moment import PEAK
from ..analysis.titles import timeline_title, what_ran
from ..units import format_gib
from . import oom_text
from .format_spec import Format

#: this module's output format(s) (``plots.format_spec``)
FORMATS = (Format("issue", "-issue", (), commands=("issue",)),)

FILES = ("issue.md", "timeline.png", "flame.svg", "flame.folded")
_CURVE = {"reserved": "PyTorch reserved memory", "device_used": "Device-used memory"}


def _at(rank, t_us: int) -> str:
    return f"{rank.seconds(t_us):.3f} s"


def _in(path: str) -> str:
    return f"in `{path}`" if path else "outside any phase"


def summary_paragraph(run) -> str:
    """One paragraph about the worst rank (``AnalysedRun.worst``): the verdict first, then the crossing, the
    peak, the KV figures."""
    r = run.worst
    s, lm = r.summary, r.landmarks
    who = f"{r.label} " if run.multi else ""
    parts = []
    if r.oom is not None:
        o = r.oom
        dev = f" (cuda:{o.device})" if o.device is not None and run.multi else ""
        name = r.label.capitalize() + dev if run.multi else "The process"
        parts.append(
            f"**{name} died of CUDA OOM** {_in(o.phase_path)} at {_at(r, o.time_us)} "
            f"({oom_text.details(o, s.process.device_total_bytes)})."
        )
    target = r.target.target_bytes
    c = r.first_crossing
    if target is not None:
        src = f" The target came from {s.target_source}."
        if c is not None:
            parts.append(
                f"{_CURVE.get(c.curve, c.curve)} {'of ' + who.strip() + ' ' if who else ''}first crossed the target "
                f"({format_gib(target)}) {_in(c.phase_path)} at {_at(r, c.time_us)}; its highest point above it was "
                f"{format_gib(c.max_bytes)} (+{format_gib(c.overshoot_bytes)}) at {_at(r, c.max_us)}.{src}"
            )
        else:
            parts.append(f"It stayed under the target ({format_gib(target)}).{src}")
    parts.append(
        f"Peak PyTorch reserved memory {'of ' + who.strip() + ' ' if who else ''}{format_gib(s.peak.reserved_bytes)} "
        f"{_in(s.peak.phase_path)} at {_at(r, s.peak.time_us)}."
    )
    if lm.before_kv_bytes is not None:
        parts.append(f"Memory in use before KV sizing: {format_gib(lm.before_kv_bytes)}.")
    e = r.extensible
    if e is not None and r.vmm is not None:
        parts.append(
            f"KV cache: {format_gib(r.vmm.kv_cache_bytes)} ({e.num_blocks:,} blocks) committed through CUDA's VMM "
            "API after warm-up, outside PyTorch's allocator (vLLM's extensible KV cache)."
        )
    elif lm.vllm_available_kv_bytes is not None:
        parts.append(f"vLLM's available KV cache: {format_gib(lm.vllm_available_kv_bytes)}.")
    if lm.post_kv_transient_bytes is not None:
        where = f" in `{lm.post_kv_peak.phase}`" if lm.post_kv_peak and lm.post_kv_peak.phase else ""
        parts.append(f"Transient after the KV cache was allocated: {format_gib(lm.post_kv_transient_bytes)}{where}.")
    if run.multi:
        parts.append(f"The worst of {len(run.ranks)} ranks ({r.verdict}); the others are in the report below.")
    return " ".join(parts)


def render_issue(run) -> str:
    """The issue text (GitHub-flavoured Markdown) of ``run``."""
    from .report import render as render_report
    from .whatif_text import boot_section

    r = run.worst
    title = timeline_title(run)
    out = [f"## {title}", "", "_Recorded with memtrace; the trace file is available on request._", ""]
    out += ["**Summary.** " + summary_paragraph(run), ""]
    out += [f"_Times: {run.origin.sentence}._", ""]
    env = environment(r.trace)
    out += ["## Environment", ""]
    if env:
        out += ["| | |", "| --- | --- |"]
        out += [f"| {k} | {v.replace('|', '/')} |" for k, v in env]
    else:
        out += ["_The trace recorded no environment (GPU, driver, CUDA, torch versions): please add them._"]
    cmd = command_line(r.trace)
    if cmd:
        out += ["", "Command:", "", "```", cmd, "```"]
    out += ["", "## Timeline", "", f"![{what_ran(run)}](timeline.png)", ""]
    buf = io.StringIO()
    render_report(run, buf, markdown=True)
    out += [buf.getvalue().rstrip(), ""]
    out += boot_section(run)  # fits --suggest on the recorded card (plots.whatif_text)
    peak_of = f" ({r.label}, the worst rank)" if run.multi else ""
    out += [f"## What held memory at {PEAK}{peak_of}", "", f"![flame graph at {PEAK}](flame.svg)", ""]
    out += ["Folded stacks for speedscope / flamegraph.pl: `flame.folded`.", ""]
    return "\n".join(out) + "\n"


def render(run, out: str | Path) -> None:
    """Write the bundle of ``run`` into the existing directory ``out``, each file atomically."""
    from ..outputs import atomic_write
    from .render import render as render_as

    out = Path(out)
    drawn = run.with_events()
    if drawn:
        with atomic_write(out / "timeline.png") as tmp:
            render_as(run.subset(drawn), tmp, "timeline")
        with atomic_write(out / "flame.svg") as tmp:
            render_as(run, tmp, "flame")
        with atomic_write(out / "flame.folded") as tmp:
            render_as(run, tmp, "folded")
    with atomic_write(out / "issue.md") as tmp:
        tmp.write_text(render_issue(run), encoding="utf-8")
