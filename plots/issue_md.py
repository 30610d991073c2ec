"""The Markdown of an upstream-issue bundle: environment, summary, the report, images linked beside it.

A renderer over analysis results (``Summary``, ``Landmarks``, ``Oom``, the fingerprint rows); it
computes nothing. Local paths never reach the text: the fingerprint shortens them, and the report is
rendered without file paths.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

from ..analysis.landmarks import Landmarks
from ..analysis.oom import Oom
from ..units import format_gib
from . import oom_text


@dataclass(frozen=True)
class IssueRank:
    """What the bundle says about one process."""

    summary: object  # analysis.summary.Summary
    landmarks: Landmarks
    oom: Oom | None


def summary_paragraph(r: IssueRank) -> str:
    """One paragraph: the peak, the crossing, the KV figures, the OOM."""
    s, lm = r.summary, r.landmarks
    parts = [
        f"Peak PyTorch reserved memory {format_gib(s.peak.reserved_bytes)} in "
        f"`{s.peak.phase_path or 'outside any phase'}` at {(s.peak.time_us - s.start_us) / 1e6:.3f} s."
    ]
    target = s.target_bytes
    if target:
        if s.crossings:
            c = min(s.crossings, key=lambda c: (c.time_us, c.curve != "device_used"))
            curve = {"reserved": "PyTorch reserved", "device_used": "device-used"}.get(c.curve, c.curve)
            parts.append(
                f"{curve.capitalize()} memory first crossed the target ({format_gib(target)}) in "
                f"`{c.phase_path or 'outside any phase'}` at {(c.time_us - s.start_us) / 1e6:.3f} s; its highest "
                f"point above it was {format_gib(c.max_bytes)} (+{format_gib(c.overshoot_bytes)}) at "
                f"{(c.max_us - s.start_us) / 1e6:.3f} s."
            )
        else:
            parts.append(f"It stayed under the target ({format_gib(target)}).")
    if lm.before_kv_bytes is not None:
        parts.append(f"Memory in use before KV sizing: {format_gib(lm.before_kv_bytes)}.")
    if lm.vllm_available_kv_bytes is not None:
        parts.append(f"vLLM's available KV cache: {format_gib(lm.vllm_available_kv_bytes)}.")
    if lm.post_kv_transient_bytes is not None:
        where = f" in `{lm.post_kv_peak.phase}`" if lm.post_kv_peak and lm.post_kv_peak.phase else ""
        parts.append(f"Transient after the KV cache was allocated: {format_gib(lm.post_kv_transient_bytes)}{where}.")
    if r.oom is not None:
        o = r.oom
        parts.append(
            f"**The process died of CUDA OOM** in `{o.phase_path or 'outside any phase'}` at "
            f"{(o.time_us - s.start_us) / 1e6:.3f} s ({oom_text.details(o, s.process.device_total_bytes)})."
        )
    return " ".join(parts)


def render_issue(
    title: str, ranks: list[IssueRank], environment: list[tuple[str, str]], command: str, report_markdown: str
) -> str:
    """The issue text (GitHub-flavoured Markdown). ``ranks[0]`` is the process the summary describes."""
    out = [f"## {title}", "", "_Recorded with memtrace; the trace file is available on request._", ""]
    out += ["**Summary.** " + summary_paragraph(ranks[0]), ""]
    out += ["## Environment", "", "| | |", "| --- | --- |"]
    out += [f"| {k} | {v.replace('|', '/')} |" for k, v in environment]
    if command:
        out += ["", "Command:", "", "```", command, "```"]
    out += ["", "## Timeline", "", "![GPU memory during start-up](timeline.png)", ""]
    out += [report_markdown.rstrip(), ""]
    out += ["## What held memory at the peak", "", "![flame graph at the peak](flame.svg)", ""]
    out += ["Folded stacks for speedscope / flamegraph.pl: `flame.folded`.", ""]
    return "\n".join(out) + "\n"


def report_markdown(summaries: list) -> str:
    """``memtrace report --markdown`` of ``summaries``, as the bundle embeds it."""
    from .text import render_run

    buf = io.StringIO()
    render_run(summaries, buf, markdown=True)
    return buf.getvalue()
