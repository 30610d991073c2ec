"""The text and markdown renderer of one analysed rank: what ``memtrace report`` prints.

Reads analysis results only (``memtrace.analysis.analysed.rank.AnalysedRank``'s figures). Sizes print in GiB with two
decimals (a figure too small for them in its own unit: ``memtrace.units``) and times in seconds since the
start of the recording; the exact integers are in ``memtrace report --json``.
"""

from __future__ import annotations

import re
import textwrap
from typing import TYPE_CHECKING, TextIO

from memtrace import facts as F
from memtrace.analysis.holders.flame import hook_short_name
from memtrace.analysis.holders.frames import DIRS_RECORDED
from memtrace.analysis.holders.moment import headline_words
from memtrace.analysis.memory.crossing import Excursion
from memtrace.analysis.memory.quantities import (
    ALLOCATED,
    BEFORE_RECORDING,
    DEVICE_USED,
    HELD,
    OTHERS,
    QUANTITIES,
    RESERVED,
    holds_reserved,
)
from memtrace.analysis.memory.target import describe
from memtrace.plots import cost_text, oom_text
from memtrace.plots.extensible_text import render_counters, render_extensible, render_vmm
from memtrace.plots.frame_words import frame_text
from memtrace.plots.kv_text import render_non_kv
from memtrace.plots.metadata_text import render_metadata
from memtrace.plots.non_torch_text import render_non_torch
from memtrace.plots.serving_text import render_window
from memtrace.units import gib_number, gib_or_dash, signed_gib_number, size_column

if TYPE_CHECKING:
    from memtrace.analysis.analysed.rank import AnalysedRank

_TIMES = "Times are seconds since the run's time origin (the 'times' line: one origin for every rank and output)."


def definitions(shown=QUANTITIES, memories=()) -> str:
    """Each quantity ``shown``'s label and one-line meaning, then each kind of memory in ``memories`` ((name,
    meaning) pairs: ``quantities.memory_meanings``), from the one vocabulary (``analysis.quantities``)."""
    return " ".join([*(f"{q.label} = {q.meaning}." for q in shown), *(f"{n} = {m}." for n, m in memories), _TIMES])


_CURVE_NAMES = {"reserved": "reserved", "device_used": "device used", "allocated": "allocated"}


def holder_text(h) -> str:
    """What a top-holder line (``summary.HolderLine``) is called: its frame, or the memory present before
    recording began (``quantities.BEFORE_RECORDING``'s label), or no stack."""
    if h.before_recording:
        return f"({BEFORE_RECORDING.label})"
    return frame_text(h.frame)


def before_recording_figures(b) -> str:
    """The figures of the memory present before recording began (``quantities.BeforeRecording``), in the words
    every output uses: "at least" before a lower bound's figures, then how they are known."""
    return (
        f"{RESERVED.label} {b.bound}{gib_or_dash(b.reserved_bytes)}, "
        f"{ALLOCATED.label} {b.bound}{gib_or_dash(b.allocated_bytes)} ({b.how})"
    )


def before_recording_text(b) -> str:
    """:func:`before_recording_figures` after ``quantities.BEFORE_RECORDING``'s label: the report's line."""
    return f"{BEFORE_RECORDING.label}: {before_recording_figures(b)}"


#: A number and its unit ("11.39 GiB", "+0.36 GiB", "7.05 s", "54.6 %"): never broken across lines.
_FIGURE = re.compile(r"(\d) (GiB|MiB|KiB|B|s|ms|us|%)(?![\w])")
_NBSP = "\u00a0"


def wrap(text: str, width: int) -> list[str]:
    """``text`` cut into lines of at most ``width`` at spaces, never between a number and its unit."""
    glued = _FIGURE.sub(lambda m: m.group(1) + _NBSP + m.group(2), text)
    return [line.replace(_NBSP, " ") for line in textwrap.wrap(glued, width, break_on_hyphens=False)] or [""]


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def _cut_left(text: str, width: int) -> str:
    """Cut from the left, keeping the end (a frame's function name matters most)."""
    return text if len(text) <= width else "…" + text[len(text) - width + 1 :]


class _Out:
    def __init__(self, file: TextIO, width: int, markdown: bool):
        self.file, self.width, self.md = file, width, markdown

    def line(self, text: str = "") -> None:
        self.file.write(text + "\n")

    def heading(self, text: str, level: int = 2) -> None:
        if self.md:
            self.line(f"\n{'#' * level} {text}\n")
        else:
            self.line()
            self.line(text)
            self.line("-" * min(len(text), self.width))

    def item(self, text: str) -> None:
        if self.md:
            self.line(f"- {text}")
            return
        for i, part in enumerate(wrap(text, self.width - 4)):
            self.line(("  " if i == 0 else "    ") + part)

    def table(self, header: list[str], rows: list[list[str]], align: str, groups: list[tuple[str, int]] = ()) -> None:
        """A table; ``align`` holds one "l" or "r" per column; a last text column is cut to the width.

        ``groups`` labels runs of columns over the header in text mode: (label, how many columns).
        """
        if self.md:
            names = header
            if groups:
                names, col = [], 0
                for label, span in groups:
                    names += [f"{label} {h}".strip() for h in header[col : col + span]]
                    col += span
            self.line()  # a table right after a list item would be read as part of it
            self.line("| " + " | ".join(names) + " |")
            self.line("|" + "|".join("---" if a == "l" else "---:" for a in align) + "|")
            for r in rows:
                self.line("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |")
            self.line()
            return
        widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]
        used = 2 + sum(widths[:-1]) + 2 * (len(widths) - 1)
        if align[-1] == "l":  # text may be cut to the width; numbers never are
            widths[-1] = max(min(widths[-1], self.width - used), 8)
        if groups:
            cells, col = [], 0
            for label, span in groups:
                w = sum(widths[col : col + span]) + 2 * (span - 1)
                cells.append(_cut(label, w).center(w) if label else " " * w)
                col += span
            self.line(("  " + "  ".join(cells)).rstrip())
        for r in [header, *rows]:
            cells = []
            for c, w, a in zip(r, widths, align, strict=True):
                c = _cut(c, w) if a == "r" else _cut_left(c, w)
                cells.append(c.ljust(w) if a == "l" else c.rjust(w))
            self.line(("  " + "  ".join(cells)).rstrip())


def _seconds(s: AnalysedRank, t_us: int) -> str:
    return f"{(t_us - s.origin.t0_us) / 1e6:.2f} s"


def _header(out: _Out, s: AnalysedRank) -> None:
    p = s.trace.process
    imported = p.role == "import" and not p.pid
    who = ["torch snapshot"] if imported else [s.label]
    if p.rank is not None:
        who.append(s.label if imported else f"pid {p.pid}")
    if p.hostname:
        who.append(f"host {p.hostname}")
    if p.device_index is not None:
        who.append(f"cuda:{p.device_index}")
    if out.md:
        out.line(f"## memtrace report: {', '.join(who)}\n")
    else:
        out.line(_cut(f"memtrace report: {', '.join(who)}", out.width))
    if s.oom is not None:  # the first thing to know about a run
        out.item(("**" if out.md else "") + _oom_text(s) + ("**" if out.md else ""))
    env = s.trace.facts.get(F.ENV) or {}
    dev = [str(env["gpu_name"])] if env.get("gpu_name") else []
    if env.get("compute_capability"):
        dev.append(f"sm {env['compute_capability']}")
    if p.device_total_bytes:
        dev.append(f"{gib_or_dash(p.device_total_bytes)} total")
    versions = [f"{k} {env[k]}" for k in ("driver", "cuda", "torch", "vllm", "flashinfer") if env.get(k)]
    if dev:
        out.item("device: " + ", ".join(dev))
    if versions:
        out.item("versions: " + ", ".join(versions))
    if s.allocator:
        shown = ", ".join(f"{k}:{v}" if v else f"{k} unset" for k, v in sorted(s.allocator.items()))
        out.item(f"allocator settings: {shown}")
    dur = (s.span[1] - s.span[0]) / 1e6
    rec = s.trace.recording
    ended = f", ended: {rec.end_reason}" if rec.end_reason else ""
    if not rec.end_reason and rec.source == "memtrace":
        ended = (
            ", not closed: still recording, or the process was killed before memtrace closed the trace"
            " (what was drained before is in it)"
        )
    w = s.window.window if s.window is not None else None
    parts = ""
    if w is not None and w.end_us is not None and s.span[1] >= w.end_us:  # one run in time (``serving.joined``)
        gap = f"after a gap of {w.gap_us / 1e6:.2f} s, not recorded" if w.gap_us else "with no gap"
        parts = f": start-up, then the serving window {gap}"
    out.item(
        f"recording: {s.n_events:,} allocator events, {s.n_samples:,} NVML samples over {dur:.2f} s{parts} "
        f"(source {rec.source}, stacks {rec.stacks}{ended})"
    )
    if s.before_recording is not None and s.before_recording.nonzero:
        out.item(before_recording_text(s.before_recording))
    _cost(out, s)
    if s.origin.sentence:
        out.item(f"times: {s.origin.sentence}")
    if s.trace.path:  # Markdown goes upstream: the file's name only, never a local path
        out.item(f"file: {s.trace.path.rsplit('/', 1)[-1] if out.md else s.trace.path}")


def _cost(out: _Out, s: AnalysedRank) -> None:
    vllm = s.trace.process.role == "vllm-worker"
    line = cost_text.headline(s.self_cost, vllm)
    if line:
        out.item(f"{line}; {cost_text.sources(s.self_cost)}" if s.self_cost.recorded else line)


def _oom_text(s: AnalysedRank) -> str:
    """The OOM the run died of, in one sentence: when, where, the failed request, the free memory."""
    o = s.oom
    return (
        f"DIED: CUDA out of memory at {_seconds(s, o.time_us)} {oom_text.where(o)}: "
        f"{oom_text.details(o, s.trace.process.device_total_bytes)}. Nothing after it was recorded."
    )


def _phases(out: _Out, s: AnalysedRank) -> None:
    if not s.phases:
        return
    out.heading("Phases")
    name_w = 30
    full = out.md
    reserved = holds_reserved(s.trace.process)  # the CPU's trace has allocated alone: no reserved columns
    col = size_column(b for p in s.phases for b in _phase_sizes(p))  # one unit, the header's, in every cell
    rows = []
    for p in s.phases:
        if out.md:  # GitHub strips leading spaces in a cell: a visible marker nests the phase
            indent = "&nbsp;&nbsp;&nbsp;&nbsp;" * max(p.depth - 1, 0) + "↳ " if p.depth else ""
        else:
            indent = "  " * p.depth
        name = indent + p.name + ("" if p.ended else " (open)")
        name = name if out.md else _cut(name, name_w)
        times = [f"{(p.start_us - s.origin.t0_us) / 1e6:.2f}", f"{(p.end_us - s.origin.t0_us) / 1e6:.2f}"]
        alloc = [
            col.cell(p.end_allocated_bytes),
            col.cell(p.peak_allocated_bytes),
            col.cell(p.delta_allocated_bytes, signed=True),
        ]
        res = [
            col.cell(p.end_reserved_bytes),
            col.cell(p.peak_reserved_bytes),
            col.cell(p.delta_reserved_bytes, signed=True),
        ]
        if full:
            alloc.insert(0, col.cell(p.start_allocated_bytes))
            res.insert(0, col.cell(p.start_reserved_bytes))
        rows.append([name, *times, *alloc, *(res if reserved else []), col.cell(p.peak_device_used_bytes)])
    cols = ["start", "end", "peak", "Δ"] if full else ["end", "peak", "Δ"]
    header = ["phase", "start", "end", *cols, *(cols if reserved else []), "peak"]
    groups = [("", 1), ("seconds", 2), (f"allocated {col.unit}", len(cols))]
    groups += [(f"reserved {col.unit}", len(cols)), ("NVML", 1)] if reserved else [("NVML", 1)]
    out.table(header, rows, "l" + "r" * (len(header) - 1), groups)
    if not out.md:
        out.line("  (start = end - Δ; NVML peak is device used, '-' where not sampled)")


def _phase_sizes(p) -> tuple:
    """A phase row's sizes (the phases table picks its unit from them all)."""
    return (p.start_allocated_bytes, p.end_allocated_bytes, p.peak_allocated_bytes, p.delta_allocated_bytes,
            p.start_reserved_bytes, p.end_reserved_bytes, p.peak_reserved_bytes, p.delta_reserved_bytes,
            p.peak_device_used_bytes)  # fmt: skip


def _peak(out: _Out, s: AnalysedRank) -> None:
    out.heading("Peak")
    pk, least = s.peak, s.peak_bound.words
    where = f" in {pk.phase_path}" if pk.phase_path else ""
    extra = f"; non-torch {gib_or_dash(pk.non_torch_bytes)}" if pk.non_torch_bytes is not None else ""
    h = s.headline
    if h is not None and h.quantity == HELD.key:  # the run's headline (``AnalysedRank.headline``) leads
        hp = h.point
        out.item(
            f"{HELD.label} {least}{gib_or_dash(hp.bytes)} at {_seconds(s, hp.time_us)}"
            + (f" in {hp.phase_path}" if hp.phase_path else "")
            + f" ({HELD.meaning}): the peak"
        )
    if holds_reserved(s.trace.process):  # the CPU's trace has allocated alone: its line below is the peak
        out.item(
            f"reserved {least}{gib_or_dash(pk.reserved_bytes)} at {_seconds(s, pk.time_us)}{where} "
            f"(allocated {gib_or_dash(pk.allocated_bytes)} at its fullest{extra})"
        )
    pa = s.peak_allocated
    out.item(
        f"allocated peak {least}{gib_or_dash(pa.bytes)} at {_seconds(s, pa.time_us)}"
        + (f" in {pa.phase_path}" if pa.phase_path else "")
    )
    if s.peak_bound.lower_bound:
        out.item(f"a lower bound: this trace is {s.peak_bound.why}")
    if s.peak_device_used is not None:
        pd = s.peak_device_used
        out.item(
            f"device used peak {gib_or_dash(pd.bytes)} at {_seconds(s, pd.time_us)}"
            + (f" in {pd.phase_path}" if pd.phase_path else "")
            + " (NVML samples, this process)"
        )
    if s.peak_others is not None and s.peak_others.bytes > 0:
        po = s.peak_others
        how = "NVML's per-process list"
        d = s.window.device if s.window is not None else None
        if (
            d is not None
            and d.derived
            and s.window.window.start_us is not None
            and po.time_us >= s.window.window.start_us
        ):
            how = "in the serving window derived: the device's used memory less this process's†"
        out.item(
            f"{OTHERS.label} on this GPU held up to {gib_or_dash(po.bytes)} (at {_seconds(s, po.time_us)}; {how}): "
            "not this process's memory, left out of device used and non-torch"
        )


def _crossing_text(s: AnalysedRank, c: Excursion) -> str:
    where = f" in {c.phase_path}" if c.phase_path else ""
    if c.until == "oom":
        stay = f"until the OOM ({c.duration_us / 1e6:.3f} s)"
    else:
        stay = "until the recording ended" if c.until == "end" else f"for {c.duration_us / 1e6:.3f} s"
    more = ""
    if c.excursions > 1:  # the highest is of all of them; where the reading stopped, the last one's state
        end = "the OOM" if c.until == "oom" or s.oom is not None else "the recording's end"
        more = f"; {c.excursions} excursions above in all, {'above' if c.ended_above else 'below'} it at {end}"
    return (
        f"{_CURVE_NAMES.get(c.curve, c.curve)} crossed it at {_seconds(s, c.time_us)}{where}, "
        f"stayed above {stay}{more}; highest {gib_or_dash(c.max_bytes)} (+{gib_or_dash(c.overshoot_bytes)} over) "
        f"at {_seconds(s, c.max_us)}" + (f" in {c.max_phase_path}" if c.max_phase_path else "")
    )


def _below(out: _Out, s: AnalysedRank) -> None:
    """How far below the target each peak stayed, named from the one vocabulary; on a card other processes
    shared, how full the card itself was too (their memory is not this process's, and not under its target)."""
    if s.peak_held is not None:  # the KV cache outside PyTorch counts: "reserved" alone would look empty
        head = s.target.target_bytes - s.peak_held.bytes
        out.item(f"never crossed: the peak {HELD.label} ({HELD.meaning}) stays {gib_or_dash(head)} below it")
    else:
        head = s.target.target_bytes - s.peak.reserved_bytes
        out.item(f"never crossed: the {RESERVED.label} peak stays {gib_or_dash(head)} below it")
    if s.peak_device_used is not None:
        out.item(
            f"the peak {DEVICE_USED.label} stays {gib_or_dash(s.target.target_bytes - s.peak_device_used.bytes)} below it"
        )
    if s.peak_others is not None and s.whole_device_peak_bytes is not None:
        room = s.target.target_bytes - s.whole_device_peak_bytes
        where = f"{gib_or_dash(room)} below it" if room >= 0 else f"{gib_or_dash(-room)} above it"
        out.item(
            f"with {OTHERS.label}' memory (up to {gib_or_dash(s.peak_others.bytes)}) the card itself held up to "
            f"{gib_or_dash(s.whole_device_peak_bytes)}, {where}"
        )


def _target(out: _Out, s: AnalysedRank) -> None:
    if s.target.target_bytes is None:
        return
    out.heading(f"Target {gib_or_dash(s.target.target_bytes)}")
    t = s.target
    card = f"; card {gib_or_dash(t.capacity_bytes)} ({t.capacity_source})" if t.capacity_bytes else ""
    out.item(f"from: {describe(s.target)}{card}")
    if not s.crossing_list:
        _below(out, s)
    for c in s.crossing_list:
        out.item(_crossing_text(s, c))


def _holders(out: _Out, s: AnalysedRank) -> None:
    if not s.holders:
        return
    # the state shown is the run's headline peak (``AnalysedRank.headline``), the moment the flame graph shows too
    h = s.headline
    at = f"{headline_words(h, s.trace.process)} ({_seconds(s, h.state_us)})"
    if h.quantity == HELD.key:  # PyTorch's blocks and the KV cache's chunks outside it: the state flame shows
        at = f"the peak held ({_seconds(s, h.state_us)}): PyTorch's and the KV cache outside it"
    out.heading(f"Top holders at {at}, by allocating site")
    col = size_column(h.bytes for h in s.holders)
    rows = [
        [col.cell(h.bytes), f"{h.share * 100:.1f}%", f"{h.count:,}" if h.count else "-", f"{h.stacks:,}",
         holder_text(h)]
        for h in s.holders
    ]  # fmt: skip
    out.table([col.unit, "share", "blocks", "stacks", "where (innermost frame outside torch)"], rows, "rrrrl")
    dirs = s.frame_folders
    if dirs is not None and dirs.source != DIRS_RECORDED:  # a trace from before memtrace recorded the folders
        known = f"torch's folder {', '.join(dirs.torch_dirs())}" if dirs.torch_dirs() else "torch's frames"
        out.item(f"{known} told apart by {dirs.source}: the trace does not say where its process imported torch")


def _hooks(out: _Out, s: AnalysedRank, limit: int = 20) -> None:
    if not s.trace.hook_calls:
        return
    out.heading("Hook calls (FlashInfer workspace allocators and MEMTRACE_HOOKS)")
    if len(s.trace.hook_calls) > 1:
        totals = [
            [_cut(hook_short_name(h.name), 40), f"{h.calls:,}", gib_number(h.returned_bytes), signed_gib_number(h.allocated_delta_bytes),
             f"{h.errors:,}" if h.errors else ""]
            for h in s.hook_totals
        ]  # fmt: skip
        out.table(["by function", "calls", "returned GiB", "Δ alloc GiB", "errors"], totals, "lrrrr")
        out.line("")
    rows = []
    for c in s.trace.hook_calls[:limit]:
        rows.append(
            [
                _cut(hook_short_name(c.name), 40),
                f"{(c.start_us - s.origin.t0_us) / 1e6:.2f}",
                f"{(c.end_us - c.start_us) / 1e3:.1f}",
                gib_number(c.returned_bytes),
                "-" if c.allocated_delta_bytes is None else signed_gib_number(c.allocated_delta_bytes),
                "-" if c.reserved_delta_bytes is None else signed_gib_number(c.reserved_delta_bytes),
                "error: " + c.error if c.error else "",
            ]
        )
    out.table(["function", "start s", "ms", "returned GiB", "Δ alloc GiB", "Δ res GiB", "error"], rows, "lrrrrrl")
    if len(s.trace.hook_calls) > limit:
        out.item(f"... and {len(s.trace.hook_calls) - limit:,} more calls (see --json)")


def _notes(out: _Out, s: AnalysedRank) -> None:
    if not (s.warnings or s.trace.notes):
        return
    out.heading("Warnings and notes")
    for w in s.warnings:
        out.item(f"WARNING: {w}")
    for n in s.trace.notes:
        out.item(f"{n.level}: {n.text}")


def render_report(rank: AnalysedRank, file: TextIO, width: int = 100, markdown: bool = False) -> None:
    """Write the report of one trace to ``file``.

    Args:
        rank: one rank of an analysed run (``analysis.analysed.rank.AnalysedRank``): every figure is read there.
        file: a text stream.
        width: the text width tables are cut to (text mode).
        markdown: GitHub-flavoured markdown instead of plain text (for an upstream issue).
    """
    out = _Out(file, width, markdown)
    _header(out, rank)
    if rank.warnings:
        out.item(f"WARNING: {len(rank.warnings)} warning(s) below; figures may be incomplete")
    _phases(out, rank)
    if rank.n_events or rank.oom is not None or rank.curves.baseline.reserved_bytes:  # (a snapshot's one moment)
        _peak(out, rank)
        _target(out, rank)
    else:  # the "recorded nothing" verdict: no peak, and no target kept or crossed
        out.heading("Peak")
        out.item("none: no allocator events were recorded, so there is no peak and no target was kept or crossed")
    _holders(out, rank)
    render_metadata(out, rank)
    render_non_torch(out, rank)
    _hooks(out, rank)
    render_non_kv(out, rank)
    render_vmm(out, rank)
    render_extensible(out, rank)
    render_counters(out, rank)
    render_window(out, rank.window, rank.origin.t0_us)
    _notes(out, rank)


def render_definitions(file: TextIO, width: int = 100, markdown: bool = False, shown=QUANTITIES, memories=()) -> None:
    """The "Definitions" footer: the quantities ``shown`` (``quantities.present``), the kinds of memory that need
    saying (``quantities.memory_meanings``), then how times count."""
    out = _Out(file, width, markdown)
    out.heading("Definitions")
    text = definitions(shown, memories)
    if markdown:
        out.line(text)
        return
    words, line = text.split(), "  "
    for w in words:
        if len(line) + len(w) + 1 > width:
            out.line(line.rstrip())
            line = "  "
        line += w + " "
    out.line(line.rstrip())
