"""Memory vLLM commits through CUDA's virtual-memory API, outside PyTorch's allocator: pure functions.

From vLLM 0.34 the KV cache is, by default, an extensible one whose physical pages are created with
``cuMemCreate`` and released with ``cuMemRelease`` (``model.VMM_DTYPE`` records, written by
``plugins.vllm_vmm``). Neither PyTorch's history nor its reserved counter sees that memory; NVML does.
So:

- **committed** (``curves.committed_curve``): bytes created and not yet released, failed calls left out, one
  step per record. It is exact: each step is one driver call, with the bytes vLLM asked for.
- the **KV cache committed outside PyTorch** is the part made by the KV cache's buffer
  (``caller == "kv_cache"``); vLLM's one-granule check that the API works (``"probe"``) and anything
  else are committed memory too, briefly, but not the KV cache.
- **address space** reserved with ``cuMemAddressReserve`` is not memory: kept apart.
- a **failed create** (``error != 0``; CUDA_ERROR_OUT_OF_MEMORY is 2) is where an extensible KV cache ran
  out of memory; vLLM empties PyTorch's cache and retries once (``_map_chunk_at``), so a failure followed
  by a successful create of the same size is a recovered one.

Non-PyTorch memory (``curves.non_torch_curve``) subtracts the committed curve. This module holds the failed
commits, the KV cache's live chunks and the summary every output shows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from memtrace.analysis.memory.curves import CREATE, RELEASE, committed_curve
from memtrace.analysis.memory.phases import path_at
from memtrace.model import VMM_CALLERS, Trace

KV_CACHE = VMM_CALLERS.index("kv_cache")
#: CUDA_ERROR_OUT_OF_MEMORY
OUT_OF_MEMORY = 2


def has_vmm(trace: Trace) -> bool:
    """Whether the trace holds any virtual-memory call (vLLM 0.34+ with the extensible KV cache)."""
    return len(trace.vmm) > 0


@dataclass(frozen=True)
class FailedCommit:
    """A ``cuMemCreate`` that failed: when, how many bytes, in which phase, and whether vLLM's retry
    (after emptying PyTorch's cache) committed them after all."""

    time_us: int
    bytes: int
    error: int
    phase: str
    kv_cache: bool
    recovered: bool

    @property
    def out_of_memory(self) -> bool:
        return self.error == OUT_OF_MEMORY


def failed_commits(trace: Trace) -> list[FailedCommit]:
    """Every failed create, in time order."""
    r = trace.vmm
    creates = r[r["op"] == CREATE]
    out = []
    for i in np.flatnonzero(creates["error"] != 0):
        rec, later = creates[i], creates[i + 1 :]
        retry = later[(later["bytes"] == rec["bytes"]) & (later["caller"] == rec["caller"])][:1]
        t, recovered = int(rec["time_us"]), bool(len(retry) and retry["error"][0] == 0)
        phase, kv_cache = path_at(trace, t), bool(rec["caller"] == KV_CACHE)
        out.append(FailedCommit(t, int(rec["bytes"]), int(rec["error"]), phase, kv_cache, recovered))
    return out


@dataclass(frozen=True)
class Chunk:
    """One chunk of the KV cache committed through the VMM API (a successful ``cuMemCreate``), live at a
    moment: when it was created, its bytes and the Python stack that created it (-1: none taken)."""

    time_us: int
    bytes: int
    stack: int
    handle: int


def live_kv_chunks(trace: Trace, t_us: int) -> list[Chunk]:
    """The KV cache's chunks committed at ``t_us`` (created at or before it, not released at or before it),
    in creation order: their bytes add up to ``committed_curve(trace, kv_cache_only=True).at(t_us)``."""
    r = trace.vmm
    r = r[(r["error"] == 0) & (r["caller"] == KV_CACHE) & (r["time_us"] <= t_us)]
    live: dict[int, Chunk] = {}
    for rec in r[np.argsort(r["time_us"], kind="stable")]:
        h = int(rec["handle"])
        if rec["op"] == CREATE:
            live[h] = Chunk(int(rec["time_us"]), int(rec["bytes"]), int(rec["stack"]), h)
        elif rec["op"] == RELEASE:
            live.pop(h, None)
    return list(live.values())


@dataclass(frozen=True)
class VmmSummary:
    """What the VMM records add up to: the KV cache committed outside PyTorch at the end and at its most,
    the address space reserved for it, how many chunks were created and released, what failed."""

    kv_cache_bytes: int  # committed by the KV cache's buffer at the end of the recording
    kv_cache_peak_bytes: int
    committed_bytes: int  # everything committed through the API at the end (KV cache, probe, other)
    reserved_bytes: int  # address space reserved at the end
    reserved_peak_bytes: int
    creates: int
    releases: int
    failures: tuple[FailedCommit, ...]


def summary(trace: Trace) -> VmmSummary | None:
    """None for a trace without VMM records."""
    if not has_vmm(trace):
        return None
    kv = committed_curve(trace, kv_cache_only=True)
    every = committed_curve(trace)
    res = committed_curve(trace, address_space=True)
    ok = trace.vmm[trace.vmm["error"] == 0]
    return VmmSummary(
        kv_cache_bytes=int(kv.bytes[-1]) if len(kv) else 0,
        kv_cache_peak_bytes=kv.peak_bytes,
        committed_bytes=int(every.bytes[-1]) if len(every) else 0,
        reserved_bytes=int(res.bytes[-1]) if len(res) else 0,
        reserved_peak_bytes=res.peak_bytes,
        creates=int((ok["op"] == CREATE).sum()),
        releases=int((ok["op"] == RELEASE).sum()),
        failures=tuple(failed_commits(trace)),
    )
