"""The line that states what memtrace cost the traced program (``analysis.self_cost.SelfCost``).

"memtrace on vLLM's threads: X ms (Y % of init engine)", then the sources, largest first; the allocator
history's share is PyTorch's own, estimated (or said to be not measured); an older trace says the cost
was not recorded; a file memtrace did not record (an imported snapshot or profiler trace) has no line. Shared by ``memtrace report`` (text and Markdown) and its JSON.
:func:`serving` says the same of a serving window (``analysis.self_cost.ServingCost``): against the time since
serving began, with memtrace's own threads beside it.
"""

from __future__ import annotations

from memtrace.analysis.analysed.self_cost import CostSource, SelfCost, ServingCost

TOP_SOURCES = 6


def _ms(ns: int) -> str:
    return f"{ns / 1e6:.1f} ms"


def headline(cost: SelfCost, vllm: bool) -> str:
    """The figure: total, and its share of vLLM's init engine when the trace has that span; "" for a file
    memtrace did not record (memtrace never ran in that program, so it cost nothing there)."""
    if not cost.by_memtrace:
        return ""
    who = "vLLM's threads" if vllm else "the program's threads"
    if not cost.recorded:
        return f"memtrace on {who}: not recorded (this trace predates memtrace's self-timing)"
    share, whole = cost.share_of_init_engine, cost.share_of_process_startup
    said = [f"{share * 100:.2f} % of init engine, {cost.init_engine_us / 1e6:.2f} s"] if share is not None else []
    if whole is not None:
        said.append(f"{whole * 100:.2f} % of the process's start-up, {cost.process_startup_us / 1e6:.2f} s")
    of = f" ({'; '.join(said)})" if said else ""
    history = "" if cost.history_ns is not None else "; the allocator history's own cost not measured"
    return f"memtrace on {who}: {_ms(cost.total_ns)}{of}{history}"


def sources(cost: SelfCost, top: int = TOP_SOURCES) -> str:
    """The sources, largest first (the rest summed)."""
    text = _sources(cost.sources, top)
    if cost.history_ns is None:
        text += f"; allocator history not measured: {cost.history_why}"
    return text


def _sources(sources: list[CostSource], top: int) -> str:
    shown = [
        f"{s.name} {_ms(s.ns)} ({s.calls:,}{'' if s.calls else ': the ends of calls begun earlier'})"
        for s in sources[:top]
    ]
    rest = sources[top:]
    if rest:
        shown.append(f"{len(rest)} more {_ms(sum(s.ns for s in rest))}")
    return "by source (calls): " + ", ".join(shown) if shown else "by source: none"


def serving(cost: ServingCost, vllm: bool = True, top: int = TOP_SOURCES) -> str:
    """memtrace's cost while serving, against the time since serving began, then its sources."""
    who = "vLLM's threads" if vllm else "the program's threads"
    # no allocations counted: no allocator (a CPU worker), nothing of PyTorch's to price
    unpriced = cost.history_ns is None and cost.allocs is not None
    said = [f"{cost.share * 100:.2f} %"] if cost.share is not None else []
    said += ["PyTorch's recording not measured"] if unpriced else []
    text = (
        f"memtrace while serving: {_ms(cost.total_ns)} on {who} in the {cost.span_us / 1e6:.2f} s since serving began"
    )
    text += f" ({'; '.join(said)})" if said else ""
    if cost.memtrace_threads_ns:
        text += f", and {_ms(cost.memtrace_threads_ns)} on memtrace's own threads, which hold the GIL while they run"
        text += f" ({cost.share_with_own_threads * 100:.2f} % with them)" if cost.share is not None else ""
    return f"{text}; {_sources(cost.sources, top)}"
