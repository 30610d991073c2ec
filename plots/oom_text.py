"""The words for an OOM, shared by every renderer: what was asked for, what was free, the limit.

One phrasing for the report, fits, diff, the issue bundle and the timeline, from
``analysis.oom.Oom``. Small sizes read as torch's own message does ("32.00 MiB", not "0.03 GiB"); the
allocator's limit is named only when it was below the device (a per-process memory fraction).
"""

from __future__ import annotations

from ..analysis.oom import Oom
from ..units import format_size


def where(o: Oom) -> str:
    return f"in {o.phase_path}" if o.phase_path else "outside any phase"


def details(o: Oom, device_total_bytes: int | None = None, sep: str = ", ") -> str:
    """``requested 32.00 MiB, device free 5.56 MiB`` (+ ``allocator limit 15.33 GiB`` when limited)."""
    free = f"device free {format_size(o.free_bytes)}" if o.free_bytes is not None else "free memory not recorded"
    parts = [f"requested {format_size(o.requested_bytes)}", free]
    limit = o.limit_bytes(device_total_bytes)
    if limit is not None:
        parts.append(f"allocator limit {format_size(limit)}")
    if o.count > 1:
        parts.append(f"{o.count} OOMs recorded, the first shown")
    return sep.join(parts)
