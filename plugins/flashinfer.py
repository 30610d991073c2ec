"""FlashInfer workspace-allocator hooks: which allocator asked for how many bytes, with what arguments.

Default targets are FlashInfer's b12x (SM120) MoE workspace allocators, which reserve GiBs lazily
inside vLLM's ``profile_run`` (vllm-project/vllm#49476):

- 0.6.x and 0.7.x: ``allocate_sm120_moe_workspace`` and the static / dynamic / w4a16 allocators it
  dispatches to, in ``flashinfer.fused_moe.cute_dsl.blackwell_sm12x.moe_dispatch``, and
  ``B12xMoEWrapper._allocate_buffers`` in ``flashinfer.fused_moe.cute_dsl.b12x_moe``;
- 0.7.x experimental API (top-level ``b12x``): ``_allocate_core_arena`` and ``_alloc_route_workspace``
  in ``b12x.moe.fused_moe._impl``.

``MEMTRACE_HOOKS=pkg.mod:func,pkg.mod:Class.method`` adds targets. Each call becomes a
:class:`memtrace.model.HookCall`: arguments worth keeping (ints, strings, dtypes, shapes), start and end
time, the bytes of the *distinct* storages the call returned (tensors found in the result, its
dataclass fields, tuples, lists and dicts; views of one storage count once), and PyTorch's
allocated/reserved counters after minus before. Calls nested in a hooked call (moe_workspace ->
dynamic_workspace) are recorded with ``parent`` set to the enclosing call.

Nothing here imports torch: it is looked up in ``sys.modules`` when a call happens.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from memtrace.plugins.hooks import HookTargetError, Target, original_function

if TYPE_CHECKING:  # memtrace.model (its dataclasses) is imported at the first call, not at registration
    from memtrace.model import HookCall

HOOKS_ENV = "MEMTRACE_HOOKS"

_MAX_WALK = 10_000  # objects visited while looking for tensors in a result
_MAX_SEQ_ARG = 16  # a list/tuple argument longer than this is stored as its length


def user_targets(value: str | None = None) -> tuple[list[str], list[str]]:
    """Targets from ``MEMTRACE_HOOKS`` (comma-separated): (valid paths, error messages)."""
    text = os.environ.get(HOOKS_ENV, "") if value is None else value
    good, bad = [], []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            good.append(Target.parse(item).path)
        except HookTargetError as exc:
            bad.append(f"{HOOKS_ENV}: {exc}")
    return good, bad


# -- measuring --------------------------------------------------------------------------------


def _torch() -> Any:
    return sys.modules.get("torch")


def distinct_storage_bytes(obj: Any) -> int | None:
    """Bytes of the distinct tensor storages reachable from ``obj`` (None when it holds no tensor).

    Walks tensors, dataclass instances (all their attributes, so views added after ``__init__`` are
    seen too), tuples, lists, sets and dict values; each storage counts once, by (device, data_ptr).
    """
    torch = _torch()
    if torch is None:
        return None
    seen_objs: set[int] = set()
    storages: dict[tuple[str, int], int] = {}
    stack = [obj]
    visited = 0
    while stack and visited < _MAX_WALK:
        item = stack.pop()
        visited += 1
        if item is None or isinstance(item, (int, float, str, bytes, bool)):
            continue
        if id(item) in seen_objs:
            continue
        seen_objs.add(id(item))
        if isinstance(item, torch.Tensor):
            try:
                st = item.untyped_storage()
                storages[(str(item.device), int(st.data_ptr()))] = int(st.nbytes())
            except (RuntimeError, NotImplementedError):  # meta / sparse / fake tensors
                pass
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (tuple, list, set, frozenset)):
            stack.extend(item)
        elif dataclasses.is_dataclass(item) and not isinstance(item, type):
            stack.extend(getattr(item, "__dict__", {}).values())
            for f in dataclasses.fields(item):
                stack.append(getattr(item, f.name, None))
    if not storages:
        return None
    return sum(storages.values())


def summarize_arg(value: Any) -> Any:
    """A JSON-friendly summary of an argument: ints, strings, dtypes, shapes; else the type name."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    torch = _torch()
    if torch is not None:
        if isinstance(value, torch.Tensor):
            return {
                "shape": list(value.shape),
                "dtype": str(value.dtype).removeprefix("torch."),
                "device": str(value.device),
            }
        if isinstance(value, (torch.dtype, torch.device)):
            return str(value).removeprefix("torch.")
        if isinstance(value, torch.Size):
            return list(value)
    if isinstance(value, (tuple, list)):
        if len(value) <= _MAX_SEQ_ARG and all(isinstance(v, (bool, int, float, str)) or v is None for v in value):
            return list(value)
        return f"{type(value).__name__}[{len(value)}]"
    return f"<{type(value).__name__}>"


def bound_args(func: Callable, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Arguments by name (``self`` dropped), summarized with :func:`summarize_arg`."""
    try:
        sig = inspect.signature(func)
        items = list(sig.bind_partial(*args, **kwargs).arguments.items())
        var_kw = {n for n, p in sig.parameters.items() if p.kind is inspect.Parameter.VAR_KEYWORD}
    except (TypeError, ValueError):
        items = [(f"arg{i}", a) for i, a in enumerate(args)] + list(kwargs.items())
        var_kw = set()
    out: dict[str, Any] = {}
    for name, value in items:
        if name in ("self", "cls"):
            continue
        if name in var_kw and isinstance(value, dict):
            out.update({k: summarize_arg(v) for k, v in value.items()})
        else:
            out[name] = summarize_arg(value)
    return out


def _device_of(args: dict[str, Any]) -> Any:
    dev = args.get("device")
    return dev if isinstance(dev, str) and dev.startswith("cuda") else None


def allocator_counters(device: Any = None) -> tuple[int, int] | None:
    """(memory_allocated, memory_reserved) of a CUDA device, or None when CUDA is not initialized."""
    torch = _torch()
    if torch is None or not hasattr(torch, "cuda") or not torch.cuda.is_initialized():
        return None
    return int(torch.cuda.memory_allocated(device)), int(torch.cuda.memory_reserved(device))


# -- the handler --------------------------------------------------------------------------------


class _Open:  # a plain class: a dataclass costs ~0.5 ms when the plugin registers
    __slots__ = ("call", "counters", "device", "self_obj", "children")

    def __init__(self, call: HookCall, counters: tuple[int, int] | None, device: Any, self_obj: Any = None) -> None:
        self.call = call
        self.counters = counters
        self.device = device
        self.self_obj = self_obj
        self.children: list[_Open] = []


class _Calls(threading.local):
    def __init__(self) -> None:
        self.open: list[_Open] = []


_calls = _Calls()


class HookCallRecorder:
    """A hooks.Handler that turns each call into a HookCall and hands it to ``sink``.

    ``sink(call) -> index`` is called for the outermost call first, then for nested calls with
    ``parent`` set to the enclosing call's index (so a trace lists calls in start order).
    ``result_attrs`` names attributes of ``self`` to measure when the method returns None.
    """

    def __init__(
        self,
        target: Target | str,
        sink: Callable[[HookCall], int | None],
        result_attrs: tuple[str, ...] = (),
        cost_source: str = "flashinfer",
    ):
        self.cost_source = cost_source  # where hooks.py charges this hook's time ("user" for MEMTRACE_HOOKS)
        self.target = Target.parse(target) if isinstance(target, str) else target
        self.key = self.target.path
        self.name = self.target.path
        self.sink = sink
        self.result_attrs = result_attrs
        self._func: Callable | None = None

    @classmethod
    def for_entry(cls, plugin: Any, entry: Any) -> HookCallRecorder:
        """The recorder of a ``surface`` workspace entry (``detail``: the attributes to measure)."""
        return cls(entry.path, plugin.record_hook_call, tuple(entry.detail))

    def before(self, target: Target, args: tuple, kwargs: dict) -> Any:
        start_us = time.time_ns() // 1000
        func = self._function()
        argd = bound_args(func, args, kwargs) if func is not None else {k: summarize_arg(v) for k, v in kwargs.items()}
        device = _device_of(argd)
        self_obj = args[0] if (self.result_attrs and args) else None
        from memtrace.model import HookCall

        entry = _Open(HookCall(self.name, start_us, start_us, argd), allocator_counters(device), device, self_obj)
        _calls.open.append(entry)
        return entry

    def after(self, token: Any, result: Any, error: BaseException | None) -> None:
        entry: _Open = token
        stack = _calls.open
        if stack and stack[-1] is entry:
            stack.pop()
        elif entry in stack:
            stack.remove(entry)
        call = entry.call
        call.end_us = time.time_ns() // 1000
        if error is not None:
            call.error = f"{type(error).__name__}: {error}"[:500]
        else:
            measured = result
            if result is None and entry.self_obj is not None:
                measured = [getattr(entry.self_obj, a, None) for a in self.result_attrs]
            call.returned_bytes = distinct_storage_bytes(measured)
        after = allocator_counters(entry.device)
        if entry.counters is not None and after is not None:
            call.allocated_delta_bytes = after[0] - entry.counters[0]
            call.reserved_delta_bytes = after[1] - entry.counters[1]
        if stack:
            stack[-1].children.append(entry)
        else:
            self._emit(entry, None)

    def _emit(self, entry: _Open, parent: int | None) -> None:
        entry.call.parent = parent
        index = self.sink(entry.call)
        for child in entry.children:
            self._emit(child, index)

    def _function(self) -> Callable | None:
        if self._func is None:
            self._func = original_function(self.target)
        return self._func


def install_extra(
    manager: Any, sink: Callable[[HookCall], int | None], extra: list[str] | None, known: list[str]
) -> list[str]:
    """Add the ``extra`` targets not in ``known``; returns those added."""
    added: list[str] = []
    for path in extra or []:
        if path not in known and path not in added:
            manager.add(path, HookCallRecorder(path, sink, cost_source="user"))
            added.append(path)
    return added
