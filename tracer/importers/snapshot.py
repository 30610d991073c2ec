"""A whole ``torch.cuda.memory._snapshot()`` dict: one Trace per device (``importers.torch_snapshot``), then one for
its pinned host memory when it holds any (``importers.pinned_host``)."""

from __future__ import annotations

from typing import Any

from memtrace.errors import TraceFormatError
from memtrace.importers.pinned_host import host_trace
from memtrace.importers.torch_snapshot import (
    Interner,
    _device_trace,
    as_snapshot,
    describe_devices,
    devices_with_history,
)
from memtrace.model import Trace


def traces_from_snapshot(
    snapshot: dict[str, Any], *, device: int | None = None, source: str = "snapshot"
) -> list[Trace]:
    """One Trace per device of a whole ``_snapshot()`` dict (events, segments, frames, phases), then one
    for its pinned host memory when it holds any (``importers.pinned_host``).

    Every device with history or segments becomes its own trace, ``rank`` = its index (so
    ``--rank 1`` picks cuda:1); ``device`` keeps that one only. A device with segments and no history is
    a trace of one moment (:data:`MOMENT_NOTE`). A snapshot without ``time_us`` gets an
    order-preserving synthetic clock and a warning note (:data:`SYNTHETIC_CLOCK_NOTE`).
    """
    snapshot = as_snapshot(snapshot, source)
    devices = devices_with_history(snapshot)
    if device is not None:
        if device not in devices:
            have = describe_devices(snapshot) or "none"
            raise TraceFormatError(f"{source} holds nothing for device {device} (devices it holds: {have})")
        wanted = [device]
    else:
        wanted = devices
    host = host_trace(snapshot, interner=Interner()) if device is None else None
    if not wanted and host is None:
        raise TraceFormatError(
            f"{source} holds no allocator events and no segments; record with "
            "torch.cuda.memory._record_memory_history() before taking the snapshot"
        )
    out = [_device_trace(snapshot, d, devices) for d in wanted]
    return out + ([host] if host is not None else [])
