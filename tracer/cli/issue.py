"""Write a bundle ready to paste into an upstream issue: Markdown plus the timeline and flame images.

DIR (default: RUN's name + "-issue") receives:

  issue.md      environment fingerprint (GPU, compute capability, driver, CUDA, torch, vLLM,
                FlashInfer, the command and flags), a one-paragraph summary, the per-phase table,
                the peak, the crossing of the --gpu-memory-utilization target, the top holders at
                the peak and the FlashInfer workspace calls, with the images linked
  timeline.png  GPU memory over time by category, the target line and the first crossing
  flame.svg     what held memory at the peak (and flame.folded for speedscope / flamegraph.pl)

Attach the images to the issue (GitHub uploads them when dropped into the text box). A DIR that
already holds these files is only replaced with --force.

  memtrace issue RUN
  memtrace issue RUN -o issue/ --force
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path
from typing import Any

NAME = "issue"
ORDER = 50

FILES = ("issue.md", "timeline.png", "flame.svg", "flame.folded")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_path", metavar="RUN", help="run directory or .memtrace file")
    p.add_argument("-o", "--output", metavar="DIR", help="output directory (default: RUN's name + '-issue')")
    p.add_argument("--force", action="store_true", help="replace the files of an existing bundle")
    p.add_argument("--rank", type=int, default=None, help="the rank to describe (default: every rank)")


def _out_dir(run_path: str, output: str | None, force: bool) -> Path:
    from ..errors import UsageError

    out = Path(output) if output else Path(Path(run_path.rstrip("/")).name.removesuffix(".memtrace") + "-issue")
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out} exists and is not a directory; choose another with -o")
    clash = [f for f in FILES if (out / f).exists()]
    if clash and not force:
        raise UsageError(f"{out} already holds {', '.join(clash)}; choose another directory with -o or pass --force")
    out.mkdir(parents=True, exist_ok=True)
    return out


def run(args: argparse.Namespace) -> int:
    import sys

    from ..analysis.curves import all_curves
    from ..analysis.flame import flame_at, peak_event_index
    from ..analysis.summary import summarize
    from ..plots.flame_svg import render_flame_svg
    from ..plots.folded import render_folded
    from ..plots.timeline import render_timeline
    from ..plots.timeline_data import prepare_rank
    from ..progress import task
    from ._runs import load_with_progress, select

    out = _out_dir(args.run_path, args.output, args.force)
    traces = select(load_with_progress(args.run_path), args.rank)
    with task("Writing the issue bundle", total=3) as t:
        summaries = [summarize(tr, top=8) for tr in traces]
        t.advance()
        render_timeline([prepare_rank(tr) for tr in traces], out / "timeline.png", title=_title(traces[0]))
        t.advance()
        worst = max(range(len(traces)), key=lambda i: summaries[i].peak.reserved_bytes)
        tr, s = traces[worst], summaries[worst]
        curves = all_curves(tr)
        flame = flame_at(tr, event_index=peak_event_index(curves.allocated, curves.reserved))
        peak_s = (s.peak.time_us - s.start_us) / 1e6
        render_flame_svg(
            flame,
            out / "flame.svg",
            title=f"Live GPU memory at the peak: {peak_s:.3f} s, {s.peak.phase_path or 'outside any phase'}",
            subtitle=f"{tr.label}; reserved {_gib(s.peak.reserved_bytes)}",
        )
        render_folded(flame, out / "flame.folded")
        t.advance()
    (out / "issue.md").write_text(markdown(traces, summaries), encoding="utf-8")
    print(f"memtrace: wrote {out}/issue.md, timeline.png, flame.svg, flame.folded", file=sys.stderr)
    return 0


def _title(trace) -> str:
    env = trace.facts.get("env") or {}
    model = (trace.facts.get("vllm.config") or {}).get("model")
    gpu = env.get("gpu_name") or "GPU"
    return f"GPU memory during start-up: {model + ' on ' if model else ''}{gpu}"


def _gib(n: int | None) -> str:
    from ..units import format_gib

    return format_gib(n)


def _cmdline(env: dict[str, Any]) -> str:
    cmd = env.get("cmdline")
    if isinstance(cmd, list):
        return " ".join(str(c) for c in cmd)
    return str(cmd or "")


def environment_rows(trace) -> list[tuple[str, str]]:
    """The environment fingerprint as (label, value) rows; unknown values are left out."""
    env = trace.facts.get("env") or {}
    cfg = trace.facts.get("vllm.config") or {}
    total = env.get("total_memory_bytes") or trace.process.device_total_bytes
    rows = [
        ("GPU", env.get("gpu_name")),
        ("compute capability", env.get("compute_capability")),
        ("GPU memory", _gib(total) if total else None),
        ("driver", env.get("driver")),
        ("CUDA", env.get("cuda")),
        ("torch", env.get("torch")),
        ("vLLM", env.get("vllm") or trace.facts.get("vllm.version")),
        ("FlashInfer", env.get("flashinfer")),
        ("Python", env.get("python")),
        ("memtrace", env.get("memtrace")),
        ("--gpu-memory-utilization", trace.facts.get("gpu_memory_utilization")),
    ]
    for key in ("model", "moe_backend", "quantization", "kv_cache_dtype", "max_model_len",
                "max_num_batched_tokens", "max_num_seqs", "tensor_parallel_size", "cudagraph_mode"):  # fmt: skip
        if cfg.get(key) is not None:
            rows.append((key, cfg[key]))
    return [(k, str(v)) for k, v in rows if v not in (None, "")]


def _summary_paragraph(trace, s) -> str:
    from ..analysis.landmarks import landmarks

    lm = landmarks(trace)
    parts = [
        f"Peak PyTorch reserved memory {_gib(s.peak.reserved_bytes)} in `{s.peak.phase_path or 'outside any phase'}`"
        f" at {(s.peak.time_us - s.start_us) / 1e6:.3f} s."
    ]
    if s.target_bytes:
        if s.crossings:
            c = min(s.crossings, key=lambda c: c.time_us)
            curve = {"reserved": "PyTorch reserved", "device_used": "NVML device-used"}.get(c.curve, c.curve)
            parts.append(
                f"It crossed the target ({_gib(s.target_bytes)}) in `{c.phase_path}` ({curve} memory) by "
                f"{_gib(c.overshoot_bytes)} for {c.duration_us / 1000:.1f} ms."
            )
        else:
            parts.append(f"It stayed under the target ({_gib(s.target_bytes)}).")
    if lm.before_kv_bytes is not None:
        parts.append(f"Memory in use before KV sizing: {_gib(lm.before_kv_bytes)}.")
    if lm.vllm_available_kv_bytes is not None:
        parts.append(f"vLLM's available KV cache: {_gib(lm.vllm_available_kv_bytes)}.")
    if lm.post_kv_transient_bytes is not None:
        where = f" in `{lm.post_kv_peak.phase}`" if lm.post_kv_peak and lm.post_kv_peak.phase else ""
        parts.append(f"Transient after the KV cache was allocated: {_gib(lm.post_kv_transient_bytes)}{where}.")
    if s.oom:
        parts.append(f"**The process died of CUDA OOM** (requested {_gib(s.oom.get('requested_bytes'))}).")
    return " ".join(parts)


def markdown(traces: list, summaries: list) -> str:
    """The issue text (GitHub-flavoured Markdown)."""
    from ..plots.text import render_run

    first = traces[0]
    out = [f"## {_title(first)}", "", "_Recorded with memtrace; the trace file is available on request._", ""]
    out += [
        "**Summary.** " + " ".join(_summary_paragraph(t, s) for t, s in zip(traces[:1], summaries[:1], strict=True)),
        "",
    ]
    out += ["## Environment", "", "| | |", "| --- | --- |"]
    out += [f"| {k} | {v.replace('|', '/')} |" for k, v in environment_rows(first)]
    cmd = _cmdline(first.facts.get("env") or {})
    if cmd:
        out += ["", "Command:", "", "```", cmd, "```"]
    out += ["", "## Timeline", "", "![GPU memory during start-up](timeline.png)", ""]
    buf = io.StringIO()
    render_run(summaries, buf, markdown=True)
    out += [buf.getvalue().rstrip(), ""]
    out += ["## What held memory at the peak", "", "![flame graph at the peak](flame.svg)", ""]
    out += ["Folded stacks for speedscope / flamegraph.pl: `flame.folded`.", ""]
    return "\n".join(out) + "\n"
