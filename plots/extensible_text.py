"""The report's sections on memory vLLM (0.34+) manages outside PyTorch, and on torch's own counters.

- "KV cache outside PyTorch (CUDA VMM)": ``AnalysedRank.vmm`` (``analysis.vmm``): what the KV cache committed
  through CUDA's virtual-memory API, the calls, what failed; the address space reserved, apart (not memory).
- "vLLM's KV cache sizing after warm-up": ``AnalysedRank.extensible`` (``analysis.extensible``), vLLM 0.34's
  formula term by term, each input as vLLM had it and as memtrace measured it, the blocks both give, and
  what the extension committed.
- "torch's own counters": ``AnalysedRank.counter_checks`` (``analysis.torch_counters``), in one line when they
  all agree, else the readings that do not.

``out`` is ``plots.text``'s writer (``heading``/``item``/``table``); reads analysis results only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memtrace.analysis.memory import quantities as Q
from memtrace.units import gib_or_dash

if TYPE_CHECKING:
    from memtrace.analysis.analysed.rank import AnalysedRank


def _seconds(s: AnalysedRank, t_us: int) -> str:
    return f"{(t_us - s.origin.t0_us) / 1e6:.2f} s"


def _bytes(n: int | None) -> str:
    return "-" if n is None else f"{n:,} B"


def render_vmm(out, s: AnalysedRank) -> None:
    v = s.vmm
    if v is None:
        return
    out.heading(Q.VMM.label)
    if s.extensible is not None:
        out.item(
            "with the extensible KV cache, vLLM's profiled available-KV figure only sizes the cache's address "
            "range; its size is measured after warm-up and committed in kv_cache_extend (next section)"
        )
    out.item(
        f"vLLM committed {gib_or_dash(v.kv_cache_bytes)} ({v.kv_cache_bytes:,} B) of KV cache pages through "
        f"CUDA's virtual-memory API ({v.creates} cuMemCreate, {v.releases} released); PyTorch's allocator never "
        "saw them, and the non-torch figures here do not count them"
    )
    if s.peak_held is not None:
        p = s.peak_held
        out.item(
            f"held through PyTorch and the VMM API together: {gib_or_dash(p.bytes)} at its highest, "
            f"{_seconds(s, p.time_us)} in {p.phase_path or 'outside any phase'}"
        )
    out.item(
        f"address space reserved for the cache's range: {gib_or_dash(v.reserved_bytes)} (not memory: the room "
        "the cache may grow into)"
    )
    for f in v.failures:
        what = "out of memory" if f.out_of_memory else f"CUDA error {f.error}"
        then = "vLLM's retry after emptying PyTorch's cache committed it" if f.recovered else "not recovered"
        out.item(
            f"FAILED cuMemCreate of {gib_or_dash(f.bytes)} at {_seconds(s, f.time_us)} in {f.phase}: {what}; {then}"
        )


def render_extensible(out, s: AnalysedRank) -> None:
    e = s.extensible
    if e is None:
        return
    out.heading("vLLM's KV cache sizing after warm-up (extensible KV cache)")
    rows = []
    for t in e.terms:
        diff = t.difference_bytes
        rows.append([t.name, _bytes(t.vllm_bytes), _bytes(t.memtrace_bytes), "-" if diff is None else f"{diff:+,}"])
    out.table(["input", "vLLM", "memtrace", "difference B"], rows, "lrrr")
    for t in e.terms:
        out.item(f"{t.name}: {t.how}")
    out.item(
        f"margin {gib_or_dash(e.margin_bytes)}; kept for transient activations {gib_or_dash(e.kept_for_transients_bytes)}; "
        f"available {gib_or_dash(e.available_bytes)}"
    )
    mt = "-" if e.num_blocks_memtrace is None else f"{e.num_blocks_memtrace:,}"
    same = "the same" if e.num_blocks_memtrace == e.num_blocks == e.num_blocks_from_inputs else "DIFFERENT"
    out.item(
        f"blocks: vLLM {e.num_blocks:,}; vLLM's formula on vLLM's inputs {e.num_blocks_from_inputs:,}; "
        f"on memtrace's {mt} ({same})"
    )
    if e.committed_final_bytes is not None:
        ok = "= the pages of those blocks" if e.committed_final_bytes == e.pages_bytes else (
            f"!= the pages of those blocks ({e.pages_bytes:,} B)")  # fmt: skip
        out.item(
            f"kv_cache_extend committed {gib_or_dash(e.committed_final_bytes)} ({e.committed_final_bytes:,} B) {ok}"
        )
    if e.torch_limit_bytes is not None:
        out.item(f"vLLM then capped PyTorch's allocator at {gib_or_dash(e.torch_limit_bytes)}")
    for note in e.notes:
        out.item(f"note: {note}")


def render_counters(out, s: AnalysedRank) -> None:
    checks = s.counter_checks
    if not checks:
        return
    bad = [c for c in checks if not c.equal]
    out.heading("torch's own counters")
    if not bad:
        out.item(
            f"memtrace's reserved, allocated (blocks) and peak figures equal torch's counters at all {len(checks)} readings the "
            "plugin took at vLLM's phase edges (nothing was lost; the curves mean what torch means)"
        )
        return
    out.item(f"{len(bad)} of {len(checks)} readings differ:")
    for c in bad[:10]:
        out.item(
            f"{c.phase} {c.edge} at {_seconds(s, c.time_us)}: torch reserved {_bytes(c.torch_reserved_bytes)}, "
            f"memtrace {_bytes(c.memtrace_reserved_bytes)}; peak {_bytes(c.torch_reserved_peak_bytes)} vs "
            f"{_bytes(c.memtrace_reserved_peak_bytes)}; allocated peak - allocated {_bytes(c.torch_transient_bytes)} "
            f"vs {_bytes(c.memtrace_transient_bytes)}; allocated (blocks) {_bytes(c.torch_allocated_bytes)} vs "
            f"{_bytes(c.memtrace_allocated_bytes)}"
        )
