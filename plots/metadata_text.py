"""The report's section on the user's own labels (``torch.cuda.memory._set_memory_metadata``): one row per
label, when its events began and ended, how many, and the bytes its allocations requested
(``analysis.user_metadata``)."""

from __future__ import annotations

from ..units import gib_number


def render_metadata(out, s) -> None:
    """The "User labels" section of a summary's report (nothing when no event carried a label)."""
    if not s.user_metadata:
        return
    out.heading("User labels (torch.cuda.memory._set_memory_metadata)")
    rows = [
        [m.value, f"{(m.first_us - s.t0_us) / 1e6:.2f}", f"{(m.last_us - s.t0_us) / 1e6:.2f}", f"{m.events:,}",
         f"{m.allocs:,}", gib_number(m.alloc_bytes)]
        for m in s.user_metadata
    ]  # fmt: skip
    out.table(["label", "first s", "last s", "events", "allocs", "GiB asked"], rows, "lrrrrr")
    if not out.md:
        out.line("  (GiB asked: the label's allocations' requested bytes summed, not what stayed live)")
