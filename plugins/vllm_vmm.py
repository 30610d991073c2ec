"""vLLM's calls of CUDA's virtual-memory API: every commit and release of its extensible KV cache (0.34+).

From vLLM 0.34 the KV cache is, by default, an *extensible* one: its address range is reserved and its
physical pages are created and mapped through ctypes bindings of CUDA's VMM API
(``vllm/utils/vmm_driver.py``: ``VmmDriver.reserve / create / map / set_access / unmap / release /
free_reserved`` over ``cuMemAddressReserve``, ``cuMemCreate``, ``cuMemMap``...). None of it passes through
PyTorch's caching allocator, so neither PyTorch's history nor its counters see the KV cache; NVML sees it
as device memory like any other.

The hooks here make each such call an exact record of ``Trace.vmm`` (``model.VMM_DTYPE``):

- ``create(size, device_index, ...)`` commits ``size`` bytes of physical memory (``cuMemCreate``); the
  handle it returns names them. ``CudaVmmDriver.create`` overrides ``VmmDriver.create`` and calls it back
  only to retry without a FABRIC handle: both are hooked under one key, so a call is recorded once.
- ``release(handle)`` gives them back (``cuMemRelease``, after ``unmap``): the record carries the bytes
  its create committed (kept per handle in this process).
- ``reserve(size)`` / ``free_reserved(ptr, size)``: address space only, no memory; recorded so outputs
  can show the reservation apart. ``map``/``unmap``/``set_access`` move no memory and are not recorded.

Each record has the time the call returned, who made it (``model.VMM_CALLERS``: the KV cache's buffer in
``vllm/utils/extensible_tensor.py``, vLLM's one-granule check ``vmm_unavailable_reason``, other), the
CUDA error code of a call that raised (a failed ``create`` is where an extensible KV cache runs out of
memory) and the Python stack when stacks are on. Like every hook, a failure here is logged once and the
call goes through unchanged.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Callable
from typing import Any

from memtrace.capture import pystack
from memtrace.capture.clock import now_us as _now_us
from memtrace.plugins import hooks
from memtrace.plugins.hooks import HookManager, Target, call_argument

_VMM = "vllm.utils.vmm_driver"

#: (target, operation); the two ``create`` targets share one handler key.
TARGETS: tuple[tuple[str, str], ...] = (
    (f"{_VMM}:VmmDriver.create", "create"),
    (f"{_VMM}:CudaVmmDriver.create", "create"),
    (f"{_VMM}:VmmDriver.release", "release"),
    (f"{_VMM}:VmmDriver.reserve", "reserve"),
    (f"{_VMM}:VmmDriver.free_reserved", "free_reserved"),
)


@functools.cache
def _codes() -> tuple[dict[str, int], dict[str, int]]:
    """``model.VMM_OPS`` and ``model.VMM_CALLERS`` by name: memtrace.model (its dataclasses, ~10 ms) is imported
    at the first recorded call, not when the plugin registers."""
    from memtrace.model import VMM_CALLERS, VMM_OPS

    return {n: c for c, n in enumerate(VMM_OPS)}, {n: c for c, n in enumerate(VMM_CALLERS)}


_HERE = (pystack.own_file(__file__), pystack.own_file(hooks.__file__))  # the recorder's own frames


def error_code(exc: BaseException | None) -> int:
    """The CUDA driver's error code in a failed call's exception (-1 when it names none; 0: no error)."""
    if exc is None:
        return 0
    m = re.search(r"GPU driver error (\d+)", str(exc))  # VmmDriver._check's message (compiled on first use)
    return int(m.group(1)) if m else -1


def caller_of(frames: tuple[tuple[str, int, str], ...]) -> int:
    """Who made a virtual-memory call, from its stack (innermost first): a ``VMM_CALLERS`` code."""
    caller = _codes()[1]
    for filename, _line, name in frames:
        if name in ("vmm_unavailable_reason", "_set_access_fails_within_reservation"):
            return caller["probe"]
        if filename.endswith("extensible_tensor.py"):
            return caller["kv_cache"]
    return caller["other"]


class VmmHook:
    """A hooks.Handler recording one kind of VmmDriver call into the current session.

    ``session()`` returns the recording session or None (calls before recording starts, or after it
    stopped, are not recorded); ``sizes`` maps handle -> committed bytes, shared by create and release.
    """

    def __init__(self, op: str, session: Callable[[], Any], sizes: dict[int, int], lock: threading.Lock):
        self.op = op
        self.key = f"vllm.vmm.{op}"
        self.cost_source = "vmm"
        self._session = session
        self._sizes = sizes
        self._lock = lock

    @classmethod
    def for_entry(cls, plugin: Any, entry: Any) -> VmmHook:
        """The hook of a ``surface`` VMM entry (``detail``: its operation); sizes are shared per plugin."""
        return cls(entry.detail[0], plugin.session, plugin.vmm_sizes, plugin.vmm_lock)

    def before(self, target: Target, args: tuple, kwargs: dict) -> Any:
        session = self._session()
        if session is None:
            return None
        if self.op == "create":
            values = (call_argument(target, "size", args, kwargs),)
        elif self.op == "release":
            values = (call_argument(target, "handle", args, kwargs),)
        elif self.op == "reserve":
            values = (call_argument(target, "size", args, kwargs),)
        else:
            values = (call_argument(target, "ptr", args, kwargs), call_argument(target, "size", args, kwargs))
        stacks = getattr(getattr(session, "recording", None), "stacks", "python")
        frames = pystack.python_frames(1, _HERE) if stacks != "none" else ()
        return (session, values, frames)

    def after(self, token: Any, result: Any, error: BaseException | None) -> None:
        if token is None:
            return
        session, values, frames = token
        from memtrace.model import empty_vmm

        rec = empty_vmm(1)
        rec["time_us"] = _now_us()
        rec["op"] = _codes()[0][self.op]
        rec["error"] = error_code(error)
        rec["caller"] = caller_of(frames)
        first = values[0]
        if self.op == "create":
            rec["bytes"] = _int(first)
            if error is None and isinstance(result, int):
                rec["handle"] = result
                with self._lock:
                    self._sizes[result] = _int(first)
        elif self.op == "release":
            handle = _int(first)
            rec["handle"] = handle
            with self._lock:
                rec["bytes"] = self._sizes.pop(handle, 0) if error is None else self._sizes.get(handle, 0)
        elif self.op == "reserve":
            rec["bytes"] = _int(first)
            if error is None and isinstance(result, int):
                rec["address"] = result
        else:
            rec["address"] = _int(first)
            rec["bytes"] = _int(values[1])
        session.record_vmm(rec, frames)  # the stack is interned where the row is written (off vLLM's thread)


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else 0


def install(manager: HookManager, session: Callable[[], Any]) -> list[str]:
    """Hook vLLM's VmmDriver (now, or when ``vllm.utils.vmm_driver`` is imported); returns the targets."""
    sizes: dict[int, int] = {}
    lock = threading.Lock()
    handlers = {op: VmmHook(op, session, sizes, lock) for _path, op in TARGETS}
    for path, op in TARGETS:
        manager.add(path, handlers[op])
    return [path for path, _ in TARGETS]
