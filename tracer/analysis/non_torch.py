"""Non-PyTorch device memory, exactly: the CUPTI records of a trace broken down by who made them.

Input: ``Trace.device_allocs`` (format 1.2, the optional source ``capture.cupti``): every device
allocation and release the CUDA driver made for the process. Definitions (bytes, Unix-epoch µs):

- **PyTorch's own**: an allocation record whose address and size match one of the allocator's
  ``segment_alloc``/``segment_map`` events (or a segment of the final snapshot), paired in time order
  per (address, size): PyTorch's segments are already in the reserved curve and are never counted
  twice. Everything else is **non-PyTorch**.
- **live at t**: allocated at or before ``t`` and not released at or before ``t``; only kinds that
  take device memory (``model.DEVICE_MEMORY_KINDS``; pinned host memory is left out).
- **categories**, by the Python stack of the CUDA call (``capture.cupti``) and its phase, first match:
  NCCL (a frame of NCCL or ``torch.distributed``), FlashInfer/CUTLASS JIT modules (a frame of
  ``flashinfer`` or ``cutlass``), CUDA graphs (a frame of ``cuda/graphs.py`` or a cudagraph helper, or
  a phase that captures graphs), cuBLAS/cuBLASLt workspaces (a cuBLAS frame, or an innermost frame
  of a matmul/linear), other libraries (named by the innermost frame's package; "no stack" when
  CUPTI gave none).
- **unexplained** = the steady NVML non-PyTorch bytes at ``t`` (``landmarks.steady_non_torch_at``:
  device used − reserved) − the non-PyTorch bytes CUPTI saw live: the CUDA context, the driver's own
  memory and what was allocated before recording began. None without NVML samples.
- **moments**: the first crossing of the target (``summary.Crossing``) and the peak (NVML device
  used when sampled, else reserved).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ..model import ACTION_CODE, DEVICE_MEMORY_KINDS, MEMORY_KINDS, MEMORY_OPS, Frame, Trace
from .curves import Curves, all_curves
from .landmarks import steady_non_torch_at
from .phases import path_at

NCCL = "NCCL"
JIT = "FlashInfer/CUTLASS JIT modules"
GRAPHS = "CUDA graphs"
CUBLAS = "cuBLAS/cuBLASLt workspaces"
OTHER = "other libraries"
UNEXPLAINED = "unexplained"
CATEGORIES = (NCCL, CUBLAS, GRAPHS, JIT, OTHER, UNEXPLAINED)

_ALLOCATION = MEMORY_OPS.index("allocation")
_RELEASE = MEMORY_OPS.index("release")
_DEVICE_KINDS = np.array([name in DEVICE_MEMORY_KINDS for name in MEMORY_KINDS])
_SEG_UP = (ACTION_CODE["segment_alloc"], ACTION_CODE["segment_map"])
_MATMUL = {"linear", "matmul", "mm", "bmm", "addmm", "baddbmm", "_scaled_mm", "einsum", "cublas"}
_GRAPH_PHASES = ("capture_model", "cuda_graph", "cudagraph")


@dataclass(frozen=True)
class Allocation:
    """One live non-PyTorch allocation."""

    time_us: int
    address: int
    bytes: int
    kind: str
    category: str
    library: str
    frame: Frame | None  # the innermost frame of its stack
    phase_path: str


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

    def category(self, name: str) -> CategoryBytes | None:
        return next((c for c in self.categories if c.name == name), None)


def has_records(trace: Trace) -> bool:
    return len(trace.device_allocs) > 0


def torch_made(trace: Trace) -> np.ndarray:
    """One bool per ``device_allocs`` record: an allocation PyTorch's allocator made (see docstring)."""
    recs = trace.device_allocs
    out = np.zeros(len(recs), dtype=bool)
    ev = trace.events
    seg = ev[np.isin(ev["action"], _SEG_UP)]
    known: dict[tuple[int, int], int] = {}
    for a, s in zip(seg["addr"].tolist(), seg["size"].tolist(), strict=True):
        known[(a, s)] = known.get((a, s), 0) + 1
    for s in trace.segments:
        known.setdefault((s.address, s.total_bytes), 1)
    order = np.argsort(recs["time_us"], kind="stable")
    for i in order.tolist():
        if recs["op"][i] != _ALLOCATION:
            continue
        key = (int(recs["address"][i]), int(recs["bytes"][i]))
        left = known.get(key, 0)
        if left > 0:
            known[key] = left - 1
            out[i] = True
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


def _library(frames: list[Frame]) -> str:
    for f in frames:
        path = f.filename.replace("\\", "/")
        for marker in ("site-packages/", "dist-packages/"):
            if marker in path:
                return path.split(marker, 1)[1].split("/", 1)[0].removesuffix(".py")
    return os.path.basename(frames[0].filename).removesuffix(".py") if frames else "no stack"


def classify(frames: list[Frame], phase: str) -> tuple[str, str]:
    """(category, library) of an allocation from its stack (innermost first) and its phase path."""
    text = [(f.filename.replace("\\", "/").lower(), f.name.lower()) for f in frames]
    if any("nccl" in p or "nccl" in n or "torch/distributed" in p for p, n in text):
        return NCCL, "nccl"
    if any("flashinfer" in p or "cutlass" in p or "cutlass" in n for p, n in text):
        return JIT, "flashinfer" if any("flashinfer" in p for p, _ in text) else "cutlass"
    if any(p.endswith("cuda/graphs.py") or "cudagraph" in p or "cudagraph" in n for p, n in text) or any(
        g in phase for g in _GRAPH_PHASES
    ):
        return GRAPHS, "cuda graphs"
    if any("cublas" in p or "cublas" in n for p, n in text) or (text and text[0][1] in _MATMUL):
        return CUBLAS, "cublas"
    return OTHER, _library(frames)


def breakdown(
    trace: Trace, time_us: int, moment: str, *, curves: Curves | None = None, largest: int = 3
) -> NonTorchBreakdown | None:
    """Non-PyTorch memory at ``time_us``; None when the trace holds no CUPTI records."""
    if not has_records(trace):
        return None
    recs = trace.device_allocs
    torch = torch_made(trace)
    groups: dict[str, list[Allocation]] = {}
    torch_bytes = 0
    for i in live_at(trace, time_us):
        size = int(recs["bytes"][i])
        if torch[i]:
            torch_bytes += size
            continue
        frames = trace.stack_frames(int(recs["stack"][i]))
        t = int(recs["time_us"][i])
        phase = path_at(trace, t)
        category, library = classify(frames, phase)
        kind = MEMORY_KINDS[int(recs["kind"][i])] if 0 <= int(recs["kind"][i]) < len(MEMORY_KINDS) else "unknown"
        groups.setdefault(category, []).append(
            Allocation(t, int(recs["address"][i]), size, kind, category, library, frames[0] if frames else None, phase)
        )
    cats = [_category(name, allocs, largest) for name, allocs in groups.items()]
    cats.sort(key=lambda c: (-c.bytes, c.name))
    cupti_bytes = sum(c.bytes for c in cats)
    nvml = steady_non_torch_at(curves or all_curves(trace), time_us)
    unexplained = nvml - cupti_bytes if nvml is not None else None
    if unexplained is not None:
        cats.append(CategoryBytes(UNEXPLAINED, unexplained, 0))
    return NonTorchBreakdown(
        moment, int(time_us), path_at(trace, time_us), tuple(cats), cupti_bytes, torch_bytes, nvml, unexplained
    )


def _category(name: str, allocs: list[Allocation], largest: int) -> CategoryBytes:
    libs: dict[str, int] = {}
    for a in allocs:
        libs[a.library] = libs.get(a.library, 0) + a.bytes
    top = sorted(allocs, key=lambda a: (-a.bytes, a.time_us))[:largest]
    libraries = tuple(sorted(libs.items(), key=lambda kv: (-kv[1], kv[0]))) if name == OTHER else ()
    return CategoryBytes(name, sum(a.bytes for a in allocs), len(allocs), libraries, tuple(top))


def at_moments(
    trace: Trace, *, crossing_us: int | None, peak_us: int | None, curves: Curves | None = None
) -> list[NonTorchBreakdown]:
    """The breakdown at the first crossing and at the peak (each when given); [] without CUPTI records."""
    if not has_records(trace):
        return []
    curves = curves or all_curves(trace)
    out = []
    for moment, t in (("first crossing", crossing_us), ("peak", peak_us)):
        if t is not None:
            b = breakdown(trace, t, moment, curves=curves)
            if b is not None:
                out.append(b)
    return out


def counts(trace: Trace) -> dict[str, int]:
    """Records per ``kind/op`` ("device/allocation": 12...)."""
    recs = trace.device_allocs
    out: dict[str, int] = {}
    for k, o in zip(recs["kind"].tolist(), recs["op"].tolist(), strict=True):
        kind = MEMORY_KINDS[k] if 0 <= k < len(MEMORY_KINDS) else str(k)
        op = MEMORY_OPS[o] if 0 <= o < len(MEMORY_OPS) else str(o)
        key = f"{kind}/{op}"
        out[key] = out.get(key, 0) + 1
    return out
