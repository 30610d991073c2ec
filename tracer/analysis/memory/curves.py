"""Exact memory curves from allocator events: pure functions over a Trace.

Semantics (PyTorch's caching allocator, ``TraceEntry`` actions):

- **reserved** (what PyTorch holds from CUDA; torch's ``memory_reserved``): ``+size`` on
  ``segment_alloc`` and ``segment_map``, ``-size`` on ``segment_free`` and ``segment_unmap``.
- **allocated** (bytes live in tensors, as *requested* by the caller): ``+size`` on ``alloc``,
  ``-size`` on ``free_completed``. Between ``free_requested`` and ``free_completed`` a block still
  waits on another stream's work, so it still occupies memory and stays counted. Trace entries carry
  requested sizes; torch's ``memory_allocated`` counts blocks rounded up to 512 B (or 2 MiB for large
  ones), so it is a few KiB above this curve: both are exact, they count different things.
- **baseline**: memory that existed before the first recorded event, reconstructed from the final
  snapshot: ``baseline = state at snapshot - net effect of all recorded events``. Without a final
  snapshot it is the least value that keeps the curve from going negative (0 for a recording that
  started before the first CUDA allocation; more when a ring buffer dropped the oldest events).
- **order**: the events' order is the allocator's (it records under its lock); ``time_us`` comes
  from a TSC-to-wall-clock conversion and may step back by a microsecond. Curve times are made
  non-decreasing (a running maximum) so that ``at``/``window`` can search them; values keep the
  event order. Curve index ``i`` is the state after event ``i - 1``; index 0 is the baseline.
- **device used** comes from NVML samples (CUDA context, NCCL, raw cudaMalloc), put in CUDA's
  accounting (NVML also counts memory the driver reserves, which CUDA never reports), and is *this
  process's*: the memory of other processes on the device (``trace.others``, NVML's per-process
  list; format 1.1) is taken out and kept as its own curve, **others**. A trace without that series
  (format 1.0, or the traced pid not found by NVML) has the whole device's used memory.
  **non-PyTorch** = device used - reserved, evaluated at each sample.

A Curve is a step function: ``bytes[i]`` holds from ``time_us[i]`` until ``time_us[i+1]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
from memtrace import facts as F
from memtrace.analysis.memory.quantities import first_max
from memtrace.model import ACTION_CODE, VMM_CALLERS, VMM_OPS, Trace

_ALLOC = ACTION_CODE["alloc"]
_FREE_COMPLETED = ACTION_CODE["free_completed"]
_SEG_UP = (ACTION_CODE["segment_alloc"], ACTION_CODE["segment_map"])
_SEG_DOWN = (ACTION_CODE["segment_free"], ACTION_CODE["segment_unmap"])
CREATE, RELEASE, RESERVE, FREE_RESERVED = (
    VMM_OPS.index(op) for op in ("create", "release", "reserve", "free_reserved")
)
_KV_CACHE_CALLER = VMM_CALLERS.index("kv_cache")


@dataclass(frozen=True)
class Curve:
    """A step function of bytes over time (Unix-epoch microseconds)."""

    time_us: np.ndarray  # int64, non-decreasing
    bytes: np.ndarray  # int64, same length

    def __len__(self) -> int:
        return len(self.time_us)

    @property
    def peak_index(self) -> int:
        """Index of the first maximum (-1 for an empty curve): ``quantities.first_max``, the one peak rule."""
        return first_max(self.bytes)

    @property
    def peak_bytes(self) -> int:
        """The value at :attr:`peak_index` (0 for an empty curve)."""
        return int(self.bytes[self.peak_index]) if len(self) else 0

    def at(self, t_us: int, *, first_before: bool = False) -> int:
        """The value in force at ``t_us`` (the last step at or before it); 0 before the first, or with
        ``first_before`` the first step's value (an event curve's first point is the baseline); 0 when empty."""
        i = int(np.searchsorted(self.time_us, t_us, side="right")) - 1
        return int(self.bytes[max(i, 0)]) if (i >= 0 or first_before) and len(self) else 0

    def at_each(self, t_us: np.ndarray, *, first_before: bool = False) -> np.ndarray:
        """:meth:`at` at each of ``t_us`` (int64): 0 before the first step, or with ``first_before``
        the first step's value (a sampled figure known from its first reading on); zeros when empty."""
        if not len(self):
            return np.zeros(len(t_us), dtype=np.int64)
        i = np.searchsorted(self.time_us, t_us, side="right") - 1
        values = self.bytes[np.clip(i, 0, None)].astype(np.int64)
        return values if first_before else np.where(i >= 0, values, 0)

    def window(self, start_us: int, end_us: int) -> Curve:
        """The part of the curve in force during [start_us, end_us], starting with the value at start_us."""
        lo = int(np.searchsorted(self.time_us, start_us, side="right"))
        hi = int(np.searchsorted(self.time_us, end_us, side="right"))
        t = np.concatenate(([start_us], self.time_us[lo:hi])).astype(np.int64)
        b = np.concatenate(([self.at(start_us)], self.bytes[lo:hi])).astype(np.int64)
        return Curve(t, b)


@dataclass(frozen=True)
class Baseline:
    """Memory that existed before the first recorded event."""

    allocated_bytes: int
    reserved_bytes: int
    consistent: bool  # False when the events do not add up to the final snapshot (lost events)


def _running_sums(trace: Trace, up: tuple[int, ...], down: tuple[int, ...]) -> np.ndarray:
    """A curve's values before its baseline: 0, then the running sum of the deltas after every event, computed
    in the curve's own array (no copy: at 10M events each is 80 MB)."""
    ev = trace.events
    sign = np.zeros(256, dtype=np.int8)  # by action code (int8, read as uint8)
    sign[list(up)], sign[list(down)] = 1, -1
    values = np.empty(len(ev) + 1, dtype=np.int64)
    values[0] = 0
    np.multiply(sign[ev["action"].view(np.uint8)], ev["size"], out=values[1:], dtype=np.int64)
    np.cumsum(values[1:], out=values[1:])
    return values


def _baseline(trace: Trace, alloc_sums: np.ndarray, reserved_sums: np.ndarray) -> Baseline:
    """The memory present before recording began, from the final segments and the running sums of the allocated
    and reserved deltas. Without segments (none were saved), the least value that keeps the curves from going
    negative: zero for a recording started before the program's first CUDA allocation."""
    net_alloc = int(alloc_sums[-1]) if len(alloc_sums) else 0
    net_reserved = int(reserved_sums[-1]) if len(reserved_sums) else 0
    known = (trace.facts.get(F.IMPORT) or {}).get("baseline") if not trace.segments else None
    if known:  # a profiler trace's own totals before its first event (importers.kineto)
        base_alloc, base_reserved = int(known["allocated_bytes"]), int(known.get("reserved_bytes") or 0)
        ok = base_alloc + min(0, int(alloc_sums.min()) if len(alloc_sums) else 0) >= 0
        if known.get("reserved_bytes") is not None:  # None: no reserved figure (the CPU's memory)
            ok = ok and _within(alloc_sums, reserved_sums, base_alloc, base_reserved)
        return Baseline(base_alloc, base_reserved, consistent=ok)
    if not trace.segments:
        # A history whose oldest events were dropped starts with frees of memory the
        # curve never saw; the least baseline that keeps the curves non-negative is the honest floor.
        need_alloc = max(0, -int(alloc_sums.min())) if len(alloc_sums) else 0
        need_reserved = max(0, -int(reserved_sums.min())) if len(reserved_sums) else 0
        ok = need_alloc == 0 and need_reserved == 0  # without the state reserved is known from below only: not compared
        ok = ok and (state_missing(trace) or _within(alloc_sums, reserved_sums, 0, 0))
        return Baseline(need_alloc, need_reserved, consistent=ok)
    final_reserved = sum(s.total_bytes for s in trace.segments)
    final_alloc = sum(b.requested_bytes for s in trace.segments for b in s.blocks if b.state.startswith("active"))
    base_alloc = final_alloc - net_alloc
    base_reserved = final_reserved - net_reserved
    ok = base_alloc >= 0 and base_reserved >= 0 and base_alloc <= base_reserved
    ok = ok and _within(alloc_sums, reserved_sums, base_alloc, base_reserved)
    return Baseline(max(base_alloc, 0), max(base_reserved, 0), consistent=ok)


def state_missing(trace: Trace) -> bool:
    """True for a trace imported without the allocator's state it needed (``facts["import"]["state"] ==
    "missing"``: a history with ``segments: []``): memory before recording began is unknown."""
    return (trace.facts.get(F.IMPORT) or {}).get("state") == "missing"


def _within(alloc_sums: np.ndarray, reserved_sums: np.ndarray, base_alloc: int, base_reserved: int) -> bool:
    """True when allocated never exceeds reserved after any event (tensors live inside segments)."""
    room, step = base_reserved - base_alloc, 1 << 20
    # a million events at a time: one difference of every event was a fresh 80 MB at 10M events
    return all(
        bool(np.all(alloc_sums[i : i + step] - reserved_sums[i : i + step] <= room))
        for i in range(0, len(alloc_sums), step)
    )


def _curve_times(trace: Trace) -> np.ndarray:
    """The curves' time axis: the recording start, then the events' times made non-decreasing."""
    ev = trace.events
    t0 = trace.recording.start_us
    times = np.empty(len(ev) + 1, dtype=np.int64)
    np.maximum.accumulate(ev["time_us"], out=times[1:])
    if t0 is None or (len(ev) and t0 > times[1]):
        t0 = int(times[1]) if len(ev) else 0
    times[0] = t0
    return times


def driver_reserved_bytes(trace: Trace) -> int:
    """Memory the driver keeps that NVML counts as used but CUDA does not report at all.

    NVML's total exceeds ``cudaMemGetInfo``'s total by this much (644,939,776 B on the H200), and
    NVML's "used" includes it. vLLM's target (util × CUDA total) and torch's numbers are in CUDA's
    accounting, so the device-used curve is moved into it. 0 when either total is unknown.
    """
    nvml_total, cuda_total = (trace.facts.get(F.SIDECAR) or {}).get("total_bytes"), trace.process.device_total_bytes
    return max(int(nvml_total) - int(cuda_total), 0) if nvml_total and cuda_total else 0


def others_curve(trace: Trace) -> Curve:
    """Bytes other processes hold on the traced device (empty when not sampled)."""
    o = trace.others
    return Curve(o["time_us"].astype(np.int64), o["others_bytes"].astype(np.int64))


def device_used_curve(trace: Trace) -> Curve:
    """This process's device-used bytes from the NVML samples, in CUDA's accounting: NVML's used minus
    :func:`driver_reserved_bytes` (``total - free`` as ``cudaMemGetInfo`` would report it) minus the
    other processes' memory in force at each sample (their first figure before it was first read).
    One step per sample."""
    s = trace.samples
    t, used = s["time_us"].astype(np.int64), s["used_bytes"].astype(np.int64) - driver_reserved_bytes(trace)
    return Curve(t, used - others_curve(trace).at_each(t, first_before=True))


def _step_curve(times: np.ndarray, deltas: np.ndarray) -> Curve:
    if not len(times):
        return Curve(np.zeros(0, np.int64), np.zeros(0, np.int64))
    order = np.argsort(times, kind="stable")
    t = np.concatenate(([times[order[0]]], times[order])).astype(np.int64)
    b = np.concatenate(([0], np.cumsum(deltas[order]))).astype(np.int64)
    return Curve(t, b)


def sum_curves(a: Curve, b: Curve) -> Curve:
    """The step function ``a + b``: one step at every time either steps (the later of equal times wins)."""
    if not len(b):
        return a
    if not len(a):
        return b
    t = np.union1d(a.time_us, b.time_us)
    return Curve(t, a.at_each(t) + b.at_each(t))


def committed_curve(trace: Trace, *, kv_cache_only: bool = False, address_space: bool = False) -> Curve:
    """Bytes committed through the VMM API and not released, over time (0 before the first record);
    with ``kv_cache_only`` the KV cache's buffer's alone. Empty without records. With ``address_space``: the
    address space reserved (``cuMemAddressReserve`` minus ``cuMemAddressFree``), not memory, the room the
    extensible KV cache may grow into."""
    ops = (RESERVE, FREE_RESERVED) if address_space else (CREATE, RELEASE)
    r = trace.vmm
    ok = (r["error"] == 0) & np.isin(r["op"], ops)
    if kv_cache_only:
        ok &= r["caller"] == _KV_CACHE_CALLER
    r = r[ok]
    sign = np.where(r["op"] == ops[0], 1, -1).astype(np.int64)
    return _step_curve(r["time_us"].astype(np.int64), sign * r["bytes"].astype(np.int64))


def non_torch_curve(used: Curve, reserved: Curve, vmm: Curve) -> Curve:
    """Device used (``used``, :func:`device_used_curve`) minus PyTorch reserved at each NVML sample: CUDA context,
    NCCL, cuBLAS, raw cudaMalloc. Other processes' memory is not in it when it was sampled, nor what vLLM (0.34+)
    committed through CUDA's virtual-memory API for its KV cache (``vmm``): that is the KV cache, counted on its own.
    """
    return Curve(used.time_us, used.bytes - reserved.at_each(used.time_us) - vmm.at_each(used.time_us))


@dataclass(frozen=True)
class Curves:
    """All curves of one trace, computed once and shared by the analyses and renderers.

    ``device_used`` and ``non_torch`` are empty curves when the trace holds no NVML samples; both are
    this process's alone when ``others`` (other processes' memory on the device) was sampled.
    """

    allocated: Curve
    reserved: Curve
    device_used: Curve
    non_torch: Curve
    baseline: Baseline
    others: Curve = Curve(np.zeros(0, np.int64), np.zeros(0, np.int64))
    #: memory committed through CUDA's VMM API (vLLM 0.34's extensible KV cache); empty before 0.34
    vmm: Curve = Curve(np.zeros(0, np.int64), np.zeros(0, np.int64))

    @property
    def has_device(self) -> bool:
        return len(self.device_used) > 0

    @cached_property
    def held(self) -> Curve:
        """What this process holds through PyTorch's allocator and CUDA's VMM API together (reserved +
        committed): the reserved curve itself before vLLM 0.34, where nothing is committed outside torch."""
        return sum_curves(self.reserved, self.vmm)


def all_curves(trace: Trace) -> Curves:
    """Every curve of ``trace`` (one baseline reconstruction, one pass per curve). An analysed rank computes
    them once (``analysis.rank.AnalysedRank.curves``); pass them on to share them."""
    alloc, res = _running_sums(trace, (_ALLOC,), (_FREE_COMPLETED,)), _running_sums(trace, _SEG_UP, _SEG_DOWN)
    base = _baseline(trace, alloc[1:], res[1:])
    for values, start in ((alloc, base.allocated_bytes), (res, base.reserved_bytes)):
        if start:
            values += start
    if state_missing(trace):
        # without the allocator's state, reserved is known only from below: the live tensors sit in segments,
        # so reserved is at least allocated (a history of alloc/free alone would otherwise read 0 B reserved)
        np.maximum(res, alloc, out=res)
    times = _curve_times(trace)
    reserved, vmm, used = Curve(times, res), committed_curve(trace), device_used_curve(trace)
    return Curves(
        allocated=Curve(times, alloc),
        reserved=reserved,
        device_used=used,
        non_torch=non_torch_curve(used, reserved, vmm),
        baseline=base,
        others=others_curve(trace),
        vmm=vmm,
    )
