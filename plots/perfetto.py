"""Chrome / Perfetto trace-event JSON: open a memtrace run in ui.perfetto.dev (or chrome://tracing).

The file follows the Trace Event Format (``{"traceEvents": [...]}``):

- one *process* per traced process (``pid``: its pid, or its position when pids collide), named
  ``rank 0 (pid 1234)`` by an ``M`` (metadata) event;
- *counter* tracks (``ph: "C"``), one per curve, each with a single numeric arg ``bytes``:
  ``allocated``, ``reserved``, with NVML samples ``device used`` and ``non-PyTorch`` (this process's),
  ``other processes`` when NVML's per-process list was sampled, and ``target`` (the resolved target,
  ``analysis.target``). Only
  changes are written (the last value of each microsecond), so the file stays exact and small.
  ``non-PyTorch`` is the analysis' steady curve (``landmarks.steady_non_torch``: NVML samples taken
  while reserved moved are not used), the figure ``report`` gives, not the raw used - reserved that
  spikes by whole allocations when the sidecar's clock and the allocator's disagree; with CUPTI
  records, ``non-PyTorch seen by CUPTI`` (``non_torch.live_curve``: the exact part of it); from vLLM
  0.34, ``KV cache (CUDA VMM)``, the KV cache committed through CUDA's VMM API outside PyTorch
  (``AnalysedRank.vmm_kv``: not in ``reserved``, nor in ``non-PyTorch``), and apart from memory the
  ``VMM address space reserved (not memory)`` (``AnalysedRank.vmm_address_space``). A counter with no
  point is not written: a trace before 0.34 has neither;
- *slices* (``ph: "X"``, ``ts``/``dur`` in microseconds): phases on the "phases" thread (tid 1,
  properly nested), hooked calls on the "hook calls" thread (tid 2) with their bytes and arguments,
  and the OOM, when there was one (``analysis.oom.find_oom``: a live record or an imported ``oom``
  entry), on the "events" thread (tid 3), with instants for the reserved peak and the first crossing
  of the target (``AnalysedRank.peak``, ``analysis.crossing``): the figures ``report`` states.

The file is streamed: counter points are formatted in chunks straight to the output, so a trace of
ten million events never holds its JSON in memory.

Timestamps are microseconds since the run's time origin (``analysis.origin``: ``otherData.t0_us`` holds
that moment as Unix-epoch microseconds on the driver's clock, ``otherData.time_origin`` the sentence every
output states, with each rank's shift onto that clock), so every process shares one time axis. The input is
an analysed run (``analysis.run.AnalysedRun``): every figure is its ranks'.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
from memtrace.analysis.analysed.landmarks import steady_non_torch
from memtrace.analysis.holders.flame import hook_short_name
from memtrace.analysis.memory import quantities as Q
from memtrace.analysis.memory.curves import Curve
from memtrace.model import Trace

PHASES_TID = 1
HOOKS_TID = 2
EVENTS_TID = 3
COUNTERS = (
    "allocated",
    "reserved",
    "device used",
    Q.NON_TORCH.label,
    f"{Q.NON_TORCH.label} seen by CUPTI",
    Q.OTHERS.label,
    "target",
    "KV cache (CUDA VMM)",
    "VMM address space reserved (not memory)",
)


def _changes(curve: Curve) -> tuple[np.ndarray, np.ndarray]:
    """The curve reduced to its last value per microsecond, then to the points where it changes."""
    t, b = curve.time_us, curve.bytes
    if len(t) == 0:
        return t, b
    last = np.ones(len(t), dtype=bool)
    last[:-1] = t[1:] != t[:-1]
    t, b = t[last], b[last]
    keep = np.ones(len(t), dtype=bool)
    keep[1:] = b[1:] != b[:-1]
    return t[keep], b[keep]


def _pids(traces: list[Trace]) -> list[int]:
    pids = [t.process.pid for t in traces]
    if len(set(pids)) == len(pids) and all(p > 0 for p in pids):
        return pids
    return list(range(1, len(traces) + 1))


def _json_safe(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


#: counter points per string written: ~800 kB stays in the CPU's caches (65,536, 6 MB strings each freshly mapped,
#: took 40% more CPU at 3M events)
CHUNK = 1 << 13


def _records(run, progress=None) -> Iterator[str]:
    """Every trace event of an analysed run as JSON text, metadata first; counter points come in chunks of
    :data:`CHUNK` records joined by ``,\\n``. ``progress.advance()`` is called once per rank."""
    t0 = run.origin.t0_us
    for rank, pid in zip(run.ranks, _pids(run.traces), strict=True):
        trace = rank.trace
        for ev in _metadata(trace, pid):
            yield _dumps(ev)
        yield from _counters(rank, pid, t0)
        for ev in (
            *_phase_slices(rank, pid, t0),
            *_hook_slices(trace, pid, t0),
            *_oom_slice(rank, pid, t0),
            *_landmarks(rank, pid, t0),
        ):
            yield _dumps(ev)
        if progress is not None:
            progress.advance()


def _dumps(ev: dict[str, Any]) -> str:
    return json.dumps(ev, separators=(",", ":"))


def _metadata(trace: Trace, pid: int) -> Iterator[dict[str, Any]]:
    label = trace.label if trace.process.rank is None else f"{trace.label} (pid {trace.process.pid})"
    yield {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": label}}
    for tid, name in ((PHASES_TID, "phases"), (HOOKS_TID, "hook calls"), (EVENTS_TID, "events")):
        yield {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}
        yield {"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}}


def _oom_slice(rank, pid: int, t0: int) -> Iterator[dict[str, Any]]:
    oom = rank.oom
    if oom is None:
        return
    args = {k: v for k, v in dataclasses.asdict(oom).items() if isinstance(v, (int, str)) and v is not None}
    yield {"name": "CUDA OOM", "cat": "oom", "ph": "X", "ts": oom.time_us - t0, "dur": 0,
           "pid": pid, "tid": EVENTS_TID, "args": args}  # fmt: skip


def _target_curve(rank) -> Curve:
    if rank.target.target_bytes is None:
        return Curve(np.zeros(0, np.int64), np.zeros(0, np.int64))
    start, end = rank.span
    return Curve(np.array([start, end], np.int64), np.array([rank.target.target_bytes] * 2, np.int64))


_EMPTY = Curve(np.zeros(0, np.int64), np.zeros(0, np.int64))


def _counters(rank, pid: int, t0: int) -> Iterator[str]:
    curves = rank.curves
    series = (
        curves.allocated,
        curves.reserved,
        curves.device_used,
        steady_non_torch(curves),
        rank.cupti if rank.cupti is not None else _EMPTY,
        curves.others,
        _target_curve(rank),
        rank.vmm_kv,
        rank.vmm_address_space,
    )
    for name, curve in zip(COUNTERS, series, strict=True):
        t, b = _changes(curve)
        fmt = f'{{"name":"{name}","ph":"C","ts":%d,"pid":{pid},"tid":0,"args":{{"bytes":%d}}}}'
        for lo in range(0, len(t), CHUNK):  # one % of the whole chunk: one per point took 1.7x as long
            pairs = np.column_stack((t[lo : lo + CHUNK] - t0, b[lo : lo + CHUNK])).ravel().tolist()
            yield ",\n".join([fmt] * (len(pairs) // 2)) % tuple(pairs)


def _landmarks(rank, pid: int, t0: int) -> Iterator[dict[str, Any]]:
    """Instant events for the figures ``report`` states: the reserved peak and the first crossing."""
    if rank.recorded_nothing:
        return
    peak = rank.peak
    yield {"name": "peak reserved", "cat": "landmark", "ph": "i", "s": "p", "ts": peak.time_us - t0, "pid": pid,
           "tid": EVENTS_TID, "args": {"reserved_bytes": peak.reserved_bytes, "allocated_bytes": peak.allocated_bytes,
                                        "phase": peak.phase_path}}  # fmt: skip
    first, target = rank.first_crossing, rank.target
    if first is not None:
        args = {"curve": first.curve, "target_bytes": first.target_bytes, "bytes_at_crossing": first.at_cross_bytes,
                "max_bytes": first.max_bytes, "overshoot_bytes": first.overshoot_bytes, "phase": first.phase_path,
                "target_source": target.source}  # fmt: skip
        yield {"name": "first crossing of the target", "cat": "landmark", "ph": "i", "s": "p",
               "ts": first.time_us - t0, "pid": pid, "tid": EVENTS_TID, "args": args}  # fmt: skip


def _phase_slices(rank, pid: int, t0: int) -> Iterator[dict[str, Any]]:
    trace = rank.trace
    _, end_of_trace = rank.span
    spans = []
    for p in trace.phases:
        end = p.end_us if p.end_us is not None else max(end_of_trace, p.start_us)
        spans.append((p.start_us, -(end - p.start_us), p, end))
    spans.sort(key=lambda s: (s[0], s[1]))  # parents (longer) before children that start with them
    for start, _, p, end in spans:
        args = {"source": p.source, "ended": p.end_us is not None}
        yield {"name": p.name, "cat": "phase", "ph": "X", "ts": start - t0, "dur": end - start,
               "pid": pid, "tid": PHASES_TID, "args": args}  # fmt: skip


def _hook_slices(trace: Trace, pid: int, t0: int) -> Iterator[dict[str, Any]]:
    for c in sorted(trace.hook_calls, key=lambda c: (c.start_us, -(c.end_us - c.start_us))):
        args: dict[str, Any] = {"args": _json_safe(c.args)}
        for key in ("returned_bytes", "allocated_delta_bytes", "reserved_delta_bytes", "error"):
            if getattr(c, key) is not None:
                args[key] = getattr(c, key)
        yield {"name": hook_short_name(c.name), "cat": "hook", "ph": "X", "ts": c.start_us - t0,
               "dur": max(0, c.end_us - c.start_us), "pid": pid, "tid": HOOKS_TID,
               "args": {"function": c.name, **args}}  # fmt: skip


def write_perfetto(run, out: IO[str], progress=None) -> int:
    """Stream the Trace Event JSON of an analysed run to ``out``; returns the number of records written
    (a chunk of counter points counts as one)."""
    origin = run.origin
    out.write('{"displayTimeUnit": "ms", "otherData": ')
    other = {"producer": "memtrace", "t0_us": origin.t0_us, "units": "bytes, microseconds since t0_us",
             "time_origin": origin.sentence, "worst": run.worst.label, "verdict": run.verdict,
             "shifts": [dataclasses.asdict(s) for s in origin.shifts],
             "missing": [m.line for m in run.missing]}  # fmt: skip
    out.write(json.dumps(other))
    out.write(', "traceEvents": [\n')
    n = 0
    for text in _records(run, progress):
        if n:
            out.write(",\n")
        out.write(text)
        n += 1
    out.write("\n]}\n")
    return n


def export_perfetto(run, path: str | os.PathLike, progress=None) -> Path:
    """Write an analysed run to ``path`` as Perfetto / Chrome trace JSON."""
    out = Path(path)
    with open(out, "w", encoding="utf-8") as f:
        write_perfetto(run, f, progress)
    return out


def render(run, out: str | os.PathLike, *, progress=None) -> None:
    """The render protocol's entry (``plots.render``): :func:`export_perfetto`."""
    export_perfetto(run, out, progress)
