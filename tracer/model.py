"""The trace model: plain data describing what one GPU-owning process did with memory.

This module is the bottom of memtrace's data flow: it imports nothing else of memtrace, and
holds no behaviour beyond small conveniences. Every quantity is an integer of bytes (``*_bytes``)
or of Unix-epoch microseconds (``*_us``); formatting belongs to the renderers.

Allocator events are kept columnar, in one numpy structured array (``EVENT_DTYPE``), because a
start-up can produce millions of them. Stacks are interned: an event refers to a stack id, a stack
is a tuple of frame ids (innermost frame first, as PyTorch records them), a frame is
(filename, line, function).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: On-disk format version written by this memtrace: (major, minor). Readers refuse a newer major.
FORMAT_VERSION = (1, 6)

#: Allocator actions, in the order of their integer codes in ``EVENT_DTYPE["action"]``.
#: The names are PyTorch's own (``c10/core/CachingDeviceAllocator.h`` TraceEntry::Action).
ACTIONS: tuple[str, ...] = (
    "alloc",  # a block handed to a tensor; size = requested bytes
    "free_requested",  # the tensor released it; memory may still wait on stream uses (memtrace skips it: capture)
    "free_completed",  # the block is back in the allocator's pool
    "segment_alloc",  # cudaMalloc of a new segment; size = segment bytes
    "segment_free",  # cudaFree of a segment
    "segment_map",  # expandable segment grew (physical pages mapped)
    "segment_unmap",  # expandable segment shrank
    "snapshot",  # a snapshot was taken (no memory effect)
    "oom",  # the allocator failed; addr holds device free bytes, size the request
    "annotate",  # user annotation (no memory effect)
)
ACTION_CODE: dict[str, int] = {name: code for code, name in enumerate(ACTIONS)}

#: One allocator event. ``stack`` is an index into ``Trace.stacks`` or -1 when none was recorded.
EVENT_DTYPE = np.dtype(
    [
        ("time_us", "<i8"),
        ("action", "<i1"),
        ("addr", "<i8"),
        ("size", "<i8"),
        ("stream", "<i8"),
        ("stack", "<i4"),
    ]
)

#: One device-level sample (NVML): memory used on the whole device, all processes included.
SAMPLE_DTYPE = np.dtype([("time_us", "<i8"), ("used_bytes", "<i8")])

#: One sample of the memory *other* processes hold on the traced device (NVML's per-process list,
#: every process but the traced one). Format 1.1; a 1.0 file loads with none.
OTHERS_DTYPE = np.dtype([("time_us", "<i8"), ("others_bytes", "<i8")])


#: One device allocation or release seen by CUPTI's activity API (``capture.cupti``; format 1.2, a 1.0 or
#: 1.1 file loads with none): every allocation the CUDA driver made for the process, PyTorch's segments
#: included. ``kind`` indexes ``MEMORY_KINDS``, ``op`` ``MEMORY_OPS``; ``stack`` is the Python stack of
#: the CUDA API call that made it (-1: none taken), ``correlation`` CUPTI's correlation id.
DEVICE_ALLOC_DTYPE = np.dtype(
    [
        ("time_us", "<i8"),
        ("address", "<i8"),
        ("bytes", "<i8"),
        ("kind", "<i1"),
        ("op", "<i1"),
        ("stack", "<i4"),
        ("pid", "<i4"),
        ("device", "<i2"),
        ("correlation", "<i8"),
    ]
)
#: CUPTI's memory kinds (``CUpti_ActivityMemoryKind``'s names, lower case), codes of ``kind``.
MEMORY_KINDS: tuple[str, ...] = (
    "unknown",
    "pageable",
    "pinned",
    "device",
    "array",
    "managed",
    "device_static",
    "managed_static",
)
#: Kinds that take device memory (pageable and pinned host memory do not).
DEVICE_MEMORY_KINDS = frozenset({"device", "array", "managed", "device_static", "managed_static"})
#: CUPTI's memory operations, codes of ``op``.
MEMORY_OPS: tuple[str, ...] = ("invalid", "allocation", "release")


#: One call of the CUDA virtual-memory API that vLLM (0.34+) makes through ``vllm/utils/vmm_driver.py`` to back
#: its extensible KV cache outside PyTorch's allocator (``plugins.vllm_vmm``; format 1.3, an older file loads
#: with none). ``op`` indexes ``VMM_OPS``: ``create`` (``cuMemCreate``: physical memory committed, ``bytes``;
#: ``handle`` names it), ``release`` (``cuMemRelease`` of ``handle``: ``bytes`` is what its create committed),
#: ``reserve`` / ``free_reserved`` (an address range, ``address`` and ``bytes``: no memory). ``caller`` indexes
#: ``VMM_CALLERS`` (who asked); ``error`` is the CUDA driver's error code of a call that failed (0: it
#: succeeded; a failed ``create`` committed nothing); ``stack`` the Python stack (-1: none taken).
VMM_DTYPE = np.dtype(
    [
        ("time_us", "<i8"),
        ("op", "<i1"),
        ("caller", "<i1"),
        ("error", "<i4"),
        ("bytes", "<i8"),
        ("handle", "<i8"),
        ("address", "<i8"),
        ("stack", "<i4"),
    ]
)
#: The virtual-memory operations, codes of ``VMM_DTYPE["op"]``.
VMM_OPS: tuple[str, ...] = ("create", "release", "reserve", "free_reserved")
#: Who made the call, codes of ``VMM_DTYPE["caller"]``: vLLM's extensible KV cache
#: (``vllm/utils/extensible_tensor.py``), vLLM's check that the API works (``vmm_unavailable_reason``: one
#: granule created and released), anything else.
VMM_CALLERS: tuple[str, ...] = ("other", "kv_cache", "probe")


def empty_events(n: int = 0) -> np.ndarray:
    """A zeroed event array of length ``n`` (stack set to -1)."""
    events = np.zeros(n, dtype=EVENT_DTYPE)
    events["stack"] = -1
    return events


def empty_samples(n: int = 0) -> np.ndarray:
    """A zeroed device-sample array of length ``n``."""
    return np.zeros(n, dtype=SAMPLE_DTYPE)


def empty_others(n: int = 0) -> np.ndarray:
    """A zeroed other-processes sample array of length ``n``."""
    return np.zeros(n, dtype=OTHERS_DTYPE)


def empty_device_allocs(n: int = 0) -> np.ndarray:
    """A device-allocation record array of length ``n`` (stack set to -1)."""
    records = np.zeros(n, dtype=DEVICE_ALLOC_DTYPE)
    records["stack"] = -1
    return records


def empty_vmm(n: int = 0) -> np.ndarray:
    """A virtual-memory call record array of length ``n`` (stack set to -1)."""
    records = np.zeros(n, dtype=VMM_DTYPE)
    records["stack"] = -1
    return records


@dataclass(frozen=True)
class Frame:
    """One Python (or C++) frame of an allocation's stack."""

    filename: str
    line: int
    name: str

    @property
    def op(self) -> str | None:
        """The torch operator this frame called (``vllm::moe_forward``), when the capture named it
        (:func:`op_frame_name`); None otherwise."""
        if not self.name.endswith("]") or _OP_MARK not in self.name:
            return None
        return self.name.rsplit(_OP_MARK, 1)[1][:-1] or None


_OP_MARK = " [op "


def op_frame_name(function: str, op: str) -> str:
    """The stored name of a frame of ``torch/_ops.py`` that called operator ``op``: ``__call__ [op
    vllm::moe_forward]`` (``capture.cupti`` writes it, :attr:`Frame.op` reads it): a C++ op's own
    ``cudaMalloc`` has no Python frame below it, so the op's name is the only clue who asked."""
    return f"{function}{_OP_MARK}{op}]"


@dataclass
class Block:
    """A block inside a segment at the moment the final snapshot was taken."""

    address: int
    size_bytes: int
    requested_bytes: int
    state: str  # "active_allocated", "active_pending_free", "inactive"
    stack: int = -1


@dataclass
class Segment:
    """A segment (one cudaMalloc, or one expandable range) at the final snapshot."""

    address: int
    total_bytes: int
    stream: int = 0
    segment_type: str = "large"
    pool_id: str = "0,0"  # PyTorch's (a, b) pool id; "0,0" is the default pool, others are graph pools
    is_expandable: bool = False
    blocks: list[Block] = field(default_factory=list)

    @property
    def allocated_bytes(self) -> int:
        return sum(b.size_bytes for b in self.blocks if b.state.startswith("active"))

    @property
    def requested_bytes(self) -> int:
        return sum(b.requested_bytes for b in self.blocks if b.state.startswith("active"))


@dataclass
class Phase:
    """A named span of time. ``parent`` is the index of the enclosing phase in ``Trace.phases``.

    ``end_us`` is None for a phase that never ended (the process died inside it).
    ``source`` says who marked it: "vllm" (the plugin), "user" (memtrace.phase), "annotation"
    (a record_function range found in a PyTorch snapshot).
    """

    name: str
    start_us: int
    end_us: int | None = None
    parent: int | None = None
    source: str = "user"


@dataclass
class HookCall:
    """One call of a hooked function (FlashInfer workspace allocators by default).

    ``returned_bytes`` counts the distinct storages the call returned; the deltas are PyTorch's
    allocated/reserved counters after minus before. ``args`` keeps ints, strings, dtypes, shapes.
    """

    name: str
    start_us: int
    end_us: int
    args: dict[str, Any] = field(default_factory=dict)
    returned_bytes: int | None = None
    allocated_delta_bytes: int | None = None
    reserved_delta_bytes: int | None = None
    error: str | None = None
    parent: int | None = None  # index of the enclosing hook call (nested calls)


@dataclass
class Note:
    """Something a reader of the trace must know: a missing hook target, a truncated history."""

    time_us: int
    level: str  # "info", "warning", "error"
    text: str


@dataclass
class Process:
    """Who recorded the trace: one process owning (at most) one device."""

    pid: int = 0
    hostname: str = ""
    role: str = ""  # "worker", "engine", "user", "import"...
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    device_index: int | None = None
    device_total_bytes: int | None = None  # physical capacity of the device


@dataclass
class Recording:
    """How the allocator history was recorded, and whether anything is missing from it."""

    source: str = "memtrace"  # "memtrace" (live capture) or "torch-snapshot" (imported)
    start_us: int | None = None
    end_us: int | None = None
    stacks: str = "python"  # "none", "python", "all"
    max_entries: int | None = None
    drains: int = 0
    truncated: bool = False  # events were lost (ring buffer wrapped before a drain)
    lost_events_min: int = 0  # a lower bound on how many, when known
    end_reason: str = ""  # "stop", "startup-complete", "oom", "signal:SIGTERM", "exit"...


@dataclass
class ServingWindow:
    """The serving window of ``MEMTRACE_UNTIL=serving`` (format 1.4, 1.5 its others; an older file loads with none).

    The trace's start-up part ends at ``startup_end_us``; the window covers ``start_us`` to ``end_us``
    (the last write). Between them lies the gap (``gap_us``): time in which memtrace kept records only in
    its bounded ring and dropped them (``*_dropped`` say how many), never a period of constant memory.
    ``start_state`` is PyTorch's allocator state at ``start_us``: ``allocated_bytes`` and ``reserved_bytes``
    with ``exact`` (True: torch's counters at the start of serving, carried forward over every dropped
    event; False: a lower bound) or {} when there is no allocator (a CPU worker). ``steps`` are vLLM's
    scheduler steps kept in the window (``time_us``, ``duration_us``, ``requests``, ``tokens``, ``error``),
    ``steps_in_progress`` (format 1.5; None in a 1.4 window, which did not track them) the steps begun and not
    ended when the window was written: an OOM's write happens inside the step that failed.
    ``bounds`` the ring's limits and the bytes they allow. ``events``/``samples`` are the window's own
    allocator events (``EVENT_DTYPE``) and NVML samples (``SAMPLE_DTYPE``: the whole device's used memory, every
    process included, as start-up's); ``others`` (format 1.5; a 1.4 window loads with none) the memory of the
    other processes on the device at those samples (``OTHERS_DTYPE``, NVML's per-process list, as the start-up
    sidecar samples it; none when the traced process was not told apart), with ``others_how`` saying how
    (``capture.processes.Others.stats``); ``segments`` the allocator state at the write (the start-up part keeps
    its own in ``Trace.segments``). ``cost`` (format 1.6; {} before) is memtrace's own cost from the start of
    serving to the write (``capture.serving_session.cost_since``: ``since_us``, ``until_us``, the self-cost
    ``sources`` on the program's threads, ``memtrace_threads_ns``, ``allocs`` the allocator counted meanwhile);
    ``analysis.self_cost.serving_cost`` adds PyTorch's estimated recording time to it.
    """

    startup_end_us: int | None = None
    start_us: int | None = None
    end_us: int | None = None
    reason: str = ""  # what wrote it last: "oom", "signal:SIGUSR2", "signal:SIGTERM", "exit", ...
    writes: int = 0
    events_kept: int = 0
    events_dropped: int = 0
    samples_kept: int = 0
    samples_dropped: int = 0
    steps_kept: int = 0
    steps_dropped: int = 0
    bounds: dict[str, Any] = field(default_factory=dict)
    start_state: dict[str, Any] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)
    steps_in_progress: list[dict[str, Any]] | None = None
    events: np.ndarray = field(default_factory=lambda: empty_events())
    samples: np.ndarray = field(default_factory=lambda: empty_samples())
    others: np.ndarray = field(default_factory=lambda: empty_others())
    others_how: dict[str, Any] = field(default_factory=dict)
    segments: list[Segment] = field(default_factory=list)
    cost: dict[str, Any] = field(default_factory=dict)

    @property
    def gap_us(self) -> int | None:
        """Microseconds between the end of start-up and the window's first record (None: unknown)."""
        if self.startup_end_us is None or self.start_us is None:
            return None
        return max(0, self.start_us - self.startup_end_us)


#: Traces of host memory, not of a device (``Process.role`` -> label): pinned host memory from a torch
#: snapshot (``importers.pinned_host``), the CPU's memory events of a profiler trace (``importers.kineto``).
HOST_ROLES = {"pinned-host": "pinned host", "host": "host (CPU)"}
#: ``Process.role`` of a device's trace whose allocations carry sizes without addresses (torch.profiler before
#: PyTorch 1.10, ``importers.kineto``): no reserved memory (``analysis.memory.quantities.holds_reserved``). The
#: one record of it; that who held what is not in it either, the events tell (``holders.live.knows_holders``).
ROLE_SIZES_ONLY = "import-sizes"


#: Fact keys (the ``facts`` document's keys) are listed once, with their types and writers, in
#: ``memtrace.facts``.


@dataclass
class Trace:
    """Everything one process recorded. Plain data: analysis functions take it as input."""

    process: Process = field(default_factory=Process)
    recording: Recording = field(default_factory=Recording)
    events: np.ndarray = field(default_factory=empty_events)
    frames: list[Frame] = field(default_factory=list)
    stacks: list[tuple[int, ...]] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    phases: list[Phase] = field(default_factory=list)
    samples: np.ndarray = field(default_factory=empty_samples)
    #: Memory held by other processes on the device (``OTHERS_DTYPE``); empty when not sampled.
    others: np.ndarray = field(default_factory=empty_others)
    #: Device allocations and releases seen by CUPTI (``DEVICE_ALLOC_DTYPE``); empty without the source.
    device_allocs: np.ndarray = field(default_factory=empty_device_allocs)
    #: vLLM's calls of CUDA's virtual-memory API (``VMM_DTYPE``): its extensible KV cache; empty before 0.34.
    vmm: np.ndarray = field(default_factory=empty_vmm)
    hook_calls: list[HookCall] = field(default_factory=list)
    #: The serving window after start-up (``MEMTRACE_UNTIL=serving``); None for a start-up-only trace.
    window: ServingWindow | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    notes: list[Note] = field(default_factory=list)
    #: Where the trace was read from (set by the store; not saved).
    path: str = ""
    #: The format version of the file it was read from (set by the store; not saved): which memtrace wrote it.
    format_version: tuple[int, int] = FORMAT_VERSION

    def stack_frames(self, stack: int) -> list[Frame]:
        """The frames of an interned stack, innermost first; [] for -1."""
        if stack < 0:
            return []
        return [self.frames[i] for i in self.stacks[stack]]

    @property
    def label(self) -> str:
        """A short name for this process in reports: ``rank 0``, ``pid 1234``; a host memory trace names its
        process too (``host (CPU) of rank 0``, ``host (CPU) of pid 1234``, ``pinned host``: a snapshot names
        no process), so the host traces of several processes never share one label."""
        if self.process.role in HOST_ROLES:
            what = HOST_ROLES[self.process.role]
            if self.process.rank is not None:
                return f"{what} of rank {self.process.rank}"
            return f"{what} of pid {self.process.pid}" if self.process.pid else what
        if self.process.rank is not None:
            return f"rank {self.process.rank}"
        return f"pid {self.process.pid}"


@dataclass
class Run:
    """One traced run: a directory holding one trace file per process (or a single file)."""

    path: str
    traces: list[Trace] = field(default_factory=list)


#: File endings of native (C, C++, CUDA) frames and of shared objects.
_NATIVE_SUFFIXES = (".c", ".h", ".cc", ".cpp", ".cxx", ".hpp", ".hh", ".cu", ".cuh", ".so", ".S", ".s")


def is_python_frame(f: Frame) -> bool:
    """True for a frame of Python code: a ``.py`` file or a pseudo-file such as ``<string>``."""
    fn = f.filename
    if not fn or fn == "??":
        return False
    if fn.endswith((".py", ".pyw")) or (fn.startswith("<") and fn.endswith(">")):
        return True
    if fn.endswith(_NATIVE_SUFFIXES) or "::" in f.name:
        return False
    base = fn.rsplit("/", 1)[-1].rsplit("\\", 1)[-1]
    return f.line > 0 and "." not in base  # an extension-less script (a console entry point)


def is_native_frame(f: Frame) -> bool:
    """True for a frame of native code (what only ``stacks="all"`` records)."""
    return not is_python_frame(f)


def stacks_kind(frames: Sequence[Frame]) -> str:
    """``"all"`` when any frame is native, ``"python"`` when there are frames, else ``"none"``."""
    if not frames:
        return "none"
    return "all" if any(is_native_frame(f) for f in frames) else "python"
