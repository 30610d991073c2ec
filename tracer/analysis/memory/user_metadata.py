"""The user's own labels on allocator events: ``torch.cuda.memory._set_memory_metadata(text)``, and notes on
live tensors: ``torch.cuda.memory._annotate_tensor(tensor, text)``.

From torch 2.x every trace entry recorded while a label is set carries it in ``user_metadata`` (kept by the
importer in the ``snapshot_fields`` fact, ``importers.snapshot_fields``). Each distinct label becomes a
landmark here: when its first and last event happened, how many events carried it, and the bytes its
allocations requested. ``record_function`` ranges recorded with ``global_record_annotations`` are phases
already (``importers.torch_snapshot.phases_from_annotations``).

torch 2.14's ``_annotate_tensor`` writes an ``annotate`` entry instead: the address and size of the tensor's
block, and the note in that entry's ``user_metadata`` (in place of the label in force). A note names a block,
not a span of events: :func:`tensor_notes` finds the block it names (the allocation live at that address when
the note was written) and never counts the note as a label.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from memtrace import facts as F
from memtrace.analysis.holders.frames import site_frame
from memtrace.analysis.holders.live import Lifetimes, lifetimes
from memtrace.importers.snapshot_fields import fields_by_event
from memtrace.model import ACTION_CODE, Frame, Trace

_ANNOTATE = ACTION_CODE["annotate"]


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
    labels[ev["action"] == _ANNOTATE] = ""  # a tensor's note, not a label (:func:`tensor_notes`)
    out = []
    for value in dict.fromkeys(labels[labels != ""]):
        mask = labels == value
        allocs = mask & (ev["action"] == ACTION_CODE["alloc"])
        t, count, n_allocs = ev["time_us"][mask], int(mask.sum()), int(allocs.sum())
        out.append(MetadataSpan(str(value), int(t.min()), int(t.max()), count, n_allocs, int(ev["size"][allocs].sum())))
    return sorted(out, key=lambda s: (s.first_us, s.value))


@dataclass(frozen=True)
class TensorNote:
    """One ``_annotate_tensor`` note and the block it names."""

    text: str
    time_us: int  # when the note was written
    event_index: int  # its ``annotate`` event
    addr: int
    size_bytes: int  # the size the note's entry carries
    alloc_stack: int  # the allocating stack of the block (-1: unknown, or no block found)
    alloc_frame: Frame | None  # its innermost meaningful frame (what a report prints)
    alloc_us: int | None  # None: allocated before recording began, or no block found
    free_us: int | None  # None: still live at the end, or no block found
    found: bool  # a block was live at ``addr`` when the note was written


def tensor_notes(trace: Trace, lt: Lifetimes | None = None) -> list[TensorNote]:
    """Every ``annotate`` entry of ``trace`` with its note and the block live at its address then; [] without any."""
    ev = trace.events
    at = np.flatnonzero(ev["action"] == _ANNOTATE)
    if not len(at):
        return []
    which, values = fields_by_event(trace.facts.get(F.SNAPSHOT_FIELDS), len(ev))
    lt = lt if lt is not None else lifetimes(trace)
    return [_note(trace, lt, i, values[which[i]][1] if which[i] >= 0 else "") for i in at.tolist()]


def _note(trace: Trace, lt: Lifetimes, i: int, text: str) -> TensorNote:
    """The note of ``annotate`` event ``i`` and the allocation live at its address right then."""
    ev, n = trace.events, len(trace.events)
    addr = int(ev["addr"][i])
    hit = np.flatnonzero((lt.addr == addr) & (lt.alloc_pos <= i) & (lt.free_pos > i))
    note = TensorNote(text, int(ev["time_us"][i]), i, addr, int(ev["size"][i]), -1, None, None, None, found=False)
    if not len(hit):
        return note
    j = int(hit[0])
    stack = int(lt.stack[j])
    return replace(
        note,
        alloc_stack=stack,
        alloc_frame=site_frame(trace, stack),
        alloc_us=int(lt.alloc_us[j]) if lt.alloc_pos[j] >= 0 else None,
        free_us=int(lt.free_us[j]) if lt.free_pos[j] < n else None,
        found=True,
    )


def notes_by_block(notes: list[TensorNote]) -> dict[tuple[int, int | None], str]:
    """``{(addr, alloc_us): note}`` of the blocks ``notes`` name (several notes on one block joined by "; "), the
    key a live allocation (``live.LiveAllocation``) is found by."""
    out: dict[tuple[int, int | None], str] = {}
    for n in notes:
        if n.found and n.text:
            key = (n.addr, n.alloc_us)
            out[key] = f"{out[key]}; {n.text}" if key in out else n.text
    return out
