"""The report's section on non-PyTorch memory by category, from CUPTI's records (``analysis.non_torch``).

Printed only when the trace holds CUPTI records (the optional source ``MEMTRACE_CUPTI=1``). ``out`` is
``plots.text``'s writer (``heading``/``item``/``table``); reads analysis results only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memtrace.analysis.memory import quantities as Q
from memtrace.analysis.memory.non_torch import MODULES, OTHER, UNEXPLAINED, NonTorchBreakdown
from memtrace.plots.frame_words import frame_text
from memtrace.units import format_gib, gib_number

if TYPE_CHECKING:
    from memtrace.analysis.analysed.rank import AnalysedRank


def _where(b: NonTorchBreakdown, name: str) -> str:
    cat = b.category(name)
    if cat is None or name == UNEXPLAINED:
        if b.at_start_bytes is None or b.grew_unseen_bytes is None:
            return "CUDA context, driver, before recording"
        own = ""
        if b.cupti_own_bytes is not None:
            own = f"{b.cupti_own_bytes:,} B CUPTI's own (NVML's growth right after it was enabled, no record), "
        rest = f"{b.grew_unseen_bytes:,} B grew while recording without a CUPTI record"
        if b.grew_unseen_bytes < 0:
            rest = (
                f"{-b.grew_unseen_bytes:,} B fewer than CUPTI's records say (NVML's last sample came before an"
                " allocation CUPTI saw)"
            )
        return (
            f"{b.at_start_bytes:,} B present when recording began (CUDA context, driver, earlier allocations), "
            f"{own}{rest}"
        )
    if name == MODULES and not any(a.frame for a in cat.largest):
        return (
            f"{cat.count:,} allocations of memory kind device_static: the __device__ globals of the kernel"
            " modules the driver loaded (lazily, at a kernel's first launch: no API call to take a stack from)"
        )
    libs = ""
    if name == OTHER and cat.libraries:
        libs = ", ".join(f"{lib} {format_gib(n)}" for lib, n in cat.libraries[:4]) + "; largest "
    return libs + "; ".join(
        f"{frame_text(a.frame)} ({a.bytes:,} B in {a.phase_path or 'no phase'}{f', op {a.op}' if a.op else ''})"
        for a in cat.largest[:2]
    )


def render_non_torch(out, s: AnalysedRank) -> None:
    """One table per moment (first crossing, peak): category, bytes, GiB, allocations, then where each
    category's bytes come from; a moment with the same figures as the one before says so in one line."""
    if not s.non_torch_moments:
        return
    out.heading("Non-PyTorch memory by category (CUPTI: every device allocation outside PyTorch's allocator)")
    previous: NonTorchBreakdown | None = None
    for b in s.non_torch_moments:
        when = f"at the {b.moment} ({(b.time_us - s.origin.t0_us) / 1e6:.2f} s, {b.phase_path or 'no phase'})"
        if previous is not None and _same(previous, b):
            out.item(f"{when}: the same {Q.NON_TORCH.label} figures as at the {previous.moment}")
            continue
        previous = b
        if b.nvml_non_torch_bytes is not None:
            out.item(
                f"{when}: NVML {Q.NON_TORCH.label} {format_gib(b.nvml_non_torch_bytes)} = CUPTI {format_gib(b.cupti_bytes)}"
                f" + unexplained {format_gib(b.unexplained_bytes)}; PyTorch's own segments recognised"
                f" {format_gib(b.torch_bytes)} (in reserved, not counted here)"
            )
        else:
            out.item(
                f"{when}: CUPTI {format_gib(b.cupti_bytes)} outside PyTorch (no NVML samples: nothing unexplained"
                f" is stated); PyTorch's own segments recognised {format_gib(b.torch_bytes)}"
            )
        if b.unexplained_bytes is not None and b.unexplained_bytes < 0:
            out.item(
                "unexplained is negative: CUPTI counted memory NVML did not show as used at that sample "
                "(managed memory not yet touched, or an allocation between two samples)"
            )
        rows = [
            [c.name, f"{c.bytes:,}", gib_number(c.bytes), f"{c.count:,}" if c.name != UNEXPLAINED else ""]
            for c in b.categories
        ]
        out.table(["category", "bytes", "GiB", "allocations"], rows, "lrrr")
        for c in b.categories:
            out.item(f"{c.name}: {_where(b, c.name)}")


def _same(a: NonTorchBreakdown, b: NonTorchBreakdown) -> bool:
    """The same categories, bytes and counts, and the same NVML figures (PyTorch's own may differ)."""
    key = lambda x: (  # noqa: E731
        [(c.name, c.bytes, c.count) for c in x.categories],
        x.nvml_non_torch_bytes,
        x.at_start_bytes,
    )
    return key(a) == key(b)
