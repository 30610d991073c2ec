"""The report's section on non-PyTorch memory by category, from CUPTI's records (``analysis.non_torch``).

Printed only when the trace holds CUPTI records (the optional source ``MEMTRACE_CUPTI=1``). ``out`` is
``plots.text``'s writer (``heading``/``item``/``table``); reads analysis results only.
"""

from __future__ import annotations

from ..analysis.non_torch import OTHER, UNEXPLAINED, NonTorchBreakdown
from ..analysis.summary import Summary
from ..units import format_gib


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**30:.2f}"


def _where(b: NonTorchBreakdown, name: str) -> str:
    from .text import frame_text

    cat = b.category(name)
    if cat is None or name == UNEXPLAINED:
        return "CUDA context, driver, before recording"
    if name == OTHER and cat.libraries:
        return ", ".join(f"{lib} {_gib(n)}" for lib, n in cat.libraries[:4])
    return "; ".join(f"{frame_text(a.frame)} ({_gib(a.bytes)})" for a in cat.largest[:2])


def render_non_torch(out, s: Summary) -> None:
    """One table per moment (first crossing, peak): category, GiB, allocations, largest or libraries."""
    if not s.non_torch:
        return
    out.heading("Non-PyTorch memory by category (CUPTI: every device allocation outside PyTorch's allocator)")
    for b in s.non_torch:
        when = f"at the {b.moment} ({(b.time_us - s.start_us) / 1e6:.2f} s, {b.phase_path or 'no phase'})"
        if b.nvml_non_torch_bytes is not None:
            out.item(
                f"{when}: NVML non-PyTorch {format_gib(b.nvml_non_torch_bytes)} = CUPTI {format_gib(b.cupti_bytes)}"
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
            [c.name, _gib(c.bytes), f"{c.count:,}" if c.name != UNEXPLAINED else "", _where(b, c.name)]
            for c in b.categories
        ]
        out.table(["category", "GiB", "allocations", "largest (where) / libraries"], rows, "lrrl")
