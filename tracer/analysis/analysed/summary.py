"""The figures' shapes of one analysed rank, and its JSON: the peak, the headline, the top holders, the hooks' totals.

``AnalysedRank`` (``analysis.rank``) is the only holder of figures; this module defines the plain data its peak
figures are, the functions the rank computes some of them with, and :func:`summary_doc`: the JSON shape of a rank
(``memtrace report --json``), every key read from the rank. Bytes and microseconds as integers. The **top
holders** are the live bytes at the run's headline peak grouped by the frame a report prints for them (the
innermost meaningful frame), one line per printed site; ``stacks`` counts the allocating stacks behind a line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import numpy as np
from memtrace import facts as F
from memtrace.analysis.holders.frames import library_dirs, meaningful_frame
from memtrace.analysis.holders.live import BEFORE_RECORDING, Holder, Lifetimes, holders_by_stack, lifetimes
from memtrace.analysis.memory.curves import Curves, state_missing
from memtrace.analysis.memory.target import describe
from memtrace.analysis.memory.vmm import Chunk
from memtrace.model import ACTION_CODE, Frame, Trace

if TYPE_CHECKING:  # the rank reads this module's shapes; summary_doc reads the rank: no import cycle at run time
    from memtrace.analysis.analysed.rank import AnalysedRank


@dataclass(frozen=True)
class Peak:
    """The global peak of reserved memory (first reached at ``time_us``) and what it held.

    Reserved stays at its peak until a segment is released, and the tensor a new segment was made
    for is handed out by the *next* event; so ``allocated_bytes`` and the holders are taken at the
    fullest moment (most allocated bytes, first reached) while reserved stays at the peak:
    right after event ``event_index``, at ``state_us``.
    """

    time_us: int
    reserved_bytes: int
    allocated_bytes: int
    phase_path: str
    event_index: int  # the state shown: right after this event (-1: the baseline itself)
    non_torch_bytes: int | None = None  # NVML used - reserved at the last steady sample at or before it
    state_us: int = 0  # when the state shown was reached (see below)


@dataclass(frozen=True)
class PeakPoint:
    """The maximum of one curve."""

    curve: str  # "allocated", "device_used"
    time_us: int
    bytes: int
    phase_path: str


@dataclass(frozen=True)
class Headline:
    """The run's headline: the quantity every output leads with and the moment of its peak, decided once
    (``rank_peaks.PeakFigures.headline``): what this process held (PyTorch reserved + the KV cache committed
    outside it) on a run with VMM records, else PyTorch reserved, else PyTorch allocated (the CPU's trace)."""

    quantity: str  # quantities.Quantity.key: "held", "reserved", "allocated"
    point: PeakPoint
    #: the state shown there (holders, flame): right after this event; None: every event at ``point.time_us``
    event_index: int | None
    #: when that state was reached: reserved's fullest moment on its plateau (``Peak.state_us``), else ``point``'s
    state_us: int


@dataclass(frozen=True)
class HolderLine:
    """Live bytes at the peak held by one printed site (the innermost meaningful frame)."""

    stack: int  # the largest of the allocating stacks behind this line
    frame: Frame | None  # the innermost user-meaningful frame: what is printed
    frames: list[Frame]  # the largest stack's frames
    bytes: int
    count: int  # live blocks
    share: float
    stacks: int = 1  # distinct allocating stacks grouped under this frame

    @property
    def before_recording(self) -> bool:
        """The blocks present before recording began (no stack: ``live.BEFORE_RECORDING``)."""
        return self.stack == BEFORE_RECORDING


@dataclass(frozen=True)
class HookTotal:
    """Every call of one hooked function added up (nested calls count under their own function)."""

    name: str
    calls: int
    returned_bytes: int  # distinct storages returned, summed over the calls
    allocated_delta_bytes: int  # PyTorch allocated after minus before, summed
    errors: int


def hook_totals(trace: Trace) -> list[HookTotal]:
    """Per hooked function: calls, bytes returned and allocated, errors; largest first."""
    acc: dict[str, np.ndarray] = {}
    for c in trace.hook_calls:
        acc[c.name] = acc.get(c.name, 0) + np.array(
            [1, c.returned_bytes or 0, c.allocated_delta_bytes or 0, bool(c.error)]
        )
    rows = [HookTotal(name, *map(int, v)) for name, v in acc.items()]
    return sorted(rows, key=lambda h: (-h.returned_bytes, h.name))


def warnings_of(trace: Trace, curves: Curves) -> list[str]:
    """What a reader must know before trusting the figures: a truncated history, events that do not add
    up, a phase that never ended."""
    out = []
    rec = trace.recording
    if rec.truncated:
        lost = f" (at least {rec.lost_events_min:,} events lost)" if rec.lost_events_min else ""
        out.append(
            f"the allocator history was truncated{lost}: curves before the loss are reconstructed, "
            "not recorded; raise max_entries or drain more often"
        )
    if not curves.baseline.consistent and not state_missing(trace):  # else its own note says more
        out.append(
            "the recorded events do not add up to the final allocator state: some events are missing; "
            "figures before the gap may be off"
        )
    return out + [
        f"phase '{p.name}' never ended: the process stopped inside it" for p in trace.phases if p.end_us is None
    ]


def memory_events(trace: Trace) -> int:
    """How many allocator events change memory (``snapshot`` and ``annotate`` markers left out)."""
    inert = (ACTION_CODE["snapshot"], ACTION_CODE["annotate"])
    return int(np.isin(trace.events["action"], inert, invert=True).sum())


def holders_by_site(
    trace: Trace,
    event_index: int | None,
    top: int = 10,
    *,
    lt: Lifetimes | None = None,
    t_us: int | None = None,
    chunks: Sequence[Chunk] = (),
) -> list[HolderLine]:
    """Live bytes right after ``event_index`` (None: at ``t_us``, every event then done) grouped by the frame
    printed for them (the innermost meaningful frame: file, line, function), largest first, at most ``top`` lines;
    with ``chunks``, the KV cache committed outside PyTorch then (``vmm.live_kv_chunks``) held by the frames that
    committed it, shares of both together (what the flame graph shows there). ``lt``: the trace's ``live.lifetimes``,
    when the rank holds them."""
    groups: dict[tuple, list] = {}
    lt = lt if lt is not None else lifetimes(trace)
    dirs = library_dirs(trace)
    held = holders_by_stack(trace, t_us, top=len(trace.stacks) + 2, event_index=event_index, lt=lt)
    torch_bytes, vmm_bytes = sum(h.bytes for h in held), sum(c.bytes for c in chunks)
    scale = torch_bytes / (torch_bytes + vmm_bytes) if vmm_bytes else 1.0
    total = torch_bytes + vmm_bytes
    items = [Holder(h.stack, h.bytes, h.count, h.share * scale) for h in held]
    items += [Holder(c.stack, c.bytes, 1, c.bytes / total) for c in chunks]
    for h in sorted(items, key=lambda h: -h.bytes) if chunks else items:
        frames = trace.stack_frames(h.stack) if h.stack >= 0 else []
        frame = meaningful_frame(frames, dirs)
        key = (frame.filename, frame.line, frame.name) if frame is not None else h.stack if h.stack < 0 else None
        groups.setdefault(key, []).append((h, frame, frames))
    lines = []
    for members in groups.values():
        (h, frame, frames), held = members[0], [m[0] for m in members]  # holders come largest first
        size, count, share = (sum(getattr(x, k) for x in held) for k in ("bytes", "count", "share"))
        lines.append(HolderLine(h.stack, frame, frames, size, count, share, len(members)))
    return sorted(lines, key=lambda x: -x.bytes)[:top]


#: properties written beside a dataclass's fields (where its class has one of that name)
_JSON_PROPERTIES = (
    "delta_reserved_bytes delta_allocated_bytes difference_bytes withheld_bytes truncated target_bytes target_source "
    "overshoot_bytes total_ns share_of_init_engine share_of_process_startup before_recording"
).split()
#: the keys of a rank's JSON, in order: ``key`` (the rank's attribute of that name) or ``key=dotted.path``
_DOC_KEYS = (
    "label process=trace.process recording=trace.recording env start_us end_us n_events n_samples "
    "baseline=curves.baseline peak peak_allocated peak_device_used peak_others target crossings=crossing_list phases "
    "holders hook_calls=trace.hook_calls hook_totals notes=trace.notes warnings non_kv oom allocator path=trace.path "
    "non_torch=non_torch_moments t0_us=origin.t0_us time_origin=origin.sentence vmm extensible counter_checks "
    "peak_held headline vllm whole_device_peak_bytes self_cost peak_bound user_metadata tensor_notes "
    "before_recording window frame_folders truncated=trace.recording.truncated target_bytes=target.target_bytes "
    "target_source"
).split()


def _plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
        for name in _JSON_PROPERTIES:
            if isinstance(getattr(type(obj), name, None), property):
                out[name] = _plain(getattr(obj, name))
        return out
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    return obj


def summary_doc(rank: AnalysedRank) -> dict[str, Any]:
    """The JSON shape of one analysed rank (``report --json``'s trace, the view's figures): every key read from one
    of the rank's figures (nothing computed here), exact integers of bytes and microseconds, nothing rounded."""
    from memtrace.analysis.serving.serving import window_doc

    special = {
        "env": dict(rank.trace.facts.get(F.ENV) or {}),
        "start_us": rank.span[0],
        "end_us": rank.span[1],
        "window": None if rank.window is None else window_doc(rank.window),
        "target_source": describe(rank.target),
    }
    doc = {}
    for item in _DOC_KEYS:
        key, _, path = item.partition("=")
        doc[key] = special[key] if key in special else attrgetter(path or key)(rank)
    return {k: _plain(v) for k, v in doc.items()}
