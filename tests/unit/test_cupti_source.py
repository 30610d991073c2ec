"""The optional CUPTI source's plumbing (``capture.cupti``), through a real Session and a real trace file.

``FakeCupti`` stands in for NVIDIA's ``cupti.cupti`` only because there is no GPU here: it keeps the
real module's names (``ActivityKind.MEMORY2``, ``activity_register_callbacks``, ``activity_flush_all``,
``subscribe``, ``enable_callback``, ``CallbackDomain``, the ``ActivityMemory4`` fields) and calls the
registered callbacks the way CUPTI does: the API callback in the thread making the CUDA call, the
buffer-completed callback with the records at a flush. The real thing runs in tests/gpu/check_cupti.py.
"""

from __future__ import annotations

import enum
import logging
from types import SimpleNamespace

import memtrace
import numpy as np
import pytest
from memtrace.analysis.memory.phases import path_at
from memtrace.capture import cupti as source_mod
from memtrace.model import MEMORY_KINDS, MEMORY_OPS
from memtrace.store import load_trace


class FakeCupti:
    """The subset of ``cupti.cupti`` the source uses (enum values as in cupti_activity.h)."""

    class ActivityKind(enum.IntEnum):
        MEMORY2 = 49
        KERNEL = 3

    class ActivityFlag(enum.IntEnum):
        FLUSH_FORCED = 1

    class ActivityMemoryKind(enum.IntEnum):
        UNKNOWN = 0
        PAGEABLE = 1
        PINNED = 2
        DEVICE = 3
        ARRAY = 4
        MANAGED = 5
        DEVICE_STATIC = 6
        MANAGED_STATIC = 7

    class ActivityMemoryOperationType(enum.IntEnum):
        INVALID = 0
        ALLOCATION = 1
        RELEASE = 2

    class ApiCallbackSite(enum.IntEnum):
        API_ENTER = 0
        API_EXIT = 1

    class CallbackDomain(enum.IntEnum):
        DRIVER_API = 1
        RUNTIME_API = 2

    class runtime_api_trace_cbid(enum.IntEnum):  # noqa: N801  (CUPTI's name)
        cudaMalloc_v3020 = 20
        cudaFree_v3020 = 22

    class driver_api_trace_cbid(enum.IntEnum):  # noqa: N801
        cuMemAlloc_v2 = 231
        cuModuleLoadData = 4

    def __init__(self, *, subscribe_error: Exception | None = None, clock_offset_ns: int = 0):
        self.requested = self.completed = self.api_callback = None
        self.enabled: set[int] = set()
        self.callbacks: set[tuple[int, int]] = set()
        self.queue: list = []
        self.corr = 100
        self.subscribe_error = subscribe_error
        self.clock_offset_ns = clock_offset_ns
        self.flushes = 0

    # activity API
    def activity_register_callbacks(self, requested, completed):
        self.requested, self.completed = requested, completed

    def activity_enable(self, kind):
        self.enabled.add(int(kind))

    def activity_disable(self, kind):
        self.enabled.discard(int(kind))

    def activity_flush_all(self, flag):
        self.flushes += 1
        if self.queue:
            size, _ = self.requested()
            assert size > 0
            records, self.queue = self.queue, []
            self.completed(records)

    def get_timestamp(self):
        import time

        return time.time_ns() - self.clock_offset_ns

    # callback API
    def subscribe(self, callback, userdata):
        if self.subscribe_error is not None:
            raise self.subscribe_error
        self.api_callback = callback
        return 7

    def enable_callback(self, enable, subscriber, domain, cbid):
        assert subscriber == 7
        self.callbacks.add((int(domain), int(cbid)))

    def unsubscribe(self, subscriber):
        self.api_callback = None

    # what a CUDA call does under CUPTI
    def cuda_malloc(self, address: int, nbytes: int, kind: int = 3) -> None:
        """cudaMalloc: the API callback in this thread (enter, exit), then a MEMORY2 record in a buffer."""
        self.corr += 1
        cbid = int(self.runtime_api_trace_cbid.cudaMalloc_v3020)
        domain = int(self.CallbackDomain.RUNTIME_API)
        if self.api_callback is not None and (domain, cbid) in self.callbacks:
            for site in (self.ApiCallbackSite.API_ENTER, self.ApiCallbackSite.API_EXIT):
                self.api_callback(None, domain, cbid, SimpleNamespace(callback_site=site, correlation_id=self.corr))
        self._record(address, nbytes, kind, self.ActivityMemoryOperationType.ALLOCATION)

    def cuda_free(self, address: int, nbytes: int, kind: int = 3) -> None:
        self.corr += 1
        self._record(address, nbytes, kind, self.ActivityMemoryOperationType.RELEASE)

    def _record(self, address, nbytes, kind, op):
        import time

        if int(self.ActivityKind.MEMORY2) in self.enabled:
            self.queue.append(
                SimpleNamespace(
                    kind=self.ActivityKind.MEMORY2,
                    timestamp=time.time_ns() - self.clock_offset_ns,
                    address=address,
                    bytes=nbytes,
                    memory_kind=kind,
                    memory_operation_type=op,
                    process_id=4242,
                    correlation_id=self.corr,
                    device_id=0,
                )
            )


@pytest.fixture(autouse=True)
def stacks_on(monkeypatch):
    """The callback API (stacks) is opt-in since it deadlocked with PyTorch's allocator on the H200;
    these tests exercise it, except where a test turns it off."""
    monkeypatch.setenv(source_mod.STACKS_ENV, "1")


@pytest.fixture
def fake(monkeypatch):
    api = FakeCupti()
    monkeypatch.setattr(source_mod, "import_cupti", lambda: api)
    monkeypatch.delenv(source_mod.ENV, raising=False)
    yield api
    source_mod._route(None)


def kernel_library_malloc(api: FakeCupti, address: int, nbytes: int) -> None:
    """A library's own cudaMalloc: this frame must be the record's innermost but the fake's own."""
    api.cuda_malloc(address, nbytes)


def test_records_reach_the_trace_with_the_calling_threads_stack_and_phase(fake, tmp_path):
    with memtrace.trace(tmp_path / "t.memtrace", cupti=True, sidecar=False) as session:
        assert int(fake.ActivityKind.MEMORY2) in fake.enabled
        assert (2, 20) in fake.callbacks and (1, 231) in fake.callbacks  # cudaMalloc, cuMemAlloc_v2
        assert (2, 22) not in fake.callbacks  # frees get no stack
        with memtrace.phase("load_model"):
            kernel_library_malloc(fake, 0x7F00_0000_0000, 512 << 20)
        fake.cuda_malloc(0x7F10_0000_0000, 2 << 20, kind=2)  # pinned host memory
        fake.cuda_free(0x7F00_0000_0000, 512 << 20)
    t = load_trace(session.path)
    recs = t.device_allocs
    assert len(recs) == 3 and fake.enabled == set() and fake.api_callback is None  # stopped at close
    first = recs[0]
    assert (int(first["address"]), int(first["bytes"])) == (0x7F00_0000_0000, 512 << 20)
    assert MEMORY_KINDS[first["kind"]] == "device" and MEMORY_OPS[first["op"]] == "allocation"
    assert (int(first["pid"]), int(first["correlation"])) == (4242, 101)
    fake_call, inner = t.stack_frames(int(first["stack"]))[:2]  # the fake's cuda_malloc stands for the C call
    assert fake_call.name == "cuda_malloc" and inner.name == "kernel_library_malloc"
    assert inner.filename.endswith("test_cupti_source.py") and "capture/cupti.py" not in str(t.frames)
    assert path_at(t, int(first["time_us"])) == "load_model"
    assert MEMORY_KINDS[recs[1]["kind"]] == "pinned" and MEMORY_OPS[recs[2]["op"]] == "release"
    assert recs[2]["stack"] == -1  # a release has no stack
    fact = t.facts["cupti"]
    assert fact["records"] == 3 and fact["records_with_stack"] == 2 and fact["stacks"] and not fact["errors"]
    assert (fact["on"], fact["active"]) == (True, False)  # it recorded; stopped at close
    assert any(n.text == source_mod.ON_NOTE for n in t.notes)  # said once: it changes what vLLM sizes
    # when the records were enabled: where analysis.non_torch looks for CUPTI's own device memory
    assert t.recording.start_us <= fact["started_us"] <= int(recs["time_us"].min())


def test_records_are_written_at_every_flush_not_only_at_close(fake, tmp_path):
    session = memtrace.start(tmp_path / "t.memtrace", cupti=True, sidecar=False)
    try:
        fake.cuda_malloc(0x1000, 4096)
        session.flush()
        assert len(load_trace(session.path).device_allocs) == 1  # on disk before the end
    finally:
        memtrace.stop()


def test_the_environment_turns_it_on_and_it_is_off_by_default(fake, tmp_path, monkeypatch):
    with memtrace.trace(tmp_path / "off.memtrace", sidecar=False) as s:
        fake.cuda_malloc(0x1000, 4096)
    assert not fake.enabled and "cupti" not in load_trace(s.path).facts
    monkeypatch.setenv(source_mod.ENV, "1")
    with memtrace.trace(tmp_path / "on.memtrace", sidecar=False) as s:
        fake.cuda_malloc(0x2000, 4096)
    assert len(load_trace(s.path).device_allocs) == 1


def test_without_cupti_python_one_line_and_a_note_and_memtrace_records_as_before(tmp_path, caplog, monkeypatch):
    monkeypatch.delenv(source_mod.ENV, raising=False)
    with pytest.raises(ImportError):  # the real import: cupti-python is not installed here
        source_mod.import_cupti()
    with caplog.at_level(logging.WARNING, logger="memtrace"):
        with memtrace.trace(tmp_path / "t.memtrace", cupti=True, sidecar=False) as s:
            with memtrace.phase("work"):
                pass
    t = load_trace(s.path)
    assert [n.text for n in t.notes if "CUPTI" in n.text] == ["CUPTI source off: pip install memtrace-vllm[cupti]"]
    assert len([r for r in caplog.records if "CUPTI" in r.getMessage()]) == 1
    assert len(t.device_allocs) == 0 and [p.name for p in t.phases] == ["work"]
    assert t.facts["cupti"] == {"on": False}


def test_a_taken_subscriber_costs_the_stacks_not_the_records(monkeypatch, tmp_path):
    api = FakeCupti(subscribe_error=RuntimeError("CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"))
    monkeypatch.setattr(source_mod, "import_cupti", lambda: api)
    with memtrace.trace(tmp_path / "t.memtrace", cupti=True, sidecar=False) as s:
        kernel_library_malloc(api, 0x1000, 4096)
    t = load_trace(s.path)
    assert len(t.device_allocs) == 1 and t.device_allocs["stack"][0] == -1
    assert any("no Python stacks" in n.text for n in t.notes) and t.facts["cupti"]["stacks"] is False


def test_callback_errors_are_caught_logged_once_and_counted(fake, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="memtrace"):
        with memtrace.trace(tmp_path / "t.memtrace", cupti=True, sidecar=False) as s:
            for _ in range(3):  # a record without its fields, as a newer CUPTI might deliver
                fake.queue.append(SimpleNamespace(kind=fake.ActivityKind.MEMORY2))
                fake.activity_flush_all(1)  # raises inside the callback, never out of it
            fake.api_callback(None, 2, 20, object())  # callback data without its fields
            fake.cuda_malloc(0x1000, 4096)
    t = load_trace(s.path)
    assert len(t.device_allocs) == 1
    assert t.facts["cupti"]["errors"] == {"buffer_completed": 3, "api_callback": 1}
    assert len([r for r in caplog.records if "buffer_completed" in r.getMessage()]) == 1


def test_a_call_that_made_no_record_is_forgotten_and_a_clock_offset_is_applied(monkeypatch, tmp_path):
    api = FakeCupti(clock_offset_ns=3_600 * 10**9)  # CUPTI's clock an hour off the Unix clock
    monkeypatch.setattr(source_mod, "import_cupti", lambda: api)
    session = memtrace.start(tmp_path / "t.memtrace", cupti=True, sidecar=False)
    try:
        source = session.cupti
        api.cuda_malloc(0x1000, 4096)
        api.queue.clear()  # the call failed: CUPTI delivers no record for it
        session.flush()
        assert len(source._stacks) == 1
        session.flush()
        assert source._stacks == {}  # forgotten at the flush after the one that saw it
        api.cuda_malloc(0x2000, 4096)
    finally:
        memtrace.stop()
    t = load_trace(session.path)
    assert len(t.device_allocs) == 1 and t.facts["cupti"]["clock_offset_ns"] > 3_500 * 10**9
    rec_us = int(t.device_allocs["time_us"][0])
    assert abs(rec_us - t.recording.end_us) < 5 * 10**6  # on the Unix clock, not an hour off


def test_records_delivered_after_stop_are_dropped(fake, tmp_path):
    with memtrace.trace(tmp_path / "t.memtrace", cupti=True, sidecar=False) as s:
        pass
    fake.enabled.add(int(fake.ActivityKind.MEMORY2))  # CUPTI's own flush at interpreter exit
    fake.cuda_malloc(0x1000, 4096)
    fake.activity_flush_all(1)  # no source routed: nothing kept, nothing raised
    assert len(load_trace(s.path).device_allocs) == 0
    assert np.all(load_trace(s.path).device_allocs["stack"] == -1)


def test_a_second_session_reuses_the_callbacks_registered_once(fake, tmp_path):
    registered = []
    real_register = fake.activity_register_callbacks
    fake.activity_register_callbacks = lambda r, c: (registered.append(1), real_register(r, c))
    for name in ("a", "b"):
        with memtrace.trace(tmp_path / f"{name}.memtrace", cupti=True, sidecar=False) as s:
            fake.cuda_malloc(0x1000, 4096)
        assert len(load_trace(s.path).device_allocs) == 1, name
    assert registered == [1]


def test_a_forked_childs_records_are_not_this_sessions(fake, tmp_path, monkeypatch):
    with memtrace.trace(tmp_path / "t.memtrace", cupti=True, sidecar=False) as s:
        fake.cuda_malloc(0x1000, 4096)
        monkeypatch.setattr(source_mod.os, "getpid", lambda: s.pid + 1)  # as seen from a forked child
        fake.cuda_malloc(0x2000, 4096)
        fake.activity_flush_all(1)  # delivered in the child: dropped there
        monkeypatch.undo()
        monkeypatch.setattr(source_mod, "import_cupti", lambda: fake)
    assert load_trace(s.path).device_allocs["address"].tolist() == []


def test_without_the_stacks_switch_no_callback_is_subscribed_and_a_note_says_why(fake, tmp_path, monkeypatch):
    monkeypatch.delenv(source_mod.STACKS_ENV)
    with memtrace.trace(tmp_path / "t.memtrace", cupti=True) as session:
        assert fake.api_callback is None  # subscribe() never called (close would clear it anyway)
    notes = [n.text for n in load_trace(session.path).notes]
    assert any("records without Python stacks" in t and source_mod.STACKS_ENV in t for t in notes)


class FakeHistory:
    """Stands for the allocator history (it needs a GPU): counts watchdog starts."""

    def __init__(self):
        self.watchdogs = 0

    def start_watchdog(self):
        self.watchdogs += 1


@pytest.mark.parametrize("stacks", [True, False])
def test_no_drain_watchdog_while_the_api_callbacks_are_on(fake, tmp_path, monkeypatch, stacks):
    """The H200 deadlock: a callback inside PyTorch's cudaMalloc waits for the GIL that the watchdog held
    while it waited for the allocator's mutex. With the callbacks on, no watchdog; without them, one."""
    if not stacks:
        monkeypatch.delenv(source_mod.STACKS_ENV)
    session = memtrace.start(tmp_path / "t.memtrace", cupti=True, sidecar=False)
    try:
        assert session.cupti.stacks_on is stacks
        session.history = FakeHistory()
        session._start_watchdog()
        assert session.history.watchdogs == (0 if stacks else 1)
    finally:
        session.history = None
        memtrace.stop()
    notes = [n.text for n in load_trace(session.path).notes]
    assert any("drain watchdog off" in t for t in notes) is stacks


def test_a_torch_operator_is_named_in_its_frame_and_names_the_allocation(fake, tmp_path, monkeypatch):
    """A C++ operator's own cudaMalloc has no Python frame below ``torch/_ops.py``'s ``__call__``: the
    frame is stored with the operator's name. Here a real operator with a Python implementation makes
    the call (the frame is real torch), then a stand-in frame compiled under the name ``torch/_ops.py``
    plays a C++ operator (the only Python frame inside the op, as on the H200)."""
    import functools

    import torch
    from memtrace.analysis.memory import non_torch

    monkeypatch.setenv(source_mod.STACKS_ENV, "1")

    def raw_alloc(x):
        kernel_library_malloc(fake, 0x7100_0000_0000, 8 << 20)
        return x.clone()

    lib = torch.library.Library("memtrace_test", "DEF")  # kept alive for the test
    lib.define("raw_alloc(Tensor x) -> Tensor")
    lib.impl("raw_alloc", raw_alloc, "CPU")

    namespace: dict = {}
    exec(compile("def __call__(self, f):\n    return f()\n", "/venv/site-packages/torch/_ops.py", "exec"), namespace)
    cxx_op = SimpleNamespace(_name="vllm::moe_forward")  # what OpOverload calls its operator

    def compiled_graph_call():  # Inductor's generated code calls the operator
        namespace["__call__"](cxx_op, functools.partial(fake.cuda_malloc, 0x7200_0000_0000, 64 << 20))

    with memtrace.trace(tmp_path / "t.memtrace", cupti=True, sidecar=False) as s:
        torch.ops.memtrace_test.raw_alloc(torch.zeros(2))
        compiled_graph_call()
    t = load_trace(s.path)
    real, standin = (t.stack_frames(int(st)) for st in t.device_allocs["stack"])
    ops = [f for f in real if f.op]
    assert ops and {f.op for f in ops} <= {"memtrace_test::raw_alloc"}  # torch's own _ops.py frame, named
    assert ops[0].filename.endswith("torch/_ops.py") and ops[0].name.startswith("__call__ [op ")
    assert standin[1].op == "vllm::moe_forward" and standin[2].name == "compiled_graph_call"
    # (the fake's cuda_malloc frame stands for the C call: left out, as CUPTI's C callers have no frame)
    libraries = [non_torch.classify(f[1:], "profile_run")[1] for f in (real, standin)]
    assert libraries == ["test_cupti_source", "op vllm::moe_forward"]  # Python code inside the op wins
