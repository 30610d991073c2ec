"""What held the device at a serving window's end (the OOM, when the process died in it), and how each holder
changed since start-up ended: one answer for the report, the issue bundle and the view.

At each of the two moments, in bytes:

- PyTorch, from the allocator state saved then (``Trace.segments`` at start-up's end, ``ServingWindow.segments``
  at the window's write), in the terms of torch's own OOM message (:class:`AllocatorState`): allocated (blocks),
  the private pools' cached blocks, reserved but unallocated; their sum is PyTorch reserved;
- the KV cache vLLM committed outside PyTorch (CUDA VMM), exact from the recorded calls;
- the whole device's used memory (:data:`quantities.DEVICE_USED_ALL`): at an OOM, CUDA's total less the free bytes
  torch's OOM observer was given (exact at that moment, the figure torch's message prints); else the last NVML
  sample, in CUDA's accounting (``curves.driver_reserved_bytes``);
- other processes' memory (:data:`quantities.OTHERS`): their series' last sample (the start-up sidecar's, the
  window's own from format 1.5); this process's non-PyTorch memory is then the rest (:data:`quantities.NON_TORCH`:
  device used by this process - reserved - VMM), or, in a window that sampled the whole device only, the other
  way round (:data:`DERIVED`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from memtrace.analysis.memory.curves import committed_curve, driver_reserved_bytes
from memtrace.analysis.memory.oom import Oom
from memtrace.model import Segment, Trace

#: How other processes' memory at a window's end is known when the window did not sample it (format 1.4).
DERIVED = (
    "this window sampled the whole device only (trace format 1.4): this process's non-PyTorch memory is taken "
    "as at start-up's end, and other processes' memory is the rest of the device's used memory"
)


@dataclass(frozen=True)
class AllocatorState:
    """PyTorch's caching allocator at one moment, from its saved state, as torch's OOM message counts it."""

    reserved_bytes: int  # quantities.RESERVED
    allocated_bytes: int  # quantities.ALLOCATED (the requests)
    blocks_bytes: int  # quantities.ALLOCATED_BLOCKS (torch's allocated_bytes: active blocks)
    private_cached_bytes: int  # quantities.PRIVATE_POOL_CACHED

    @property
    def reserved_unused_bytes(self) -> int:
        """:data:`quantities.RESERVED_UNUSED`: torch's "reserved by PyTorch but unallocated"."""
        return self.reserved_bytes - self.blocks_bytes - self.private_cached_bytes


def allocator_state(segments: list[Segment]) -> AllocatorState | None:
    """The allocator's figures from its saved segments (None when none were saved)."""
    if not segments:
        return None
    return AllocatorState(
        reserved_bytes=sum(s.total_bytes for s in segments),
        allocated_bytes=sum(s.requested_bytes for s in segments),
        blocks_bytes=sum(b.size_bytes for s in segments for b in s.blocks if b.state == "active_allocated"),
        private_cached_bytes=sum(
            b.size_bytes for s in segments if s.pool_id != "0,0" for b in s.blocks if b.state == "inactive"
        ),
    )


@dataclass(frozen=True)
class Holders:
    """What held the device at one moment (bytes; None where not known)."""

    time_us: int
    allocator: AllocatorState | None
    vmm_bytes: int  # quantities.VMM
    used_all_bytes: int | None  # quantities.DEVICE_USED_ALL
    others_bytes: int | None  # quantities.OTHERS (sampled, or derived: ``DeviceAtEnd.derived``)
    non_torch_bytes: int | None  # quantities.NON_TORCH
    free_bytes: int | None  # quantities.DEVICE_FREE

    @property
    def this_process_bytes(self) -> int | None:
        """:data:`quantities.DEVICE_USED`: PyTorch reserved + VMM + non-PyTorch."""
        if self.allocator is None or self.non_torch_bytes is None:
            return None
        return self.allocator.reserved_bytes + self.vmm_bytes + self.non_torch_bytes


@dataclass(frozen=True)
class DeviceAtEnd:
    """What held the device at a serving window's end and at start-up's end (:func:`device_at_end`)."""

    end: Holders  # at the OOM when the process died in the window, else at the window's last write
    startup_end: Holders
    at_oom: bool
    #: "" when other processes were sampled at both moments, else :data:`DERIVED`
    derived: str = ""
    #: the failed request fitted the allocator's limit (PyTorch reserved + the request <= the limit): the device
    #: ran out, not the limit (False: the limit refused it); None without an OOM with a limit below the device
    within_limit: bool | None = None
    #: the allocator's limit the failed request met, when below the device (``Oom.limit_bytes``); else None
    limit_bytes: int | None = None

    def change(self, of) -> int | None:
        """``of(holders)`` at the end minus at start-up's end (None when either is unknown)."""
        a, b = of(self.end), of(self.startup_end)
        return None if a is None or b is None else a - b


def _last(series: np.ndarray, key: str, t_us: int, less: int = 0) -> int | None:
    """``series[key]``'s last sample at or before ``t_us``, less ``less`` (None before its first)."""
    i = int(np.searchsorted(series["time_us"], t_us, side="right")) - 1
    return int(series[key][i]) - less if i >= 0 else None


def _holders(trace: Trace, t_us: int, state: AllocatorState | None, vmm: int, used_all: int | None,
             others: int | None, non_torch: int | None = None, free: int | None = None) -> Holders:  # fmt: skip
    """The holders at ``t_us`` (``state`` the allocator's then, ``vmm`` the KV cache committed outside it):
    non-PyTorch from the device's used memory when others are known, else ``non_torch`` given (and others derived
    from it); ``free`` when known, else the device's total less used."""
    total = trace.process.device_total_bytes
    if free is None and used_all is not None and total:
        free = total - used_all
    if state is not None and used_all is not None:
        rest = used_all - state.reserved_bytes - vmm  # non-PyTorch and other processes together
        if others is not None:
            non_torch = rest - others
        elif non_torch is not None:
            others = rest - non_torch
    return Holders(t_us, state, vmm, used_all, others, non_torch if others is not None else None, free)


def device_at_end(trace: Trace, oom: Oom | None) -> DeviceAtEnd | None:
    """What held the device at ``trace``'s serving window's end (``oom``: the OOM the process died of in the window,
    None when it did not die there) and at start-up's end; None without a window, or without the allocator's state
    at both moments."""
    w = trace.window
    if w is None or w.startup_end_us is None or w.end_us is None or not w.segments or not trace.segments:
        return None
    reserve, total = driver_reserved_bytes(trace), trace.process.device_total_bytes
    t0, vmm = w.startup_end_us, committed_curve(trace).at
    used0, others0 = _last(trace.samples, "used_bytes", t0, reserve), _last(trace.others, "others_bytes", t0)
    start = _holders(trace, t0, allocator_state(trace.segments), vmm(t0), used0, others0)
    at_oom = oom is not None
    t1 = oom.time_us if at_oom else w.end_us
    if at_oom and oom.free_bytes is not None and total:
        used1 = total - oom.free_bytes  # what torch's message says: "of which ... is free"
    else:
        used1 = _last(w.samples, "used_bytes", t1, reserve)
    others1 = _last(w.others, "others_bytes", t1)
    derived = others1 is None and start.non_torch_bytes is not None
    free1, non_torch1 = oom.free_bytes if at_oom else None, start.non_torch_bytes if derived else None
    end = _holders(trace, t1, allocator_state(w.segments), vmm(t1), used1, others1, non_torch1, free1)
    limit = oom.limit_bytes(total) if at_oom and total else None  # a limit below the device, known to be one
    within = (
        None if limit is None or end.allocator is None else end.allocator.reserved_bytes + oom.requested_bytes <= limit
    )
    return DeviceAtEnd(end, start, at_oom, DERIVED if derived else "", within, limit)


@dataclass(frozen=True)
class Room:
    """What would have left room for the request a serving OOM failed, where the device itself ran out (:func:`room`):
    the serving question, not start-up's "would it boot"."""

    short_bytes: int  # the request less the device's free bytes: what any holder would have had to hold less
    others_growth_bytes: int | None  # other processes since start-up ended (derived in a format 1.4 window)
    own_growth_bytes: int | None  # this process since start-up ended
    startup_free_bytes: int | None  # the device's free memory when start-up ended (vLLM had sized its KV cache)
    util: float | None  # the recorded --gpu-memory-utilization
    #: the highest utilization, in hundredths, whose target is at least ``short_bytes`` lower (room for this
    #: request), and the one leaving room for the other processes' growth as well; None without ``util``
    util_for_request: float | None
    util_for_others: float | None
    #: what ``util_for_request`` keeps out of the KV cache beside the recorded utilization (None without it)
    kept_bytes: int | None = None


def room(ws_device: DeviceAtEnd | None, oom: Oom | None, util: float | None, total: int | None) -> Room | None:
    """What would have left room for ``oom``'s request (None unless the device ran out at it: fewer bytes free than
    asked for). vLLM sizes its KV cache to ``util`` x the device's memory (``total``) at start-up; a utilization
    lower by a fraction ``d`` keeps ``d`` x ``total`` out of it, rounded here down to hundredths as the flag is
    usually given."""
    d = ws_device
    if d is None or oom is None or not d.at_oom or not oom.device_ran_out:
        return None
    short = oom.requested_bytes - oom.free_bytes
    others = d.change(lambda h: h.others_bytes)

    def lower(by: int) -> float | None:
        return math.floor((util - by / total) * 100) / 100 if util and total else None

    for_request = lower(short)
    return Room(
        short_bytes=short,
        others_growth_bytes=others,
        own_growth_bytes=d.change(lambda h: h.this_process_bytes),
        startup_free_bytes=d.startup_end.free_bytes,
        util=util,
        util_for_request=for_request,
        util_for_others=lower(short + others) if others is not None and others > 0 else None,
        kept_bytes=None if for_request is None else round((util - for_request) * total),
    )
