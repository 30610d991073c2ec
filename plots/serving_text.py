"""The serving-window section of ``memtrace report`` (``analysis.serving.WindowSummary``).

What filled the GPU before the window was written: the gap after start-up, what the rings kept and
dropped (and their bound), PyTorch's state at the window's start and end, the OOM (worded by :mod:`.oom_text`,
with its bytes so that they can be checked against torch's own message), what held the device at it and how
each holder changed since start-up ended (``analysis.serving_held``: this process's parts, other processes, the
device's free memory, in torch's units), the growth by allocation site and the scheduler steps before the end.
"""

from __future__ import annotations

from memtrace.analysis.memory import quantities as Q
from memtrace.analysis.serving.serving import WindowSummary
from memtrace.analysis.serving.serving_held import DeviceAtEnd, Holders
from memtrace.plots import cost_text, oom_text
from memtrace.plots.frame_words import frame_text
from memtrace.units import count_of, format_size, gib_or_dash, signed_size, size_column, thousands


def _s(us: int | None) -> str:
    return "-" if us is None else f"{us / 1e6:.2f} s"


def _mib(b: int | None) -> str:
    return "-" if b is None else f"{b / (1 << 20):.1f} MiB"


def render_window(out, ws: WindowSummary | None, t0_us: int) -> None:
    """Write the section (nothing for a trace without a serving window)."""
    if ws is None:
        return
    w = ws.window
    out.heading("Serving window")
    rel = lambda t: "-" if t is None else f"{(t - t0_us) / 1e6:.2f} s"  # noqa: E731
    out.item(
        f"start-up ended at {rel(w.startup_end_us)}; the window covers {rel(w.start_us)} to {rel(w.end_us)} "
        f"(last written on {w.reason or '?'}, write {w.writes})"
    )
    if w.gap_us:
        out.item(
            f"GAP of {_s(w.gap_us)} after start-up: recorded, then dropped from the ring ({count_of(w.events_dropped, 'allocator event')}, "
            f"{count_of(w.samples_dropped, 'NVML sample')}, {count_of(w.steps_dropped, 'scheduler step')}); "
            "memory in the gap is unknown, not constant"
        )
    else:
        out.item("no gap: the window starts where start-up ended (nothing was dropped from the ring)")
    out.item(
        f"kept {count_of(w.events_kept, 'allocator event')}, {count_of(w.samples_kept, 'NVML sample')}, "
        f"{count_of(w.steps_kept, 'scheduler step')}; " + bound_words(w.bounds or {})
    )
    if ws.cost is not None:
        out.item(cost_text.serving(ws.cost))
    if ws.start_allocated_bytes is None:
        out.item("no allocator on this device: the window holds scheduler steps and notes only")
    else:
        exact = "exact" if ws.start_exact else "a lower bound"
        out.item(
            f"at the window's start ({exact}): {Q.ALLOCATED} {gib_or_dash(ws.start_allocated_bytes)}, "
            f"{Q.RESERVED} {gib_or_dash(ws.start_reserved_bytes)}; at its end: {Q.ALLOCATED} "
            f"{gib_or_dash(ws.end_allocated_bytes)}, {Q.RESERVED} {gib_or_dash(ws.end_reserved_bytes)}, "
            f"{Q.RESERVED_UNUSED} {_size(ws.reserved_unused_bytes)}"
        )
    if ws.oom is not None:
        out.item(f"DIED: CUDA out of memory at {rel(ws.oom.time_us)} {oom_words(ws)}")
    if ws.device is not None:
        render_device(out, ws, rel)
    if ws.growth:
        out.line()
        col = size_column(g.bytes for g in ws.growth)
        out.table(
            ["allocated in the window, live at its end", col.unit, "blocks"],
            [[frame_text(g.frame), col.cell(g.bytes), f"{g.count:,}"] for g in ws.growth],
            "lrr",
        )
    if ws.steps_before_end or ws.steps_in_progress:
        out.line()
        rows = [
            [rel(st.get("time_us")), str(st.get("requests", "-")), str(st.get("tokens", "-")),
             f"{st.get('duration_us', 0) / 1e3:.1f}", st.get("error", "")]
            for st in ws.steps_before_end
        ]  # fmt: skip
        rows += [
            [rel(st.get("time_us")), str(st.get("requests", "-")), str(st.get("tokens", "-")), "-", "in progress"]
            for st in ws.steps_in_progress or []
        ]  # fmt: skip
        out.table(["scheduler step at", "requests", "tokens", "ms", "error"], rows, "rrrrl")
    said = step_words(ws, rel)
    if said:
        out.item(said)


def bound_words(b: dict) -> str:
    """The rings' bounds and the memory they may hold: the events in PyTorch's own ring (held,
    ``capture.serving.held``: PyTorch's memory, bounded by its entries) or in memtrace's."""
    limits = f"{thousands(b.get('max_events'))} events / {b.get('max_age_s')} s / {thousands(b.get('max_steps'))} steps"
    if b.get("events_in") == "torch":
        return (
            f"ring bound {limits}; the events held in PyTorch's own history ring (at most {thousands(b.get('max_events'))} "
            f"entries of PyTorch's memory, converted only when written), the rest at most "
            f"{_mib(b.get('ring_bytes_max'))} held by memtrace"
        )
    return f"ring bound {limits}, at most {_mib(b.get('ring_bytes_max'))} held by memtrace"


def _size(n: int | None) -> str:
    return "-" if n is None else format_size(n)


#: The rows of what held the device: (quantity, its bytes in a ``Holders``); this process's parts first.
HOLDER_ROWS = (
    (Q.ALLOCATED_BLOCKS, lambda h: h.allocator and h.allocator.blocks_bytes),
    (Q.PRIVATE_POOL_CACHED, lambda h: h.allocator and h.allocator.private_cached_bytes),
    (Q.RESERVED_UNUSED, lambda h: h.allocator and h.allocator.reserved_unused_bytes),
    (Q.VMM, lambda h: h.vmm_bytes),
    (Q.NON_TORCH, lambda h: h.non_torch_bytes),
    (Q.DEVICE_USED, lambda h: h.this_process_bytes),
    (Q.OTHERS, lambda h: h.others_bytes),
    (Q.DEVICE_FREE, lambda h: h.free_bytes),
)
#: the rows a window that did not sample other processes knows only by ``serving_held.DERIVED``
_DERIVED_ROWS = (Q.NON_TORCH, Q.DEVICE_USED, Q.OTHERS)


def _at(d: DeviceAtEnd) -> str:
    return "the OOM" if d.at_oom else "the window's end"


def _mark(d: DeviceAtEnd, q) -> str:
    """The mark (†) after a figure known only by ``serving_held.DERIVED``."""
    return "†" if d.derived and q in _DERIVED_ROWS else ""


def render_device(out, ws: WindowSummary, rel) -> None:
    """The table of what held the device at the window's end (its OOM) and at start-up's end, with the change."""
    d = ws.device
    rows = []
    for q, of in HOLDER_ROWS:
        change = d.change(of)
        change_text = "-" if change is None else signed_size(change) + _mark(d, q)
        rows.append([q.label, _size(of(d.end)) + _mark(d, q), _size(of(d.startup_end)), change_text])
    out.line()
    out.item(
        f"what held the device ({gib_or_dash(ws.device_total_bytes)}) at {_at(d)} ({rel(d.end.time_us)}) and when "
        f"start-up ended ({rel(d.startup_end.time_us)}):"
    )
    out.table(["", f"at {_at(d)}", "start-up's end", "change"], rows, "lrrr")
    for head, text in device_sentences(ws, rel):
        out.item(f"{head}: {text}")


def device_sentences(ws: WindowSummary, rel) -> list[tuple[str, str]]:
    """What the holders' changes say, as (head, text): who took the memory that was free when start-up ended,
    whether the request was within the allocator's limit, and how other processes' memory is known when it was
    not sampled (``serving_held.DERIVED``)."""
    d = ws.device
    end, start = d.end, d.startup_end
    out = []
    others, this = d.change(lambda h: h.others_bytes), d.change(Holders.this_process_bytes.fget)
    if others is not None and this is not None and start.free_bytes is not None and end.free_bytes is not None:
        out.append((
            f"Since start-up ended ({rel(start.time_us)})",
            f"{Q.OTHERS} {signed_size(others)}{_mark(d, Q.OTHERS)}, {Q.DEVICE_USED} {signed_size(this)}"
            f"{_mark(d, Q.DEVICE_USED)}, of the {format_size(start.free_bytes)} that was free; "
            f"{format_size(end.free_bytes)} was left at {_at(d)}",
        ))  # fmt: skip
    if d.within_limit is not None and end.allocator is not None:
        within = "were within" if d.within_limit else "were over"
        out.append((
            "Within the allocator limit" if d.within_limit else "Over the allocator limit",
            f"{Q.RESERVED} {format_size(end.allocator.reserved_bytes)} and the request "
            f"{format_size(ws.oom.requested_bytes)} {within} {format_size(d.limit_bytes)}: "
            + ("the device ran out, not the limit" if d.within_limit else "the limit refused it"),
        ))  # fmt: skip
    if d.derived:
        out.append(("† Derived", d.derived))
    return out


def _step(st: dict, rel) -> str:
    return f"{rel(st.get('time_us'))} with {count_of(st.get('requests'), 'request')} / {count_of(st.get('tokens'), 'token')}"


def step_words(ws: WindowSummary, rel) -> str | None:
    """The scheduler step in progress at the write: the one the OOM happened in, or why it is not known (a format
    1.4 window records a step when it ends, so the failing one is not in its list)."""
    if ws.oom is None:
        running = ws.steps_in_progress or []
        return (
            f"a scheduler step was in progress at the write: it began at {_step(running[-1], rel)}" if running else None
        )
    if ws.steps_in_progress is None:
        tail = ""
        if ws.steps_before_end:
            last = ws.steps_before_end[-1]
            ended = int(last.get("time_us", 0)) + int(last.get("duration_us", 0))
            tail = (
                f"; the last one listed ended at {rel(ended)}, {(ws.oom.time_us - ended) / 1e3:.1f} ms before the OOM"
            )
        return (
            "the scheduler step the OOM happened in is not in the list: this window (trace format 1.4) records a "
            "step when it ends" + tail
        )
    st = ws.step_at_oom
    if st is None:
        return "no scheduler step was in progress at the OOM: it happened outside Worker.execute_model"
    return f"the OOM happened during the scheduler step that began at {_step(st, rel)}"


#: How many growth sites the short statement of a window names.
SITES_SHOWN = 3


def oom_words(ws: WindowSummary) -> str:
    """``in serving: requested 22.00 MiB (23,068,672 B), device free ...``: the window's OOM (:mod:`.oom_text`)."""
    return f"{oom_text.where(ws.oom)}: {oom_text.details(ws.oom, ws.device_total_bytes, exact=True)}"


def held_lines(ws: WindowSummary, rel) -> list[str]:
    """What held the device at the window's end in one sentence (:data:`HOLDER_ROWS`' figures), then what the
    changes since start-up's end say (:func:`device_sentences`), a sentence each."""
    d = ws.device
    said = lambda rows: [f"{q} {_size(of(d.end))}{_mark(d, q)}" for q, of in rows if of(d.end) is not None]  # noqa: E731
    this, (mine, *rest) = said(HOLDER_ROWS[:5]), HOLDER_ROWS[5:]
    head = said([mine]) or ["this process"]
    held = f"Held at {_at(d)}: " + ", ".join([f"{head[0]} ({', '.join(this)})", *said(rest)]) + "."
    return [held] + [f"{h}: {text}." for h, text in device_sentences(ws, rel)]


def window_lines(ws: WindowSummary | None, t0_us: int) -> list[str]:
    """The window said in a few sentences, for the issue bundle's first screen and the view's page: what was
    kept and the gap, the failed allocation of an OOM in the window, PyTorch's state at its end (with
    :data:`quantities.RESERVED_UNUSED`), where it grew by stack, the last scheduler step, what memtrace cost while
    serving. [] without one."""
    if ws is None:
        return []
    w = ws.window
    rel = lambda t: "-" if t is None else f"{(t - t0_us) / 1e6:.2f} s"  # noqa: E731
    span = "-" if w.start_us is None or w.end_us is None else _s(w.end_us - w.start_us)
    gap = (
        f"after a GAP of {_s(w.gap_us)} that was not recorded ({w.events_dropped:,} allocator events, "
        f"{w.samples_dropped:,} NVML samples, {w.steps_dropped:,} scheduler steps dropped from the ring)"
        if w.gap_us
        else "right after start-up (nothing dropped)"
    )
    lines = [f"Serving window: {span} kept, {rel(w.start_us)} to {rel(w.end_us)}, {gap}; last written on {w.reason}."]
    if ws.oom is not None:
        lines.append(f"Failed allocation at {rel(ws.oom.time_us)} {oom_words(ws)}.")
    if ws.device is not None:
        lines += held_lines(ws, rel)
    elif ws.end_allocated_bytes is not None:
        lines.append(
            f"At the window's end: {Q.ALLOCATED} {gib_or_dash(ws.end_allocated_bytes)}, {Q.RESERVED} "
            f"{gib_or_dash(ws.end_reserved_bytes)}, {Q.RESERVED_UNUSED} {_size(ws.reserved_unused_bytes)} "
            f"(at its start: {Q.ALLOCATED} {gib_or_dash(ws.start_allocated_bytes)}, {Q.RESERVED} "
            f"{gib_or_dash(ws.start_reserved_bytes)})."
        )
    else:
        lines.append("No allocator on this device: the window holds scheduler steps and notes only.")
    if ws.growth:
        sites = "; ".join(f"{frame_text(g.frame)} +{_mib(g.bytes)} ({g.count})" for g in ws.growth[:SITES_SHOWN])
        lines.append(f"Allocated in the window and live at its end, by stack (blocks): {sites}.")
    if ws.steps_before_end:
        st = ws.steps_before_end[-1]
        err = f", error {st['error']}" if st.get("error") else ""
        lines.append(
            f"Last scheduler step at {rel(st.get('time_us'))}: {count_of(st.get('requests'), 'request')}, "
            f"{count_of(st.get('tokens'), 'token')}{err}."
        )
    said = step_words(ws, rel)
    if said:
        lines.append(f"Step at {'the OOM' if ws.oom is not None else 'the write'}: {said}.")
    if ws.cost is not None:
        lines.append(cost_text.serving(ws.cost, top=3) + ".")
    return lines


def room_section(rank) -> list[str]:
    """The issue bundle's answer to a serving OOM where the device ran out (``AnalysedRank.room``), in place of
    start-up's "would it boot": what took the room since start-up ended, how little was missing, and which
    utilization would have left it. [] when the rank did not die so."""
    r, ws = rank.room, rank.window
    if r is None or ws is None or ws.device is None:
        return []
    d = ws.device
    rel = lambda t: f"{rank.seconds(t):.2f} s"  # noqa: E731
    mark = "†" if d.derived else ""
    lines = ["## What would have left room (serving)", ""]
    lines.append(
        f"- **The device ran out** at {rel(ws.oom.time_us)}: the request of {format_size(ws.oom.requested_bytes)} "
        f"needed {format_size(r.short_bytes)} more than the {format_size(ws.oom.free_bytes)} free; any holder with "
        f"{format_size(r.short_bytes)} less would have left room."
    )
    grew = []
    if r.others_growth_bytes is not None:
        grew.append(f"{Q.OTHERS.label} {signed_size(r.others_growth_bytes)}{mark}")
    if r.own_growth_bytes is not None:
        grew.append(f"{Q.DEVICE_USED.label} {signed_size(r.own_growth_bytes)}{mark}")
    if grew:
        free0 = f" ({format_size(r.startup_free_bytes)} was free then)" if r.startup_free_bytes is not None else ""
        lines.append(f"- **What took the room** since start-up ended ({rel(d.startup_end.time_us)}){free0}: "
                     f"{', '.join(grew)}.")  # fmt: skip
    if r.util_for_request is not None:
        util = f"`--gpu-memory-utilization {r.util_for_request:g}` (recorded {r.util:g})"
        more = ""
        if r.util_for_others is not None:
            more = (f"; `--gpu-memory-utilization {r.util_for_others:g}` leaves room for the growth of "
                    f"{Q.OTHERS.label} ({signed_size(r.others_growth_bytes)}) as well")  # fmt: skip
        lines.append(
            "- **What would have left room:** vLLM sized this process's KV cache at start-up, to the utilization of "
            f"the device as it was then, and keeps it while serving; {util} keeps about {format_size(r.kept_bytes)} more out of it, "
            f"room for this request{more}."
        )
    if d.derived:
        lines.append(f"- **† Derived:** {d.derived}.")
    return [*lines, ""]
