"""Function hooks by dotted path: wrap ``pkg.mod:func`` or ``pkg.mod:Class.method`` now, or the
moment its module is imported, and undo every patch on request.

A :class:`HookManager` owns a set of hooks. Each hook names a target and a :class:`Handler` whose
``before``/``after`` run around every call. Guarantees, whatever the handler does:

- **import order does not matter**: a target whose module is not imported yet is patched right after
  the module executes, by a ``sys.meta_path`` finder that wraps the module's loader for that one import;
- **every importer is patched**: for a module-level function, every module that imported it by name
  (``from mod import func``) before the patch has its binding replaced too (found by one dict lookup per
  module and name, in one pass over ``sys.modules`` per module patched or per :meth:`HookManager.batch`);
  a binding that pass cannot see (a lazy ``__getattr__``, an import inside a function, a reloaded home
  module) is found and named by :meth:`HookManager.bypasses`; a reloaded hooked module is patched again;
- **idempotent and undoable**: a wrapper carries a sentinel (``__memtrace_hook__``), patching twice is a
  no-op, :meth:`HookManager.unpatch` restores every original binding;
- **a class's own attributes only**: ``Class.method`` is wrapped only where ``method`` is in
  ``Class.__dict__`` (an inherited method is the base class's target), so nothing is wrapped twice;
- **re-entrancy**: a thread-local guard calls straight through while a handler does its bookkeeping,
  and while a call with the same handler key is already running on this thread (a subclass method
  calling its base, two targets mapped to one phase);
- **never breaks the program**: an exception in ``before``/``after`` is caught, logged once per hook,
  passed to ``on_error``, and the original is called as if no hook were there;
- **timed**: the wrapper's own time around the wrapped call (never the call itself) is charged to
  ``hooks.<handler.cost_source>`` in :mod:`memtrace.capture.selfcost` ("hooks.other" without one).

This module imports nothing heavy (no torch, no vLLM).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

from memtrace.capture import selfcost
from memtrace.plugins.post_import import PostImportFinder

logger = logging.getLogger("memtrace.hooks")

SENTINEL = "__memtrace_hook__"

#: Set to a hook's target path (or handler key) to make its bookkeeping raise: a check that a failing
#: hook never changes the traced program. Used by the integration tests.
FAULT_ENV = "MEMTRACE_FAULT"

_NO_TOKEN = object()
_WRAPPER_CODE: Any = None  # the code of the wrappers _make_wrapper returns (see _drop_inner_wrapper_frames)


class HookTargetError(ValueError):
    """A target string is not of the form ``pkg.mod:func`` or ``pkg.mod:Class.method``."""


@dataclass(frozen=True)
class Target:
    """A function by dotted path: ``module`` is imported, ``qualname`` is looked up in it."""

    module: str
    qualname: str

    @classmethod
    def parse(cls, text: str) -> Target:
        """Parse ``pkg.mod:func`` or ``pkg.mod:Class.method``."""
        mod, sep, qual = text.strip().partition(":")
        parts = qual.split(".")
        if not sep or not mod or not qual or not all(p.isidentifier() for p in parts):
            raise HookTargetError(f"hook target {text!r} is not of the form pkg.mod:func or pkg.mod:Class.method")
        if not all(p.isidentifier() for p in mod.split(".")):
            raise HookTargetError(f"hook target {text!r}: {mod!r} is not a module path")
        return cls(mod, qual)

    @property
    def path(self) -> str:
        return f"{self.module}:{self.qualname}"

    def __str__(self) -> str:
        return self.path


class Handler(Protocol):
    """What runs around a hooked call. ``before`` returns a token handed to ``after``. A handler may
    also name ``cost_source`` ("phases", "flashinfer"...): where its time is charged."""

    key: str

    def before(self, target: Target, args: tuple, kwargs: dict) -> Any: ...

    def after(self, token: Any, result: Any, error: BaseException | None) -> None: ...


# _Hook, _Binding and HookManager are plain classes, not dataclasses: making a dataclass costs ~0.5 ms at import,
# and this module is imported by the vLLM plugin's registration in every vLLM process.
class _Hook:
    __slots__ = ("target", "handler", "key", "logged")

    def __init__(self, target: Target, handler: Handler, key: str) -> None:
        self.target = target
        self.handler = handler
        self.key = key
        self.logged = False


class _Binding:
    __slots__ = ("owner", "name", "original", "wrapper")

    def __init__(self, owner: Any, name: str, original: Any, wrapper: Any) -> None:
        self.owner = owner  # module or class
        self.name = name
        self.original = original  # the raw attribute value (function, staticmethod, classmethod...)
        self.wrapper = wrapper


class _Local(threading.local):
    def __init__(self) -> None:
        self.busy = 0  # >0 while a handler does bookkeeping on this thread
        self.active: dict[str, int] = {}  # handler key -> depth of running wrapped calls


_tls = _Local()


def _reset_after_fork() -> None:
    global _tls
    _tls = _Local()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def _named(target: Target) -> Callable | None:
    """The callable a target names as it stands (maybe wrapped), if its module is imported (None otherwise)."""
    obj: Any = sys.modules.get(target.module)
    for part in target.qualname.split("."):
        obj = getattr(obj, part, None) if obj is not None else None
    return obj if obj is not None and callable(obj) else None


def original_function(target: Target) -> Callable | None:
    """The unwrapped function a target names, if its module is imported (None otherwise)."""
    obj = _named(target)
    if obj is None:
        return None
    import inspect

    return inspect.unwrap(obj)


def call_argument(target: Target, name: str, args: tuple, kwargs: dict) -> Any:
    """The value of parameter ``name`` in a call of ``target``, keyword or positional (None if absent)."""
    if name in kwargs:
        return kwargs[name]
    obj = _named(target)
    if obj is None:
        return None
    position = _positions(obj).get(name)
    if position is not None:
        return args[position] if position < len(args) else None
    import inspect  # a parameter that is not plain positional (``*args``, keyword-only): as Python binds it

    try:
        return inspect.signature(inspect.unwrap(obj)).bind_partial(*args, **kwargs).arguments.get(name)
    except (TypeError, ValueError):
        return None


#: callable -> {name: position} of its parameters that a call may pass by position (``inspect.signature`` is
#: ~20-40 us a call: read once per hooked function, not on every call of it, as vLLM's VMM calls are)
_POSITIONAL: dict[Any, dict[str, int]] = {}


def _positions(obj: Any) -> dict[str, int]:
    found = _POSITIONAL.get(obj)
    if found is None:
        import inspect

        try:
            params = inspect.signature(inspect.unwrap(obj)).parameters.values()
        except (TypeError, ValueError):
            params = ()
        plain = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        found = _POSITIONAL[obj] = {p.name: i for i, p in enumerate(params) if p.kind in plain}
    return found


class HookManager:
    """Installs hooks and keeps what it needs to undo them.

    ``on_error(hook_path, exc)`` is called (once per hook) when a handler fails; ``on_missing(path,
    why)`` when a target's module is imported but the target is not in it.
    """

    def __init__(
        self,
        on_error: Callable[[str, BaseException], None] | None = None,
        on_missing: Callable[[str, str], None] | None = None,
    ) -> None:
        self.on_error = on_error
        self.on_missing = on_missing
        self._hooks: dict[str, list[_Hook]] = {}  # module -> hooks waiting on it
        self._bindings: list[_Binding] = []
        self._done: set[tuple[str, str]] = set()  # (target path, key) patched
        self._lock = threading.RLock()
        self._finder: PostImportFinder | None = None
        self._pending: list[tuple[Any, Any, set[str]]] = []  # (original, wrapper, names) to rebind
        self._batching = 0

    # -- public API ---------------------------------------------------------------------------
    def add(self, target: Target | str, handler: Handler) -> None:
        """Hook ``target``: now if its module is imported, else right after it is."""
        if isinstance(target, str):
            target = Target.parse(target)
        hook = _Hook(target, handler, getattr(handler, "key", target.path))
        with self._lock:
            self._hooks.setdefault(target.module, []).append(hook)
            module = sys.modules.get(target.module)
            if module is not None and getattr(module, "__spec__", None) is not None and not _initializing(module):
                self._apply(hook, module)
                if not self._batching:
                    self._rebind_importers()
            self._ensure_finder()  # its import, or its reload (importlib.reload runs it again: patched again)

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Add several hooks with one pass over ``sys.modules`` for the importers of every function patched
        now, instead of one pass per function."""
        with self._lock:
            self._batching += 1
            try:
                yield
            finally:
                self._batching -= 1
                if not self._batching:
                    self._rebind_importers()

    def unpatch(self) -> None:
        """Restore every binding this manager replaced and stop watching imports."""
        with self._lock:
            for b in reversed(self._bindings):
                current = _own_attr(b.owner, b.name)
                if current is b.wrapper:
                    setattr(b.owner, b.name, b.original)
            self._bindings.clear()
            self._pending.clear()
            self._done.clear()
            self._hooks.clear()
            if self._finder is not None:
                try:
                    sys.meta_path.remove(self._finder)
                except ValueError:
                    pass
                self._finder = None

    # -- patching ------------------------------------------------------------------------------
    def _ensure_finder(self) -> None:
        if self._finder is None or self._finder not in sys.meta_path:
            self._finder = PostImportFinder(self)
            sys.meta_path.insert(0, self._finder)

    def module_imported(self, module: ModuleType) -> None:
        """Apply the hooks waiting on ``module`` (called by the finder after the module executed; the time
        is charged to ``patching`` in :mod:`memtrace.capture.selfcost`)."""
        with selfcost.region(selfcost.PATCHING), self._lock:
            for hook in list(self._hooks.get(module.__name__, ())):
                self._apply(hook, module, executed=True)
            if not self._batching:
                self._rebind_importers(module)

    def _apply(self, hook: _Hook, module: ModuleType, executed: bool = False) -> None:
        """Wrap ``hook``'s target in ``module``. A target patched before is looked at again only when
        ``module`` has just executed (``executed``): ``importlib.reload`` ran it again and redefined the target."""
        done_key = (hook.target.path, hook.key)
        again = done_key in self._done
        if again and not executed:
            return
        try:
            owner, name = _resolve(module, hook.target.qualname)
        except LookupError as exc:
            if not again:
                self._done.add(done_key)  # report once
                self._missing(hook.target.path, str(exc))
            return
        raw = _own_attr(owner, name)
        if getattr(_unwrap_descriptor(raw), SENTINEL, None) is not None:
            self._done.add(done_key)  # someone (maybe us, before a fork) already wrapped it
            return
        wrapper = _wrap_raw(raw, hook, self)
        if wrapper is None:
            self._done.add(done_key)
            self._missing(hook.target.path, f"{type(raw).__name__} is not a function")
            return
        setattr(owner, name, wrapper)
        self._bindings.append(_Binding(owner, name, raw, wrapper))
        self._done.add(done_key)
        if isinstance(owner, ModuleType):
            names = {name, getattr(raw, "__name__", name)}
            self._pending.append((raw, wrapper, names))

    def _rebind_importers(self, just_imported: ModuleType | None = None) -> None:
        """Replace every function patched since the last call in each module that imported it by name
        before the patch (``from mod import func``, or under the name it was patched as): one pass for all
        of them, one dict lookup per module and name, never a walk of a namespace (walking every namespace
        once per function took 50-90 ms a pass over a vLLM process's ~6,000 modules on a 2-core machine).
        A binding under another name (``from lib import work as other``) is not found: it keeps calling
        the original. Which modules are looked at: :func:`_candidates`.
        """
        pending, self._pending = self._pending, []
        if not pending:
            return
        modules = _candidates([original for original, _, _ in pending], just_imported)
        if modules is None:
            modules = list(sys.modules.values())
        checks = [(name, original, wrapper) for original, wrapper, names in pending for name in names]
        wanted = {name for name, _, _ in checks}
        for mod in modules:
            if not isinstance(mod, ModuleType):
                continue
            namespace = vars(mod)  # a module's dict: a lookup runs no module __getattr__ (lazy modules)
            if namespace.keys().isdisjoint(wanted):  # one C-level test for most modules (5x faster than the loop)
                continue
            for name, original, wrapper in checks:
                if namespace.get(name) is original:
                    try:
                        setattr(mod, name, wrapper)
                    except Exception:  # noqa: BLE001 - an odd module (read-only) keeps its binding
                        continue
                    self._bindings.append(_Binding(mod, name, original, wrapper))

    def bypasses(self, chunk: int = 500) -> list[str]:
        """Find, rebind and tell the copies of a patched module-level function that the passes of
        :meth:`_rebind_importers` cannot see (:func:`_candidates`): a module imported before the function's own
        that bound it later by name (a lazy module ``__getattr__`` that caches what it imports, a ``global``
        import inside a function run later), and a function's home module run again by ``importlib.reload``
        after the patch (its new function is not the one wrapped). One look at every module's names, in slices
        of ``chunk`` modules that let other threads run between them (it runs beside the traced program, on
        memtrace's writer); one line a case, naming the hook that calls through the copy may have bypassed.
        """
        with self._lock:
            patched = [
                b for b in self._bindings if isinstance(b.owner, ModuleType) and _own_attr(b.owner, b.name) is b.wrapper
            ]
        if not patched:
            return []
        by_original = {id(b.original): b for b in patched}
        names = {b.name for b in patched} | {getattr(b.original, "__name__", b.name) for b in patched}
        found: list[tuple[ModuleType, str, _Binding]] = []
        modules = list(sys.modules.values())
        for start in range(0, len(modules), chunk):  # 10-25 ms over a vLLM process's ~6,000 modules: in slices
            if start:
                time.sleep(0)  # let the traced program's threads have the GIL between slices
            for mod in modules[start : start + chunk]:
                namespace = getattr(mod, "__dict__", None) if isinstance(mod, ModuleType) else None
                if namespace is None or namespace.keys().isdisjoint(names):
                    continue
                for name in namespace.keys() & names:
                    b = by_original.get(id(namespace.get(name)))
                    if b is not None:
                        found.append((mod, name, b))
        with self._lock:
            notes = []
            for mod, name, b in found:
                if vars(mod).get(name) is not b.original:
                    continue  # changed meanwhile
                path = getattr(b.wrapper, SENTINEL, "?")
                try:
                    setattr(mod, name, b.wrapper)
                    self._bindings.append(_Binding(mod, name, b.original, b.wrapper))
                    done = "rebound now"
                except Exception:  # noqa: BLE001 - an odd module (read-only) keeps its binding
                    done = "left as it is"
                notes.append(
                    f"hook {path} may have been bypassed: {mod.__name__}.{name} held the unwrapped function, bound "
                    f"after the patch's pass looked (a lazy module __getattr__ or an import inside a function); "
                    f"{done}, its calls before are not in the trace"
                )
            seen = set()
            for b in patched:
                home = sys.modules.get(getattr(b.original, "__module__", None) or "")
                fname = getattr(b.original, "__name__", None)
                current = vars(home).get(fname) if home is not None and fname else None
                path = getattr(b.wrapper, SENTINEL, "?")
                if (
                    current is None
                    or current is b.original
                    or current is _innermost(b.original)  # a decorated copy made elsewhere, not a reload
                    or getattr(current, SENTINEL, None) is not None
                    or getattr(current, "__qualname__", None) != getattr(b.original, "__qualname__", None)
                    or (path, home.__name__) in seen
                ):
                    continue
                seen.add((path, home.__name__))
                notes.append(
                    f"hook {path} may be bypassed: {home.__name__} was reloaded after the patch and its new "
                    f"{fname} is not hooked; calls through it are not in the trace"
                )
            return notes

    def _missing(self, path: str, why: str) -> None:
        logger.warning("memtrace: hook target %s not found (%s); continuing without it", path, why)
        if self.on_missing is not None:
            try:
                self.on_missing(path, why)
            except Exception:  # noqa: BLE001 - reporting must never break the program
                logger.debug("memtrace: on_missing failed", exc_info=True)

    def _failed(self, hook: _Hook, exc: BaseException) -> None:
        if hook.logged:
            return
        hook.logged = True
        logger.warning(
            "memtrace: hook %s failed (%s: %s); the call went through unrecorded, later failures are not logged",
            hook.target.path,
            type(exc).__name__,
            exc,
        )
        if self.on_error is not None:
            try:
                self.on_error(hook.target.path, exc)
            except Exception:  # noqa: BLE001
                logger.debug("memtrace: on_error failed", exc_info=True)


def _candidates(functions: list[Any], just_imported: ModuleType | None) -> list[Any] | None:
    """The modules that can hold ``functions`` by name, without looking at the others; None: every module.

    A function defined in module D (its globals are D's, or those of the function it decorates) can only have been bound by a module whose code ran
    after D was first imported: one imported after D (``sys.modules`` keeps insertion order: the entries after
    D's), or one that was running then, inserted before D: on this thread's import chain at that moment. Such a
    module either runs still (its top-level code is on the stack now) or finished since, and then it was
    imported after the deepest module of that chain that runs still. So, read from the end of ``sys.modules``:
    everything back to the first module that runs now (or ``just_imported``, whose post-import hook this is)
    found before every D, plus the modules running now. None (look everywhere) when a function's home is not
    known, or no such module comes before them (a function of a module imported before the chain that runs
    now: torch's, at the plugin's registration). Imports running on other threads meanwhile are not seen.

    Not seen either: a module imported before D whose code bound the function later, outside its top-level
    code (a lazy module ``__getattr__`` that caches what it imported, a ``global`` import inside a function
    run after D's import). :meth:`HookManager.bypasses` finds those, once, and says so in the trace.
    """
    homes = set()
    for func in functions:
        home = sys.modules.get(getattr(func, "__module__", None) or "")
        if home is None or getattr(_innermost(func), "__globals__", None) is not vars(home):
            return None  # made elsewhere, or a borrowed __module__: its home is not known
        homes.add(home.__name__)
    running = _running_modules()
    stops = running | {just_imported.__name__} if just_imported is not None else running
    found: dict[str, Any] = {}
    try:
        for name in reversed(sys.modules):
            found[name] = sys.modules[name]
            homes.discard(name)
            if not homes and name in stops:
                break
        else:
            return None
    except (RuntimeError, KeyError):  # another thread imported meanwhile: look everywhere
        return None
    for name in running:
        if name in sys.modules:
            found[name] = sys.modules[name]
    return list(found.values())


def _innermost(func: Any) -> Any:
    """The function a decorated one wraps (``__wrapped__``, as ``functools.wraps`` sets it): it was defined
    where the decorated one's ``__module__`` says, and the decorated one made after it."""
    for _ in range(32):
        inner = getattr(func, "__wrapped__", None)
        if inner is None:
            return func
        func = inner
    return func


def _running_modules() -> set[str]:
    """The modules whose top-level code runs on this thread now (being imported, or ``__main__``)."""
    names = set()
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>":
            names.add(frame.f_globals.get("__name__"))
        frame = frame.f_back
    return names


def _initializing(module: ModuleType) -> bool:
    spec = getattr(module, "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def _resolve(module: ModuleType, qualname: str) -> tuple[Any, str]:
    parts = qualname.split(".")
    owner: Any = module
    for part in parts[:-1]:
        if not hasattr(owner, part):
            raise LookupError(f"{module.__name__} has no {part!r}")
        owner = getattr(owner, part)
    name = parts[-1]
    if isinstance(owner, ModuleType):
        if name not in vars(owner):
            raise LookupError(f"{module.__name__} has no {name!r}")
    elif isinstance(owner, type):
        if name not in owner.__dict__:
            where = "inherited, not defined here" if hasattr(owner, name) else "absent"
            raise LookupError(f"{owner.__qualname__}.{name} is {where}")
    else:
        raise LookupError(f"{'.'.join(parts[:-1])} is not a class")
    return owner, name


def _own_attr(owner: Any, name: str) -> Any:
    if isinstance(owner, type):
        return owner.__dict__.get(name)
    return vars(owner).get(name)


def _unwrap_descriptor(raw: Any) -> Any:
    if isinstance(raw, (staticmethod, classmethod)):
        return raw.__func__
    return raw


def _wrap_raw(raw: Any, hook: _Hook, manager: HookManager) -> Any:
    func = _unwrap_descriptor(raw)
    if not callable(func):
        return None
    wrapper = _make_wrapper(func, hook, manager)
    if isinstance(raw, staticmethod):
        return staticmethod(wrapper)
    if isinstance(raw, classmethod):
        return classmethod(wrapper)
    return wrapper


def _fault(hook: _Hook) -> None:
    wanted = os.environ.get(FAULT_ENV)
    if wanted and wanted in (hook.target.path, hook.key):
        raise RuntimeError(f"fault injected by {FAULT_ENV}={wanted}")


def _make_wrapper(original: Callable, hook: _Hook, manager: HookManager) -> Callable:
    handler, key = hook.handler, hook.key
    source = f"{selfcost.HOOKS}.{getattr(handler, 'cost_source', None) or 'other'}"
    clock, charge, tally = selfcost.clock, selfcost.charge, selfcost.tally

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # noqa: F841 - pytest and IPython leave this frame out of tracebacks
        local = _tls
        if local.busy or local.active.get(key):
            return original(*args, **kwargs)
        t0 = clock()
        spent = tally()
        inner0 = spent.inner
        token = _NO_TOKEN
        local.busy += 1
        try:
            _fault(hook)
            token = handler.before(hook.target, args, kwargs)
        except Exception as exc:  # noqa: BLE001 - a hook must never break the call
            token = _NO_TOKEN
            manager._failed(hook, exc)
        finally:
            local.busy -= 1
        local.active[key] = local.active.get(key, 0) + 1
        charge(spent, source, t0, inner0)
        try:
            result = original(*args, **kwargs)
        except BaseException as exc:
            t0, inner0 = clock(), spent.inner
            local.active[key] -= 1
            _after(local, hook, manager, token, None, exc)
            _drop_inner_wrapper_frames(exc.__traceback__)
            charge(spent, source, t0, inner0, 0)
            raise  # the program's own exception object, unchanged
        t0, inner0 = clock(), spent.inner
        local.active[key] -= 1
        _after(local, hook, manager, token, result, None)
        charge(spent, source, t0, inner0, 0)
        return result

    setattr(wrapper, SENTINEL, hook.target.path)
    global _WRAPPER_CODE
    _WRAPPER_CODE = wrapper.__code__  # one code object for every wrapper this module makes
    return wrapper


def _drop_inner_wrapper_frames(tb: Any) -> None:
    """Unlink the frames of memtrace wrappers nested below ``tb``'s head from an exception's traceback.

    An exception raised inside two hooked calls (``determine_available_memory`` > ``profile_run``) then
    shows one memtrace frame in the traceback the user reads (the outermost wrapper's, which Python
    adds as the exception leaves it) instead of one per hook. The frames themselves are untouched.
    """
    prev = tb
    while prev is not None and prev.tb_next is not None:
        if prev.tb_next.tb_frame.f_code is _WRAPPER_CODE:
            prev.tb_next = prev.tb_next.tb_next
        else:
            prev = prev.tb_next


def _after(local: _Local, hook: _Hook, manager: HookManager, token: Any, result: Any, error: BaseException | None):
    if token is _NO_TOKEN:
        return
    local.busy += 1
    try:
        hook.handler.after(token, result, error)
    except Exception as exc:  # noqa: BLE001
        manager._failed(hook, exc)
    finally:
        local.busy -= 1
