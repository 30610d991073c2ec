"""The report's sections on the user's own annotations: labels (``torch.cuda.memory._set_memory_metadata``), one
row per label, when its events began and ended, how many, and the bytes its allocations requested; and notes on
live tensors (``torch.cuda.memory._annotate_tensor``), one row per note with the block it names
(``analysis.user_metadata``)."""

from __future__ import annotations

from memtrace.plots.frame_words import frame_text
from memtrace.units import format_bytes, gib_number


def render_metadata(out, s) -> None:
    """The "User labels" and "Tensor annotations" sections of a rank's report (nothing without them)."""
    _labels(out, s)
    _notes(out, s)


def _labels(out, s) -> None:
    if not s.user_metadata:
        return
    out.heading("User labels (torch.cuda.memory._set_memory_metadata)")
    rows = [
        [m.value, f"{(m.first_us - s.origin.t0_us) / 1e6:.2f}", f"{(m.last_us - s.origin.t0_us) / 1e6:.2f}", f"{m.events:,}",
         f"{m.allocs:,}", gib_number(m.alloc_bytes)]
        for m in s.user_metadata
    ]  # fmt: skip
    out.table(["label", "first s", "last s", "events", "allocs", "GiB asked"], rows, "lrrrrr")
    if not out.md:
        out.line("  (GiB asked: the label's allocations' requested bytes summed, not what stayed live)")


def _notes(out, s) -> None:
    if not s.tensor_notes:
        return
    out.heading("Tensor annotations (torch.cuda.memory._annotate_tensor)")
    rows = [[n.text, f"{(n.time_us - s.origin.t0_us) / 1e6:.2f}", format_bytes(n.size_bytes, 2), *_block(n, s, frame_text)]
            for n in s.tensor_notes]  # fmt: skip
    out.table(["note", "at s", "block", "allocated", "freed", "allocated at"], rows, "lrrrrl")


def _block(n, s, frame_text) -> list[str]:
    """When the named block was allocated and freed, and where: "before" recording began, "-" never freed."""
    if not n.found:
        return ["-", "-", "(no live block at its address)"]
    alloc = "before" if n.alloc_us is None else f"{(n.alloc_us - s.origin.t0_us) / 1e6:.2f}"
    freed = "-" if n.free_us is None else f"{(n.free_us - s.origin.t0_us) / 1e6:.2f}"
    return [alloc, freed, frame_text(n.alloc_frame)]
