"""The user's own labels on allocator events: ``torch.cuda.memory._set_memory_metadata(text)``.

From torch 2.x every trace entry recorded while a label is set carries it in ``user_metadata`` (kept by the
importer in the ``snapshot_fields`` fact, ``importers.snapshot_fields``). Each distinct label becomes a
landmark here: when its first and last event happened, how many events carried it, and the bytes its
allocations requested. ``record_function`` ranges recorded with ``global_record_annotations`` are phases
already (``importers.torch_snapshot.phases_from_annotations``); these labels are the other annotation torch
2.11-2.14 provides (their trace actions have no ``annotate`` of their own: see docs/importers.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import facts as F
from ..importers.snapshot_fields import fields_by_event
from ..model import ACTION_CODE, Trace


@dataclass(frozen=True)
class MetadataSpan:
    """One user label: the events that carried it, first to last."""

    value: str
    first_us: int
    last_us: int
    events: int
    allocs: int
    alloc_bytes: int  # bytes its allocations requested, summed (not what stayed live)


def metadata_spans(trace: Trace) -> list[MetadataSpan]:
    """Every non-empty ``user_metadata`` label of ``trace``'s events, in the order first seen; [] without any."""
    doc = trace.facts.get(F.SNAPSHOT_FIELDS)
    if not doc:
        return []
    ev = trace.events
    which, values = fields_by_event(doc, len(ev))
    labels = np.array([m for _, m, _ in values] + [""], dtype=object)[which]  # -1: torch's default, ""
    out = []
    for value in dict.fromkeys(labels[labels != ""]):
        mask = labels == value
        allocs = mask & (ev["action"] == ACTION_CODE["alloc"])
        t = ev["time_us"][mask]
        out.append(
            MetadataSpan(
                str(value),
                int(t.min()),
                int(t.max()),
                int(mask.sum()),
                int(allocs.sum()),
                int(ev["size"][allocs].sum()),
            )
        )
    return sorted(out, key=lambda s: (s.first_us, s.value))
