"""The memory vocabulary: every quantity a user reads, with its one curve, peak rule, label and meaning.

Each :class:`Quantity` below is the one definition of a figure memtrace shows; outputs take the label (on
screen), the key (in JSON) and the meaning (a legend, a tooltip) from here, and a name never means two
things. The peak rules live here too, and nowhere else: :func:`peak` (the first maximum of a curve),
:func:`window_peak` (the first maximum inside a window, the value in force at its start counting),
:func:`samples_peak` (a sampled curve's highest sample inside a window), :func:`fullest_at_peak` (the
state shown "at the peak": the fullest moment of the reserved peak's plateau) and
:func:`window_fullest` (the fullest moment of a window).

The quantities are in bytes; :data:`QUANTITIES` says what each means. Those only a serving window states (its
end, what held the device at its OOM) are :data:`WINDOW_QUANTITIES`.

How well the peaks are known (:func:`peak_bound`): exact from a recorded history; "at least" (a lower bound)
for an imported snapshot of one moment (:data:`ONE_MOMENT`) or one without its allocator state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from memtrace.model import ROLE_SIZES_ONLY

if TYPE_CHECKING:  # curves.py imports the peak rule from here: no import cycle at run time
    from memtrace.analysis.memory.curves import Curve, Curves
    from memtrace.model import Trace


@dataclass(frozen=True)
class Quantity:
    """One memory quantity: its JSON key, its label on screen, and what it means, in one line."""

    key: str
    label: str
    meaning: str

    def __str__(self) -> str:
        return self.label


#: every quantity, in the order outputs list them: key, label, meaning
# fmt: off
QUANTITIES = (
    Quantity("allocated", "PyTorch allocated",
             "bytes live in tensors as the program requested them (the allocator's trace entries)"),
    Quantity("allocated_blocks", "PyTorch allocated (blocks)",
             "the allocator's blocks handed out to tensors, as torch.cuda.memory_allocated() counts them"),
    Quantity("reserved", "PyTorch reserved",
             "segments PyTorch's caching allocator holds from CUDA (torch.cuda.memory_reserved())"),
    Quantity("vmm", "KV cache outside PyTorch (CUDA VMM)",
             "what vLLM 0.34+ committed through CUDA's virtual memory API for its KV cache; PyTorch never sees it"),
    Quantity("held", "held by this process",
             "PyTorch reserved + the KV cache committed outside PyTorch (CUDA VMM)"),
    Quantity("device_used", "device used by this process",
             "NVML's used memory in CUDA's accounting, other processes' memory taken out (sampled)"),
    Quantity("others", "other processes",
             "memory other processes held on the same device (NVML's per-process list, sampled); never ours"),
    Quantity("non_torch", "non-PyTorch",
             "device used - PyTorch reserved - CUDA VMM: CUDA context, NCCL, cuBLAS, raw cudaMalloc (CUPTI splits it)"),
    Quantity("before_recording", "present before recording began",
             "PyTorch memory that existed at the first recorded event: exact from the allocator's state, else a lower "
             "bound"),
    Quantity("reserved_unused", "PyTorch reserved, unallocated",
             "PyTorch reserved minus PyTorch allocated (blocks) minus the private pools' cached blocks: free blocks "
             "and unused tails of split blocks (fragmentation), torch's OOM message's 'reserved by PyTorch but "
             "unallocated'"),
    Quantity("private_pool_cached", "PyTorch private pools, cached",
             "free blocks cached in PyTorch's private pools (CUDA graphs), which torch's OOM message counts as "
             "'allocated in private pools' and within 'allocated by PyTorch'"),
    Quantity("device_used_all", "device used, all processes",
             "the whole device's used memory in CUDA's accounting (total - free): this process and every other"),
    Quantity("device_free", "device free",
             "what CUDA reported free on the whole device (cudaMemGetInfo), as torch's OOM message says it ('of which "
             "... is free')"),
)
(ALLOCATED, ALLOCATED_BLOCKS, RESERVED, VMM, HELD, DEVICE_USED,
 OTHERS, NON_TORCH, BEFORE_RECORDING, RESERVED_UNUSED, PRIVATE_POOL_CACHED, DEVICE_USED_ALL, DEVICE_FREE) = QUANTITIES
# fmt: on
WINDOW_QUANTITIES = (RESERVED_UNUSED, PRIVATE_POOL_CACHED, DEVICE_USED_ALL, DEVICE_FREE)
BY_KEY = {q.key: q for q in QUANTITIES}


def in_vllm_terms(facts: dict) -> bool:
    """True when vLLM's vocabulary (KV cache, non-KV memory, "vLLM fills") applies to a trace: the vLLM plugin
    recorded it, or vLLM's own figures were recorded (``vllm.*`` facts, a vLLM-shaped start-up). Any other
    program is answered in its own terms: PyTorch's quantities only."""
    from memtrace import facts as F

    return F.is_vllm(facts) or any(str(k).startswith("vllm.") for k in facts)


def present(curves: Curves, process, *, oom: bool = False, window: bool = False) -> tuple[Quantity, ...]:
    """The quantities a trace's ``curves`` hold, in :data:`QUANTITIES`' order: PyTorch's always, but for the
    CPU's trace of ``process`` (``model.Process``; :func:`holds_reserved`) PyTorch allocated alone; the VMM KV
    cache and held only when something was committed outside PyTorch; NVML's when sampled; the serving window's
    own (:data:`WINDOW_QUANTITIES`) for a trace with a ``window``, and the device's free memory for one that
    died of an ``oom``."""
    absent = set() if window else set(WINDOW_QUANTITIES) - ({DEVICE_FREE} if oom else set())
    if not holds_reserved(process):  # no segments, no blocks, nothing known from before the profiler started
        absent |= {ALLOCATED_BLOCKS, RESERVED, BEFORE_RECORDING}
    if not len(curves.vmm):
        absent |= {VMM, HELD}
    if not curves.has_device:
        absent |= {DEVICE_USED, NON_TORCH}
    if not len(curves.others):
        absent.add(OTHERS)
    return tuple(q for q in QUANTITIES if q not in absent)


def curve(curves: Curves, q: Quantity) -> Curve:
    """The one curve of ``q`` among ``curves`` (``curves.all_curves``); KeyError for a quantity without one
    (the blocks' curve and the memory before recording are built elsewhere: ``blocks.block_curve``, which
    ``extensible.torch_allocated_curve`` gives, and :func:`before_recording`)."""
    return {
        ALLOCATED: curves.allocated,
        RESERVED: curves.reserved,
        VMM: curves.vmm,
        HELD: curves.held,
        DEVICE_USED: curves.device_used,
        OTHERS: curves.others,
        NON_TORCH: curves.non_torch,
    }[q]


# -- the peak rules: the only place a peak is found -------------------------------------------------------


def first_max(values: np.ndarray) -> int:
    """Index of the first maximum of ``values`` (-1 when empty): every peak below is this rule."""
    return int(np.argmax(values)) if len(values) else -1


def array_max(values: np.ndarray) -> int:
    """The largest of ``values`` (0 when empty): :func:`first_max`'s value."""
    return int(values[first_max(values)]) if len(values) else 0


@dataclass(frozen=True)
class Point:
    """A curve's value at one of its steps: the peak of a curve."""

    index: int  # the curve index (-1: an empty curve)
    time_us: int
    bytes: int


def peak(c: Curve) -> Point:
    """The first maximum of ``c`` (bytes 0 at time 0 for an empty curve)."""
    i = first_max(c.bytes)
    return Point(i, int(c.time_us[i]), int(c.bytes[i])) if i >= 0 else Point(-1, 0, 0)


def window_peak(c: Curve, start_us: int, end_us: int) -> tuple[int, int]:
    """(peak bytes, first time of the peak) of ``c`` over [start_us, end_us]; (0, start_us) if empty.

    The value in force at ``start_us`` counts, at time ``start_us`` (before the curve's first step its first
    value holds: an event curve's first point is the baseline, the state before recording began).
    """
    lo = int(np.searchsorted(c.time_us, start_us, side="right"))
    hi = int(np.searchsorted(c.time_us, end_us, side="right"))
    first = c.at(start_us, first_before=True)
    if hi <= lo:
        return first, start_us
    j = first_max(c.bytes[lo:hi])
    if int(c.bytes[lo + j]) > first:
        return int(c.bytes[lo + j]), int(c.time_us[lo + j])
    return first, start_us


def window_max(c: Curve, start_us: int, end_us: int) -> int:
    """The highest value of ``c`` in force during [start_us, end_us] (:func:`window_peak`'s bytes)."""
    return window_peak(c, start_us, end_us)[0]


def samples_peak(c: Curve, start_us: int, end_us: int) -> int | None:
    """The highest sample of a sampled curve taken inside [start_us, end_us]; None without one."""
    lo = int(np.searchsorted(c.time_us, start_us, side="left"))
    hi = int(np.searchsorted(c.time_us, end_us, side="right"))
    return int(c.bytes[lo + first_max(c.bytes[lo:hi])]) if hi > lo else None


def plateau_end(c: Curve, i: int) -> int:
    """The first curve index after ``i`` whose value differs from ``c.bytes[i]`` (``len(c)`` if none): the
    end of the plateau a peak starts."""
    change = np.flatnonzero(c.bytes[i + 1 :] != c.bytes[i])
    return i + 1 + int(change[0]) if len(change) else len(c)


def fullest_at_peak(allocated: Curve, reserved: Curve) -> int:
    """The curve index of the state shown "at the peak": within the reserved peak's plateau (from the step
    that reached it until reserved next changes), the first index with the most bytes allocated. A
    ``segment_alloc`` reaches the peak one event before the ``alloc`` that needed it, so the reserved peak's
    own index would miss the very block that caused it. 0 (the baseline) for an empty curve."""
    if not len(reserved):
        return 0
    pi = peak(reserved).index
    return pi + first_max(allocated.bytes[pi : plateau_end(reserved, pi)])


def window_fullest(allocated: Curve, start_us: int, end_us: int) -> int:
    """The curve index with the most bytes allocated during [start_us, end_us] (the state in force at
    ``start_us`` counts)."""
    lo = max(int(np.searchsorted(allocated.time_us, start_us, side="right")) - 1, 0)
    hi = max(int(np.searchsorted(allocated.time_us, end_us, side="right")), lo + 1)
    return lo + first_max(allocated.bytes[lo:hi])


def whole_device_peak(curves: Curves) -> int:
    """The highest device used with other processes' memory put back (this process's alone when none was
    sampled): how full the card itself was."""
    used = curves.device_used
    if not len(used):
        return 0
    return type(used)(used.time_us, used.bytes + curves.others.at_each(used.time_us, first_before=True)).peak_bytes


# -- memory present before recording began --------------------------------------------------------------


#: how the memory present before recording began is known, in the words every output uses
FROM_STATE = "the allocator's final state less the recorded events"
#: how it is known for a torch.profiler trace (``importers.kineto``): its own running totals, which the first
#: memory event carries with the bytes of that event
FROM_TOTALS = "the profiler's own totals at its first memory event, less that event's bytes"
#: why it is a lower bound: no allocator state was saved (a live trace cut short, a converter's snapshot)
NO_STATE = "no allocator state was saved: the least the recorded events need"
#: why it is a lower bound: the state was saved but the events do not add up to it (events were lost)
NOT_ADDING_UP = "the recorded events do not add up to the allocator's final state"


@dataclass(frozen=True)
class BeforeRecording:
    """PyTorch memory present before the first recorded event (``curves.Baseline``), and how well it is known."""

    reserved_bytes: int
    allocated_bytes: int
    exact: bool  # from the allocator's final state, with events that add up to it; else a lower bound
    how: str  # FROM_STATE or FROM_TOTALS when exact, else why it is a lower bound (NO_STATE, NOT_ADDING_UP)

    @property
    def bound(self) -> str:
        """Empty when exact, else "at least " (the words put before the figure)."""
        return "" if self.exact else "at least "

    @property
    def nonzero(self) -> bool:
        """Whether anything was present (an exact 0 B, or a lower bound of 0 B, says nothing worth a line)."""
        return bool(self.reserved_bytes or self.allocated_bytes)


def before_recording(trace: Trace, curves: Curves) -> BeforeRecording | None:
    """The memory present before ``trace``'s recording began: exact when the trace saved the allocator's state
    (its final segments, or an imported profiler trace's own totals before its first event) and the events add
    up to it, else the least figure that keeps the curves non-negative (a lower bound, and why). None for an
    imported snapshot of one moment (:data:`ONE_MOMENT`): it recorded nothing, so nothing came before."""
    from memtrace import facts as F

    if is_one_moment(trace.facts):
        return None
    b = curves.baseline
    totals = not trace.segments and bool((trace.facts.get(F.IMPORT) or {}).get("baseline"))
    state = bool(trace.segments) or totals
    exact = state and b.consistent
    how = (FROM_TOTALS if totals else FROM_STATE) if exact else NOT_ADDING_UP if state else NO_STATE
    # the curves' values before the first event: the baseline, reserved raised to allocated where the state is
    # missing (the live tensors sit in segments; ``curves.all_curves``)
    first = [
        int(c.bytes[0]) if len(c) else base
        for c, base in ((curves.reserved, b.reserved_bytes), (curves.allocated, b.allocated_bytes))
    ]
    return BeforeRecording(*first, exact=exact, how=how)


# -- how well a trace's peak is known ---------------------------------------------------------------------

#: What an allocator-state snapshot (``facts["import"]["state"] == "moment"``) can and cannot answer, in the
#: words every command's main text uses.
ONE_MOMENT = (
    "one moment: the allocator's state when the snapshot was taken (no history), so it answers what was held "
    "then, block by block; it cannot show a peak, a transient before or after that moment, phases or when "
    "anything happened"
)
#: When a verdict about a trace of one moment holds (fits' answer and table rows): that moment, never a phase.
AT_ONE_MOMENT = "at the snapshot's one moment"
#: What a trace imported without its allocator state (``state == "missing"``) cannot answer.
STATE_MISSING = "imported without the allocator's state: memory present before its history began is not counted"

#: What a torch.profiler trace of the CPU (``facts["import"]`` format "kineto", memory "host") counts: torch's
#: CPU allocator reports allocations and totals only from the moment the profiler started.
CPU_PROFILED = (
    "the CPU's memory as torch.profiler counts it: only what was allocated while it profiled (torch keeps no "
    "total of the CPU memory held before it started, such as a CPU worker's weights and KV cache)"
)


@dataclass(frozen=True)
class PeakBound:
    """How well a trace's peaks are known: exact, or a lower bound and why (the words every output uses)."""

    lower_bound: bool
    why: str = ""  # "" when exact: :data:`ONE_MOMENT`, :data:`STATE_MISSING` or :data:`CPU_PROFILED`

    @property
    def words(self) -> str:
        """Empty when exact, else "at least " (the words put before a peak's figure)."""
        return "at least " if self.lower_bound else ""


def peak_bound(facts: dict) -> PeakBound:
    """The :class:`PeakBound` of a trace with these ``facts``: a lower bound for an imported snapshot of one
    moment (the peak may have been higher at any other time), one without its allocator state, or a profiler
    trace of the CPU (what was held before the profiler started is not in it); else exact."""
    from memtrace import facts as F

    imported = facts.get(F.IMPORT) or {}
    cpu = imported.get("format") == "kineto" and imported.get("memory") == "host"
    why = {"moment": ONE_MOMENT, "missing": STATE_MISSING}.get(imported.get("state"), CPU_PROFILED if cpu else "")
    return PeakBound(bool(why), why)


def is_one_moment(facts: dict) -> bool:
    """True for an imported snapshot of allocator state alone (no history): :data:`ONE_MOMENT`."""
    return peak_bound(facts).why == ONE_MOMENT


#: What a torch.profiler trace (vLLM's ``--profiler-config`` or torch.profiler's own) holds: the window it profiled,
#: begun mid-run. fits answers for that window alone.
PROFILED_WINDOW = (
    "a torch.profiler trace: the window it profiled alone, begun mid-run (memory held before it counted as held "
    "from its start); the start-up, the KV cache sizing and every moment outside the window are not in it, and a "
    "KV cache held in it was sized for the card it ran on"
)


def is_profiled_window(facts: dict) -> bool:
    """True for a trace imported from a torch.profiler (Kineto) trace: :data:`PROFILED_WINDOW`."""
    from memtrace import facts as F

    return (facts.get(F.IMPORT) or {}).get("format") == "kineto"


# -- which memory a trace holds ---------------------------------------------------------------------------

#: What a trace's memory is, by ``Process.role`` (the device's unless the role says host): the words titles
#: and headers use, so a profiler trace of the CPU is never called GPU memory.
MEMORY_OF_ROLE = {"host": "CPU (host) memory", "pinned-host": "pinned host memory"}
DEVICE_MEMORY = "GPU memory"


def on_a_card(process) -> bool:
    """Whether a trace of ``process`` (``model.Process``) is a GPU's memory, what a card holds (``fits``): not the
    CPU's from torch.profiler nor pinned host memory (:data:`MEMORY_OF_ROLE`)."""
    return process.role not in MEMORY_OF_ROLE


def holds_reserved(process) -> bool:
    """Whether a trace of ``process`` (``model.Process``) has PyTorch reserved memory: every trace but the CPU's
    from torch.profiler (role "host": torch's CPU allocator caches no segments, its 'Total Reserved' stays 0),
    which holds PyTorch allocated alone, counted from the profiler's start (:data:`CPU_PROFILED`), and a device's
    from a torch.profiler before PyTorch 1.10 (role ``model.ROLE_SIZES_ONLY``: sizes
    alone, no totals)."""
    return process.role not in ("host", ROLE_SIZES_ONLY)


def ranked_by(process) -> Quantity:
    """The quantity a trace's peak is compared by, across ranks and in the run's verdict: :data:`RESERVED`, what
    the caching allocator held; :data:`ALLOCATED` for a trace without reserved memory (:func:`holds_reserved`)."""
    return RESERVED if holds_reserved(process) else ALLOCATED


def memory_meanings(processes) -> tuple[tuple[str, str], ...]:
    """(name, meaning) of each kind of memory among ``processes`` whose figures count something other than the
    GPU's memory every quantity's meaning speaks of: the CPU's, as torch.profiler counts it (:data:`CPU_PROFILED`).
    Empty for GPU memory alone."""
    return ((MEMORY_OF_ROLE["host"], CPU_PROFILED),) if any(p.role == "host" for p in processes) else ()


def memory_of(traces) -> str:
    """What the memory of ``traces`` is: "GPU memory", "CPU (host) memory", "pinned host memory", or
    "GPU and CPU (host) memory" (one name per kind, in order) for a run that holds several kinds."""
    kinds = list(dict.fromkeys(MEMORY_OF_ROLE.get(t.process.role, DEVICE_MEMORY) for t in traces))
    if len(kinds) == 1:
        return kinds[0]
    return " and ".join([k.removesuffix(" memory") for k in kinds[:-1]] + [kinds[-1]])
