"""Non-PyTorch device memory, exactly: the CUPTI records of a trace broken down by who made them.

Input: ``Trace.device_allocs`` (format 1.2, the optional source ``capture.cupti``): every device
allocation and release the CUDA driver made for the process. Definitions (bytes, Unix-epoch µs):

- **PyTorch's own**: an allocation record whose address and size match one of the allocator's
  ``segment_alloc``/``segment_map`` events (or a segment of the final snapshot), paired in time order
  per (address, size): PyTorch's segments are already in the reserved curve and are never counted
  twice. Everything else is **non-PyTorch**.
- **live at t**: allocated at or before ``t`` and not released at or before ``t``; only kinds that
  take device memory (``model.DEVICE_MEMORY_KINDS``; pinned host memory is left out). The non-PyTorch
  ones (:func:`live_allocations`) are what the breakdown, the live curve and the flame graph count.
- **categories** (:func:`classify`), the first that matches the Python stack of the CUDA call, its memory
  kind and phase: NCCL, FlashInfer/CUTLASS JIT modules, kernel modules' statics (the ``__device__`` globals
  of every module the driver loads), CUDA graphs, cuBLAS/cuBLASLt workspaces (the first ``aten::mm`` on the
  H200 made 1,024 + 131,072 + 67,108,864 B of raw ``cudaMalloc`` inside cuBLAS), else other libraries, named
  by the innermost frame outside torch and the standard library (``frames.meaningful_frame``).
- **unexplained** = the steady NVML non-PyTorch bytes at ``t`` (``landmarks.steady_non_torch_at``:
  device used − reserved) − the non-PyTorch bytes CUPTI saw live. None without NVML samples. It is
  split in three: **present when recording began** (the non-PyTorch bytes at the first steady NVML
  sample, less what CUPTI saw live then: the CUDA context, the driver's own memory, what was
  allocated before memtrace started), **CUPTI's own** (the NVML growth, less what CUPTI saw, in the
  :data:`CUPTI_SETTLE_US` after CUPTI was enabled, ``facts["cupti"]["started_us"]``, else after the
  first steady sample: enabling CUPTI costs 12,582,912 B within 50 ms on the H200, whatever its
  attributes) and **grew unseen** (the rest: memory that appeared while recording without a record).
- **live curve**: the non-PyTorch bytes CUPTI saw live, exactly, at every record (:func:`live_curve`).
- **moments**: the first crossing of the target (``crossing.Excursion``) and the peak (NVML device
  used when sampled, else reserved).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass

import numpy as np
from memtrace import facts as F
from memtrace import vllm_phase_names as PN
from memtrace.analysis.analysed.landmarks import steady_non_torch, steady_non_torch_at
from memtrace.analysis.holders.frames import LibraryDirs, library_dirs, meaningful_frame, python_frames
from memtrace.analysis.memory.curves import Curve, Curves
from memtrace.analysis.memory.phases import path_at
from memtrace.model import ACTION_CODE, DEVICE_MEMORY_KINDS, MEMORY_KINDS, MEMORY_OPS, Frame, Trace

NCCL = "NCCL"
JIT = "FlashInfer/CUTLASS JIT modules"
GRAPHS = "CUDA graphs"
CUBLAS = "cuBLAS/cuBLASLt workspaces"
MODULES = "kernel modules' statics"
OTHER = "other libraries"
UNEXPLAINED = "unexplained"
CATEGORIES = (NCCL, CUBLAS, GRAPHS, JIT, MODULES, OTHER, UNEXPLAINED)
#: The library named for an allocation made from Inductor's generated code.
COMPILED = "torch.compile graph"
#: The window after CUPTI is enabled in which NVML's unrecorded growth is CUPTI's own (it took 3 steps
#: within 50 ms on the H200).
CUPTI_SETTLE_US = 200_000

_ALLOCATION = MEMORY_OPS.index("allocation")
_RELEASE = MEMORY_OPS.index("release")
_DEVICE_KINDS = np.array([name in DEVICE_MEMORY_KINDS for name in MEMORY_KINDS])
_STATIC_KINDS = frozenset({"device_static", "managed_static"})
_COMPILED_PATHS = ("torchinductor", "torch_compile_cache", "/inductor/")
_SEG_UP = (ACTION_CODE["segment_alloc"], ACTION_CODE["segment_map"])
_MATMUL = {"linear", "matmul", "mm", "bmm", "addmm", "baddbmm", "_scaled_mm", "einsum", "cublas"}
_GRAPH_PHASES = (PN.CAPTURE_MODEL, "cuda_graph", "cudagraph")


@dataclass(frozen=True)
class Allocation:
    """One live non-PyTorch allocation."""

    time_us: int
    address: int
    bytes: int
    kind: str
    category: str
    library: str
    frame: Frame | None  # the innermost frame outside torch and the standard library (frames.meaningful_frame)
    phase_path: str
    stack: int = -1  # its stack id in the trace (-1: none recorded)
    op: str | None = None  # the torch operator that made the call (``model.Frame.op``), when named


@dataclass(frozen=True)
class CategoryBytes:
    """One category's live bytes at a moment; ``libraries`` splits "other libraries"."""

    name: str
    bytes: int
    count: int
    libraries: tuple[tuple[str, int], ...] = ()
    largest: tuple[Allocation, ...] = ()


@dataclass(frozen=True)
class NonTorchBreakdown:
    """Non-PyTorch memory at one moment, CUPTI's records and NVML's rest."""

    moment: str  # "first crossing", "peak"
    time_us: int
    phase_path: str
    categories: tuple[CategoryBytes, ...]  # biggest first, "unexplained" last (when known)
    cupti_bytes: int  # non-PyTorch bytes CUPTI saw live
    torch_bytes: int  # PyTorch's own segments recognised among the live records (not counted)
    nvml_non_torch_bytes: int | None
    unexplained_bytes: int | None
    #: the unexplained bytes split: present when recording began (first steady NVML sample) / the rest
    at_start_bytes: int | None = None
    grew_unseen_bytes: int | None = None
    cupti_own_bytes: int | None = None  # of the unexplained bytes: CUPTI's own (see the module docstring)

    def category(self, name: str) -> CategoryBytes | None:
        return next((c for c in self.categories if c.name == name), None)


def has_records(trace: Trace) -> bool:
    return len(trace.device_allocs) > 0


def torch_made(trace: Trace) -> np.ndarray:
    """One bool per ``device_allocs`` record: an allocation PyTorch's allocator made (see docstring), or
    the release of one (the next release at its address). One pass over CUPTI's records (thousands, not
    millions: cheap enough to recompute)."""
    recs = trace.device_allocs
    out = np.zeros(len(recs), dtype=bool)
    ev = trace.events
    seg = ev[np.isin(ev["action"], _SEG_UP)]
    known = Counter(zip(seg["addr"].tolist(), seg["size"].tolist(), strict=True))
    for s in trace.segments:
        known.setdefault((s.address, s.total_bytes), 1)
    order = np.argsort(recs["time_us"], kind="stable")
    live: set[int] = set()  # addresses of PyTorch's segments live now
    for i in order.tolist():
        addr = int(recs["address"][i])
        if recs["op"][i] == _RELEASE:
            out[i] = addr in live
            live.discard(addr)
        elif recs["op"][i] == _ALLOCATION:
            key = (addr, int(recs["bytes"][i]))
            out[i] = known[key] > 0
            if out[i]:
                known[key] -= 1
                live.add(addr)
            else:
                live.discard(addr)
    return out


def live_at(trace: Trace, time_us: int) -> list[int]:
    """Indexes of the allocation records live at ``time_us`` (device memory kinds only)."""
    recs = trace.device_allocs
    order = np.argsort(recs["time_us"], kind="stable")
    live: dict[int, int] = {}
    kinds = recs["kind"].astype(np.int64)
    device = _DEVICE_KINDS[np.clip(kinds, 0, len(_DEVICE_KINDS) - 1)]
    for i in order.tolist():
        if int(recs["time_us"][i]) > time_us:
            break
        op, addr = int(recs["op"][i]), int(recs["address"][i])
        if op == _ALLOCATION and device[i]:
            live[addr] = i
        elif op == _RELEASE:
            live.pop(addr, None)
    return sorted(live.values())


def _library(frames: list[Frame], dirs: LibraryDirs | None) -> str:
    """The torch operator that made the call (``op vllm::moe_forward``, when the capture named it and
    no frame outside torch lies inside it), else the package of the innermost frame outside torch and
    the standard library (its file's name when not installed; :data:`COMPILED` for Inductor's
    generated code); ``dirs``: the trace's library folders (``frames.library_dirs``)."""
    f = meaningful_frame(frames, dirs)
    inner = frames[: frames.index(f)] if f is not None and f in frames else frames
    op = next((g.op for g in inner if g.op), None)
    if op:
        return f"op {op}"
    if f is None:
        return "no stack"
    path = f.filename.replace("\\", "/")
    if any(c in path.lower() for c in _COMPILED_PATHS):
        return COMPILED
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1].split("/", 1)[0].removesuffix(".py")
    return os.path.basename(path).removesuffix(".py")


def classify(frames: list[Frame], phase: str, kind: str = "device", dirs: LibraryDirs | None = None) -> tuple[str, str]:
    """(category, library) of an allocation from its stack (innermost first), its phase path and its
    memory kind (``model.MEMORY_KINDS``); ``dirs``: its trace's library folders (``frames.library_dirs``)."""
    frames = python_frames(frames)
    text = [(f.filename.replace("\\", "/").lower(), f.name.lower()) for f in frames]
    if any("nccl" in p or "nccl" in n or "torch/distributed" in p for p, n in text):
        return NCCL, "nccl"
    if any("flashinfer" in p or "cutlass" in p or "cutlass" in n for p, n in text):
        return JIT, "flashinfer" if any("flashinfer" in p for p, _ in text) else "cutlass"
    if kind in _STATIC_KINDS:
        return MODULES, _library(frames, dirs)
    if any(p.endswith("cuda/graphs.py") or "cudagraph" in p or "cudagraph" in n for p, n in text) or any(
        g in phase for g in _GRAPH_PHASES
    ):
        return GRAPHS, "cuda graphs"
    op = next((f.op for f in frames if f.op), None)
    op_base = op.split("::")[-1].split(".")[0] if op else ""
    if any("cublas" in p or "cublas" in n for p, n in text) or (text and text[0][1] in _MATMUL) or op_base in _MATMUL:
        return CUBLAS, "cublas"
    return OTHER, _library(frames, dirs)


def live_allocations(trace: Trace, time_us: int) -> list[Allocation]:
    """The non-PyTorch allocations CUPTI saw live at ``time_us`` (device memory kinds only, PyTorch's own
    segments left out), in record order; [] without records. Their bytes add up to
    :func:`breakdown`'s ``cupti_bytes`` and :func:`live_curve` at the same moment."""
    return _live(trace, time_us)[0]


def _live(trace: Trace, time_us: int) -> tuple[list[Allocation], int]:
    """(the non-PyTorch allocations live at ``time_us``, the bytes of PyTorch's own segments live then)."""
    if not has_records(trace):
        return [], 0
    recs = trace.device_allocs
    torch = torch_made(trace)
    out: list[Allocation] = []
    torch_bytes = 0
    dirs = library_dirs(trace)
    for i in live_at(trace, time_us):
        size = int(recs["bytes"][i])
        if torch[i]:
            torch_bytes += size
            continue
        stack = int(recs["stack"][i])
        frames = trace.stack_frames(stack)
        t = int(recs["time_us"][i])
        phase = path_at(trace, t)
        kind = MEMORY_KINDS[int(recs["kind"][i])] if 0 <= int(recs["kind"][i]) < len(MEMORY_KINDS) else "unknown"
        op = next((f.op for f in frames if f.op), None)
        address, frame = int(recs["address"][i]), meaningful_frame(frames, dirs)
        out.append(Allocation(t, address, size, kind, *classify(frames, phase, kind, dirs), frame, phase, stack, op))
    return out, torch_bytes


def breakdown(trace: Trace, time_us: int, moment: str, *, curves: Curves, largest: int = 3) -> NonTorchBreakdown | None:
    """Non-PyTorch memory at ``time_us`` (``curves``: the run's, ``AnalysedRank.curves``); None when the trace holds
    no CUPTI records."""
    if not has_records(trace):
        return None
    allocations, torch_bytes = _live(trace, time_us)
    groups: dict[str, list[Allocation]] = {}
    for a in allocations:
        groups.setdefault(a.category, []).append(a)
    cats = [_category(name, allocs, largest) for name, allocs in groups.items()]
    cats.sort(key=lambda c: (-c.bytes, c.name))
    cupti_bytes = sum(c.bytes for c in cats)
    nvml = steady_non_torch_at(curves, time_us)
    unexplained = nvml - cupti_bytes if nvml is not None else None
    at_start = grew = own = None
    if unexplained is not None:  # the steady NVML samples are there (the module docstring splits it)
        cats.append(CategoryBytes(UNEXPLAINED, unexplained, 0))
        steady = steady_non_torch(curves)
        at_start = int(steady.bytes[0]) - live_curve(trace).at(int(steady.time_us[0]))
        own = cupti_own_bytes(trace, curves) if time_us >= _cupti_start(trace, steady) + CUPTI_SETTLE_US else None
        grew = unexplained - at_start - (own or 0)
    return NonTorchBreakdown(
        moment, int(time_us), path_at(trace, time_us), tuple(cats), cupti_bytes, torch_bytes, nvml, unexplained,
        at_start, grew, own,
    )  # fmt: skip


def _cupti_start(trace: Trace, steady: Curve) -> int:
    """When CUPTI's records were enabled (``facts["cupti"]["started_us"]``), not before the first ``steady``
    NVML sample (the first sample when the fact is missing: files before it was recorded)."""
    first = int(steady.time_us[0]) if len(steady) else 0
    started = (trace.facts.get(F.CUPTI) or {}).get("started_us")
    return max(int(started), first) if isinstance(started, int) else first


def cupti_own_bytes(trace: Trace, curves: Curves) -> int | None:
    """CUPTI's own device memory: NVML's non-PyTorch growth in the :data:`CUPTI_SETTLE_US` after CUPTI
    was enabled, less what CUPTI recorded in that window (never below 0); None without records or NVML."""
    steady = steady_non_torch(curves)
    if not has_records(trace) or not len(steady):
        return None
    t0 = _cupti_start(trace, steady)
    t1 = t0 + CUPTI_SETTLE_US
    seen = live_curve(trace)
    return max((steady.at(t1) - steady.at(t0)) - (seen.at(t1) - seen.at(t0)), 0)


def live_curve(trace: Trace) -> Curve:
    """The non-PyTorch device bytes CUPTI saw live, one step per record that changes them (PyTorch's
    own segments and pinned host memory left out); empty without records. An analysed rank keeps it
    (``analysis.rank.AnalysedRank.cupti``)."""
    recs = trace.device_allocs
    if not len(recs):
        return Curve(np.zeros(0, np.int64), np.zeros(0, np.int64))
    torch = torch_made(trace)
    kinds = recs["kind"].astype(np.int64)
    device = _DEVICE_KINDS[np.clip(kinds, 0, len(_DEVICE_KINDS) - 1)]
    order = np.argsort(recs["time_us"], kind="stable")
    live: dict[int, int] = {}
    times, values, total = [], [], 0
    for i in order.tolist():
        if torch[i]:
            continue
        op, addr = int(recs["op"][i]), int(recs["address"][i])
        if op == _ALLOCATION and device[i]:
            total += int(recs["bytes"][i]) - live.pop(addr, 0)
            live[addr] = int(recs["bytes"][i])
        elif op == _RELEASE and addr in live:
            total -= live.pop(addr)
        else:
            continue
        times.append(int(recs["time_us"][i]))
        values.append(total)
    return Curve(np.asarray(times, np.int64), np.asarray(values, np.int64))


def _category(name: str, allocs: list[Allocation], largest: int) -> CategoryBytes:
    libs: dict[str, int] = {}
    for a in allocs:
        libs[a.library] = libs.get(a.library, 0) + a.bytes
    top = sorted(allocs, key=lambda a: (-a.bytes, a.time_us))[:largest]
    libraries = tuple(sorted(libs.items(), key=lambda kv: (-kv[1], kv[0]))) if name == OTHER else ()
    return CategoryBytes(name, sum(a.bytes for a in allocs), len(allocs), libraries, tuple(top))


def at_moments(
    trace: Trace, *, crossing_us: int | None, peak_us: int | None, curves: Curves
) -> list[NonTorchBreakdown]:
    """The breakdown at the first crossing and at the peak (each when given); [] without CUPTI records."""
    if not has_records(trace):
        return []
    out = []
    for moment, t in (("first crossing", crossing_us), ("peak", peak_us)):
        if t is not None:
            b = breakdown(trace, t, moment, curves=curves)
            if b is not None:
                out.append(b)
    return out
