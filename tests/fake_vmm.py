"""vLLM 0.34's ``vllm/utils/vmm_driver.py`` (vendored, ``tests/data/vllm-0.34.0-src``) over a fake CUDA driver.

The CUDA driver (``cuMem*``) is the one part that cannot run on this machine (no GPU): ``FakeCudaDriver``
answers vLLM's ctypes calls over a pretend device. Everything above it is vLLM's own code.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent / "data" / "vllm-0.34.0-src" / "vllm" / "utils" / "vmm_driver.py"
MODULE = "vllm.utils.vmm_driver"
OOM = 2  # CUDA_ERROR_OUT_OF_MEMORY
GRANULE = 2 << 20


class FakeCudaDriver:
    """The cuMem* entry points vLLM's VmmDriver calls through ctypes, over a pretend device of
    ``capacity`` bytes (a fake: there is no CUDA driver on this machine)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.used = 0
        self.handles: dict[int, int] = {}
        self.next = 0x10

    def fns(self) -> dict:
        return {
            "address_reserve": self.address_reserve,
            "address_free": lambda ptr, size: 0,
            "create": self.create,
            "release": self.release,
            "map": lambda ptr, size, offset, handle, flags: 0,
            "unmap": lambda ptr, size: 0,
            "set_access": lambda ptr, size, desc, count: 0,
            "get_granularity": self.granularity,
        }

    def address_reserve(self, out, size, alignment, addr, flags):
        out._obj.value = 0x7F00_0000_0000 + self.next * GRANULE
        self.next += 1
        return 0

    def create(self, out, size, prop, flags):
        if self.used + size > self.capacity:
            return OOM
        self.next += 1
        out._obj.value = self.next
        self.handles[self.next] = size
        self.used += size
        return 0

    def release(self, handle):
        self.used -= self.handles.pop(int(handle))
        return 0

    def granularity(self, out, prop, option):
        out._obj.value = GRANULE
        return 0


def load_vmm_driver(monkeypatch):
    """vLLM 0.34's vmm_driver module, imported from its source as ``vllm.utils.vmm_driver``."""
    spec = importlib.util.spec_from_file_location(MODULE, SRC)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, MODULE, module)
    spec.loader.exec_module(module)
    return module


def make_driver(vmm, capacity: int):
    """A ``VmmDriver`` of vLLM's whose library is the fake (its own methods, signatures and checks)."""

    class Driver(vmm.VmmDriver):
        def error_string(self, code: int) -> str:
            return "out of memory" if code == OOM else "unknown error"

    fake = FakeCudaDriver(capacity)
    driver = Driver.__new__(Driver)
    driver._fns = fake.fns()
    return driver, fake
