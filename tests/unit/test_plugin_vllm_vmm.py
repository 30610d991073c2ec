"""vLLM 0.34's virtual-memory calls become exact records of the trace (``plugins.vllm_vmm``).

vLLM's own ``VmmDriver`` code runs here, from the 0.34.0 wheel (``tests/data/vllm-0.34.0-src``): only the
CUDA driver under it is a fake (``FakeCudaDriver``), since this machine has no GPU. The real driver is
exercised by the H200 start-ups (``tests/data/vllm-h200-034``).
"""

from __future__ import annotations

import ctypes

import memtrace
import numpy as np
import pytest
from fake_vmm import GRANULE, OOM, load_vmm_driver, make_driver
from memtrace.model import VMM_CALLERS, VMM_OPS
from memtrace.plugins import hooks, vllm_vmm
from memtrace.plugins.hooks import HookManager
from memtrace.store import load_run


@pytest.fixture
def vmm(monkeypatch):
    """vLLM 0.34's vmm_driver module (imported from its source as ``vllm.utils.vmm_driver``)."""
    return load_vmm_driver(monkeypatch)


def run_in(filename: str, code: str, **names):
    """Run ``code`` as if it were in ``filename`` (the caller is told apart by the file of its frames)."""
    exec(compile(code, filename, "exec"), names)


def test_commits_and_releases_are_exact_records_with_their_bytes_and_caller(vmm, tmp_path):
    session = memtrace.start(tmp_path / "run", sample_hz=0, handle_signals=False, stacks="python")
    manager = HookManager()
    try:
        assert vllm_vmm.install(manager, lambda: session) == [p for p, _ in vllm_vmm.TARGETS]
        driver, fake = make_driver(vmm, capacity=10 * GRANULE)
        # vLLM's availability check: one granule reserved, created, released, freed
        probe = "base = d.reserve(g)\nh = d.create(g, 0)\nd.release(h)\nd.free_reserved(base, g)\n"
        run_in(
            "/site/vllm/utils/vmm_driver.py",
            f"def vmm_unavailable_reason():\n    {probe.replace(chr(10), chr(10) + '    ')}\nvmm_unavailable_reason()",
            d=driver,
            g=GRANULE,
        )
        # the extensible KV cache's buffer: a 4-granule reservation, 1 then 3 more granules committed
        kv = "base = d.reserve(4 * g)\nhs = [d.create(g, 0), d.create(3 * g, 0)]\n"
        out: dict = {}
        run_in("/site/vllm/utils/extensible_tensor.py", kv, d=driver, g=GRANULE, out=out)
        with pytest.raises(RuntimeError, match="GPU driver error 2: out of memory"):
            driver.create(8 * GRANULE, 0)  # the device is full: vLLM's own error, unchanged
        assert fake.used == 4 * GRANULE
    finally:
        manager.unpatch()
        memtrace.stop()
    trace = load_run(tmp_path / "run").traces[0]
    rows = [(VMM_OPS[r["op"]], VMM_CALLERS[r["caller"]], int(r["bytes"]), int(r["error"])) for r in trace.vmm]
    assert rows == [
        ("reserve", "probe", GRANULE, 0),
        ("create", "probe", GRANULE, 0),
        ("release", "probe", GRANULE, 0),  # the bytes its create committed, found by handle
        ("free_reserved", "probe", GRANULE, 0),
        ("reserve", "kv_cache", 4 * GRANULE, 0),
        ("create", "kv_cache", GRANULE, 0),
        ("create", "kv_cache", 3 * GRANULE, 0),
        ("create", "other", 8 * GRANULE, OOM),  # failed: committed nothing
    ]
    assert np.all(np.diff(trace.vmm["time_us"]) >= 0)
    creates = trace.vmm[trace.vmm["op"] == VMM_OPS.index("create")]
    assert creates["handle"][-1] == 0 and all(creates["handle"][:-1] > 0)
    # the Python stack of each call, the recorder's own frames left out
    inner = [trace.stack_frames(int(s))[0] for s in trace.vmm["stack"]]
    assert inner[0].filename.endswith("vmm_driver.py") and inner[0].name == "vmm_unavailable_reason"
    assert inner[5].filename.endswith("extensible_tensor.py")
    every = {f.filename for s in trace.vmm["stack"] for f in trace.stack_frames(int(s))}
    assert every.isdisjoint({vllm_vmm.__file__, hooks.__file__}) and __file__ in every


def test_the_create_override_and_its_base_record_one_call(vmm, tmp_path):
    """CudaVmmDriver.create retries through VmmDriver.create (no FABRIC handle): one record, not two."""
    session = memtrace.start(tmp_path / "run", sample_hz=0, handle_signals=False, stacks="none")
    manager = HookManager()
    try:
        vllm_vmm.install(manager, lambda: session)
        driver, _ = make_driver(vmm, capacity=4 * GRANULE)
        # CudaVmmDriver's own create (hooked) calling the base's (hooked too) when FABRIC fails
        cuda = vmm.CudaVmmDriver.__new__(vmm.CudaVmmDriver)
        cuda._fns = driver._fns
        cuda._rdma_capable = {0: False}
        cuda._fabric_capable = {0: False}
        handle = cuda.create(GRANULE, 0)
        assert handle > 0
    finally:
        manager.unpatch()
        memtrace.stop()
    trace = load_run(tmp_path / "run").traces[0]
    assert [(VMM_OPS[r["op"]], int(r["bytes"]), int(r["stack"])) for r in trace.vmm] == [("create", GRANULE, -1)]


def test_no_session_no_record_and_a_failing_hook_changes_nothing(vmm, monkeypatch):
    """Before recording starts (or after it stopped) nothing is recorded; a hook whose bookkeeping
    fails lets vLLM's call through with its own result."""
    manager = HookManager()
    vllm_vmm.install(manager, lambda: None)
    driver, fake = make_driver(vmm, capacity=4 * GRANULE)
    try:
        assert driver.create(GRANULE, 0) > 0 and fake.used == GRANULE
        monkeypatch.setenv("MEMTRACE_FAULT", "vllm.vmm.release")
        driver.release(max(fake.handles))
        assert fake.used == 0
    finally:
        manager.unpatch()


def test_error_codes_are_read_from_vllms_message():
    assert vllm_vmm.error_code(None) == 0
    assert vllm_vmm.error_code(RuntimeError("GPU driver error 2: out of memory")) == 2
    assert vllm_vmm.error_code(ValueError("something else")) == -1


def test_vllm_registers_nothing_here_before_034(vmm):
    """The ctypes types vLLM builds its calls with are the real ones (the fake only answers them)."""
    assert vmm.DevicePtr is ctypes.c_ulonglong and vmm.MemHandle is ctypes.c_ulonglong
