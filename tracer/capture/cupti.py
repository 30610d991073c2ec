"""The optional CUPTI source: every device allocation and release the CUDA driver makes for this process.

Off by default; on with ``MEMTRACE_CUPTI=1`` (every session of the process, the vLLM plugin's too) or
``memtrace.start(..., cupti=True)``. It needs NVIDIA's ``cupti-python`` (``pip install
memtrace-vllm[cupti]``); without it one log line and a note in the trace say the source is off, and
memtrace records as before.

Two CUPTI mechanisms, both from ``cupti.cupti``:

- the **activity API**: ``activity_enable(ActivityKind.MEMORY2)`` delivers one ``ActivityMemory4``
  record per allocation and release (address, bytes, memory kind, operation, a nanosecond timestamp,
  process id, device id, correlation id), PyTorch's own ``cudaMalloc`` of segments included. Records
  arrive in buffers (``activity_register_callbacks``); their fields are copied out inside the
  buffer-completed callback, since a record object kept past interpreter shutdown raises in its
  ``__dealloc__``. ``activity_flush_all`` forces delivery at every drain and at close.
- the **callback API** (``subscribe`` + ``enable_callback`` on the runtime and driver domains, for
  the allocation and module-load functions only): at ``API_ENTER``, in the calling thread, the
  Python stack is taken and kept under the call's correlation id; a record with that correlation id
  gets it (interned through the session like the allocator's stacks). So ``cudaMalloc`` from a
  kernel library has the Python line that caused it. CUPTI allows one subscriber per process: when
  another tool holds it, records come without stacks and a note says so.

**The callback API and PyTorch's allocator.** PyTorch's caching allocator holds its mutex across
``cudaMalloc`` with the GIL released; a Python API callback there waits for the GIL. Any thread that holds
the GIL while it waits for that mutex (``torch.cuda.memory_stats``, ``_snapshot``, ``empty_cache`` from
another thread) then deadlocks the process: on the H200 (torch 2.11, cupti-python 13.0.1)
``tests/gpu/check_cupti.py`` hung in its first ``torch.empty`` while memtrace's drain watchdog read the
allocator's counters. So while the callbacks are on the session starts no watchdog (drains happen at
phase boundaries and at close, on the traced thread), and the callbacks stay opt-in
(``MEMTRACE_CUPTI_STACKS=1``): a program whose other threads call those functions while one thread
allocates can still deadlock, which memtrace cannot rule out from Python (a C-level callback could).
Activity records alone (no stacks) are delivered on CUPTI's own thread and take no allocator lock.

**CUPTI's own device memory.** Enabling the records costs the process 12,582,912 B of device memory on
the H200 (CUDA 13.0, cupti-python 13.0.1), in three 4 MiB steps within 50 ms; vLLM then sizes its KV
cache 1,536 tokens smaller. No activity attribute changes it (``tests/gpu/check_cupti_buffers.py``: the
device-buffer size, pre-allocation, pool limit, graph and CDP buffer sizes, pinned host buffers: 12,582,912 B
every time). ``facts["cupti"]["started_us"]`` says when memtrace began enabling the records, so that
``analysis.non_torch`` can name that growth; the source stays off by default.

Every callback catches its own errors (logged once, counted in ``facts["cupti"]``): a CUDA call is
never failed by memtrace. Records' timestamps are Unix-clock nanoseconds on CUDA 13 (measured on the
H200); when CUPTI's clock is found off the Unix clock by more than a second at start, the offset is
applied. Stored as ``Trace.device_allocs`` (format 1.2); ``analysis.non_torch`` reads them.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from memtrace.capture import pystack
from memtrace.model import DEVICE_ALLOC_DTYPE, MEMORY_KINDS, MEMORY_OPS
from memtrace.store import DISTRIBUTION

log = logging.getLogger("memtrace")

ENV = "MEMTRACE_CUPTI"
STACKS_ENV = "MEMTRACE_CUPTI_STACKS"  # the callback API (Python stacks): see the module docstring
OFF_NOTE = f"CUPTI source off: pip install {DISTRIBUTION}[cupti]"
#: Said once when the source starts: it changes what the traced program sees.
ON_NOTE = (
    "CUPTI source on: CUPTI itself takes device memory (12,582,912 B on the H200), which a vLLM started "
    "with it counts as non-PyTorch memory: its KV cache comes out that much smaller (diff calls such runs "
    "not comparable with runs without CUPTI)"
)
#: Bytes of one activity buffer handed to CUPTI (a MEMORY2 record is ~100 bytes).
BUFFER_BYTES = 1 << 20
#: Allocation and module-load functions whose calls get a Python stack (names missing in a CUPTI
#: version are skipped).
RUNTIME_CBIDS = (
    "cudaMalloc_v3020",
    "cudaMallocPitch_v3020",
    "cudaMalloc3D_v3020",
    "cudaMallocManaged_v6000",
    "cudaMallocAsync_v11020",
    "cudaMallocAsync_ptsz_v11020",
    "cudaMallocFromPoolAsync_v11020",
    "cudaMallocFromPoolAsync_ptsz_v11020",
)
DRIVER_CBIDS = (
    "cuMemAlloc_v2",
    "cuMemAllocPitch_v2",
    "cuMemAllocManaged",
    "cuMemAllocAsync",
    "cuMemAllocAsync_ptsz",
    "cuMemAllocFromPoolAsync",
    "cuMemAllocFromPoolAsync_ptsz",
    "cuMemCreate",
    "cuModuleLoad",
    "cuModuleLoadData",
    "cuModuleLoadDataEx",
    "cuModuleLoadFatBinary",
    "cuLibraryLoadData",
    "cuLibraryLoadFromFile",
)
_THIS_FILE = pystack.own_file(__file__)


def wanted(explicit: bool | None) -> bool:
    """Whether a session turns the source on: ``cupti=`` when given, else ``MEMTRACE_CUPTI=1``."""
    if explicit is not None:
        return bool(explicit)
    return os.environ.get(ENV, "").strip().lower() in ("1", "true", "yes", "on")


def import_cupti() -> Any:
    """NVIDIA's ``cupti.cupti`` module (ImportError without ``cupti-python``). Tests replace this."""
    from cupti import cupti as api

    return api


def python_frames(skip: int = 2) -> tuple[tuple[str, int, str], ...]:
    """The calling thread's Python stack, innermost first, this module's frames left out (:mod:`.pystack`)."""
    return pystack.python_frames(skip, (_THIS_FILE,))


class CuptiSource:
    """One session's CUPTI source. ``api`` is ``cupti.cupti`` (or a test's ``FakeCupti``).

    ``intern_stack(frames) -> int`` and ``on_records(array)`` are the session's; ``add_note(level, text)``
    stores a note. Records are written at :meth:`flush` (drains, close), never inside a CUDA call.
    """

    def __init__(
        self,
        api: Any,
        *,
        intern_stack: Callable[[Any], int],
        on_records: Callable[[np.ndarray], None],
        add_note: Callable[[str, str], None],
    ):
        self.api = api
        self._intern_stack = intern_stack
        self._on_records = on_records
        self._add_note = add_note
        self._lock = threading.Lock()
        self._pending: list[tuple[int, ...]] = []
        self._stacks: dict[int, tuple[tuple[str, int, str], ...]] = {}
        self._old_keys: set[int] = set()
        self._subscriber: Any = None
        self._errors: dict[str, int] = {}
        self._logged: set[str] = set()
        self.active = False  # recording now
        self.started = False  # recorded in this session (``facts["cupti"]["on"]``, also after stop)
        self.pid = os.getpid()  # a forked child's CUDA calls are not this process's
        self.records = 0
        self.with_stack = 0
        self.offset_ns = 0
        self.stacks_on = False
        self.started_us: int | None = None  # Unix µs when memtrace began enabling the records
        self._kind_codes = self._codes(getattr(api, "ActivityMemoryKind", None), MEMORY_KINDS)
        self._op_codes = self._codes(getattr(api, "ActivityMemoryOperationType", None), MEMORY_OPS)

    @staticmethod
    def _codes(enum: Any, names: tuple[str, ...]) -> dict[int, int]:
        """CUPTI's enum values -> memtrace's codes, by name (so the stored codes never follow CUPTI's)."""
        out = {}
        for code, name in enumerate(names):
            member = getattr(enum, name.upper(), None) if enum is not None else None
            if member is not None:
                out[int(member)] = code
        return out

    # -- life ----------------------------------------------------------------------------------
    def start(self) -> None:
        """Enable MEMORY2 records and the allocation callbacks. Raises what CUPTI raises (the caller
        turns it into a note)."""
        api = self.api
        self._measure_clock()
        # before enabling: CUPTI takes its own device memory inside activity_register_callbacks /
        # activity_enable (three 4 MiB steps 16 ms before that call returned, on the H200)
        self.started_us = time.time_ns() // 1000
        _route(self)
        if api not in _registered:  # once per process: later sessions reuse the same callbacks
            api.activity_register_callbacks(_buffer_requested, _buffer_completed)
            _registered.append(api)
        api.activity_enable(api.ActivityKind.MEMORY2)
        self.active = self.started = True
        if os.environ.get(STACKS_ENV, "").strip().lower() not in ("1", "true", "yes", "on"):
            self._add_note("info", "CUPTI: records without Python stacks (the callback API deadlocks with "
                           f"PyTorch's allocator; {STACKS_ENV}=1 turns it on at that risk)")  # fmt: skip
            return
        try:
            self._subscribe()
        except Exception as exc:  # another tool holds the one subscriber: records without stacks
            self._subscriber = None
            text = f"CUPTI: no Python stacks for non-PyTorch allocations (subscribe failed: {exc})"
            log.warning("memtrace: %s", text)
            self._add_note("warning", text)

    def _subscribe(self) -> None:
        api = self.api
        self._subscriber = api.subscribe(_api_callback, None)
        for domain, names, enum in (
            (api.CallbackDomain.RUNTIME_API, RUNTIME_CBIDS, api.runtime_api_trace_cbid),
            (api.CallbackDomain.DRIVER_API, DRIVER_CBIDS, api.driver_api_trace_cbid),
        ):
            for name in names:
                cbid = getattr(enum, name, None)
                if cbid is not None:
                    api.enable_callback(1, self._subscriber, domain, cbid)
        self.stacks_on = True

    def _measure_clock(self) -> None:
        try:
            offset = time.time_ns() - int(self.api.get_timestamp())
        except Exception as exc:  # noqa: BLE001
            self._error("get_timestamp", exc)
            return
        self.offset_ns = offset if abs(offset) > 1_000_000_000 else 0

    def stop(self) -> None:
        """Deliver what CUPTI still holds, then turn everything off (records after this are dropped)."""
        if not self.active:
            return
        self.flush()
        api = self.api
        self.active = False
        for what, call in (
            ("activity_disable", lambda: api.activity_disable(api.ActivityKind.MEMORY2)),
            ("unsubscribe", lambda: self._subscriber is not None and api.unsubscribe(self._subscriber)),
        ):
            try:
                call()
            except Exception as exc:  # noqa: BLE001
                self._error(what, exc)
        self._subscriber = None
        _route(None)

    def fact(self) -> dict[str, Any]:
        """``facts["cupti"]``: ``on`` says the source recorded in this trace (``active``: still recording)."""
        return {
            "on": self.started,
            "active": self.active,
            "version": getattr(self.api, "__version__", None) or _dist_version(),
            "records": self.records,
            "records_with_stack": self.with_stack,
            "stacks": self.stacks_on,
            "clock_offset_ns": self.offset_ns,
            "started_us": self.started_us,
            "errors": dict(self._errors),
        }

    # -- flushing ------------------------------------------------------------------------------
    def flush(self) -> int:
        """Make CUPTI deliver every record, then write them; returns how many were written."""
        if not self.active:
            return 0
        try:
            self.api.activity_flush_all(int(getattr(self.api.ActivityFlag, "FLUSH_FORCED", 1)))
        except Exception as exc:  # noqa: BLE001
            self._error("activity_flush_all", exc)
        with self._lock:
            pending, self._pending = self._pending, []
            stacks = self._stacks
            # a call whose record did not come by the flush after the one that saw it never will
            # (a failed cudaMalloc makes none): forget it
            for key in self._old_keys:
                stacks.pop(key, None)
            matched = [stacks.pop(r[6], None) for r in pending]
            self._old_keys = set(stacks)
        if not pending:
            return 0
        out = np.zeros(len(pending), dtype=DEVICE_ALLOC_DTYPE)
        for i, ((ts, addr, size, kind, op, pid, corr, dev), frames) in enumerate(zip(pending, matched, strict=True)):
            stack = -1
            if frames:
                try:
                    stack = self._intern_stack(frames)
                except Exception as exc:  # noqa: BLE001
                    self._error("intern_stack", exc)
            out[i] = (
                (ts + self.offset_ns) // 1000,
                addr,
                size,
                self._kind_codes.get(kind, 0),
                self._op_codes.get(op, 0),
                stack,
                pid,
                dev,
                corr,
            )
        self.records += len(out)
        self.with_stack += int((out["stack"] >= 0).sum())
        self._on_records(out)
        return len(out)

    # -- callbacks (CUPTI's threads or the CUDA caller's; each catches its own errors) ---------------
    def take(self, activities: Any) -> None:
        """Copy the MEMORY2 records' fields out of a completed buffer."""
        memory2 = int(self.api.ActivityKind.MEMORY2)
        rows = []
        for a in activities:
            if int(a.kind) != memory2:
                continue
            rows.append(
                (
                    int(a.timestamp),
                    int(a.address) & 0x7FFF_FFFF_FFFF_FFFF,
                    int(a.bytes),
                    int(a.memory_kind),
                    int(a.memory_operation_type),
                    int(a.process_id),
                    int(a.correlation_id),
                    int(a.device_id),
                )
            )
        if rows and self.active:
            with self._lock:
                self._pending.extend(rows)

    def on_api(self, callback_data: Any) -> None:
        """An allocation function is entered: keep the calling thread's Python stack for its record."""
        if int(callback_data.callback_site) != int(self.api.ApiCallbackSite.API_ENTER):
            return
        frames = python_frames()
        with self._lock:
            self._stacks[int(callback_data.correlation_id)] = frames

    def _error(self, where: str, exc: BaseException) -> None:
        self._errors[where] = self._errors.get(where, 0) + 1
        if where not in self._logged:
            self._logged.add(where)
            log.warning("memtrace: CUPTI %s failed: %r (logged once)", where, exc)


# -- the process-wide callbacks (CUPTI takes one set per process) ------------------------------------
_current: CuptiSource | None = None
_registered: list[Any] = []  # the CUPTI modules whose activity callbacks are registered


def _route(source: CuptiSource | None) -> None:
    global _current
    _current = source


def _buffer_requested() -> tuple[int, int]:
    return BUFFER_BYTES, 0


def _buffer_completed(activities: Any) -> None:
    source = _current
    if source is None or source.pid != os.getpid():
        return
    try:
        source.take(activities)
    except Exception as exc:  # noqa: BLE001  (never raise into CUPTI)
        source._error("buffer_completed", exc)


def _api_callback(userdata: Any, domain: Any, callback_id: Any, callback_data: Any) -> None:
    source = _current
    if source is None or not source.active or source.pid != os.getpid():
        return
    try:
        source.on_api(callback_data)
    except Exception as exc:  # noqa: BLE001  (never fail the CUDA call)
        source._error("api_callback", exc)


def _dist_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("cupti-python")
    except Exception:  # noqa: BLE001
        return None


def start_source(session: Any) -> CuptiSource | None:
    """Start the source for ``session`` (its ``_intern_stack``, ``_on_device_allocs``, ``add_note``).

    None, after one log line and a note, when ``cupti-python`` is missing or CUPTI refuses."""
    try:
        api = import_cupti()
    except ImportError as exc:
        log.warning("memtrace: %s (%s)", OFF_NOTE, exc)
        session.add_note("warning", OFF_NOTE)
        return None
    source = CuptiSource(
        api, intern_stack=session._intern_stack, on_records=session._on_device_allocs, add_note=session.add_note
    )
    try:
        source.start()
    except Exception as exc:  # noqa: BLE001  (a CUPTI that refuses costs the source, never the session)
        _route(None)
        text = f"CUPTI source off: CUPTI refused ({exc!r})"
        log.warning("memtrace: %s", text)
        session.add_note("warning", text)
        return None
    log.info("memtrace: %s", ON_NOTE)
    session.add_note("info", ON_NOTE)
    return source
