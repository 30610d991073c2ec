"""The line that states what memtrace cost the traced program (``analysis.self_cost.SelfCost``).

"memtrace on vLLM's threads: X ms (Y % of init engine)", then the sources, largest first; the allocator
history's share is PyTorch's own, estimated (or said to be not measured); an older trace says the cost
was not recorded; a file memtrace did not record (an imported snapshot or profiler trace) has no line. Shared by ``memtrace report`` (text and Markdown) and its JSON.
"""

from __future__ import annotations

from ..analysis.self_cost import SelfCost

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
    share = cost.share_of_init_engine
    of = f" ({share * 100:.2f} % of init engine, {cost.init_engine_us / 1e6:.2f} s)" if share is not None else ""
    history = "" if cost.history_ns is not None else "; the allocator history's own cost not measured"
    return f"memtrace on {who}: {_ms(cost.total_ns)}{of}{history}"


def sources(cost: SelfCost, top: int = TOP_SOURCES) -> str:
    """The sources, largest first (the rest summed)."""
    shown = [f"{s.name} {_ms(s.ns)} ({s.calls:,})" for s in cost.sources[:top]]
    rest = cost.sources[top:]
    if rest:
        shown.append(f"{len(rest)} more {_ms(sum(s.ns for s in rest))}")
    text = "by source (calls): " + ", ".join(shown) if shown else "by source: none"
    if cost.history_ns is None:
        text += f"; allocator history not measured: {cost.history_why}"
    return text
