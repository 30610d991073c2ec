"""The function-hook mechanism: patch by dotted path before or after import, everywhere, once, undoably."""

from __future__ import annotations

import importlib
import logging
import sys
import textwrap
import traceback
import uuid

import pytest
from memtrace.plugins import hooks
from memtrace.plugins.hooks import SENTINEL, HookManager, HookTargetError, Target


class Recorder:
    """A handler that records (event, args) and can be told to fail."""

    def __init__(self, key: str = "", fail_before: bool = False, fail_after: bool = False):
        self.key = key or f"rec-{uuid.uuid4().hex}"
        self.events: list[tuple] = []
        self.fail_before = fail_before
        self.fail_after = fail_after

    def before(self, target, args, kwargs):
        if self.fail_before:
            raise ValueError("bookkeeping broke")
        self.events.append(("before", target.path, args, dict(kwargs)))
        return len(self.events)

    def after(self, token, result, error):
        if self.fail_after:
            raise ValueError("bookkeeping broke after")
        self.events.append(("after", token, result, type(error).__name__ if error else None))


@pytest.fixture
def pkg(tmp_path, monkeypatch):
    """A fresh package on sys.path: ``<name>.lib`` defines functions and classes, ``<name>.user``
    imports ``work`` by name. Returns the package name; modules are removed afterwards."""
    name = f"hookpkg_{uuid.uuid4().hex[:8]}"
    root = tmp_path / name
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "lib.py").write_text(
        textwrap.dedent(
            '''
            def work(x, y=1):
                """Adds."""
                return x + y

            def boom():
                raise KeyError("inner")

            def recurse(n):
                return 0 if n == 0 else 1 + recurse(n - 1)

            class Base:
                def method(self, v):
                    return v * 2

                @staticmethod
                def static(v):
                    return v + 100

                @classmethod
                def klass(cls, v):
                    return (cls.__name__, v)

            class Sub(Base):
                def method(self, v):
                    return super().method(v) + 1

            class Child(Base):
                pass
            '''
        )
    )
    (root / "user.py").write_text("from .lib import work\n\ndef call(x):\n    return work(x)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[mod]


def test_target_parses_function_and_method_paths():
    assert Target.parse("a.b:f") == Target("a.b", "f")
    assert Target.parse(" a.b:C.m ").path == "a.b:C.m"
    for bad in ("a.b", "a.b:", ":f", "a.b:C..m", "a b:f", "a.b:1f"):
        with pytest.raises(HookTargetError):
            Target.parse(bad)


def test_a_target_hooked_before_its_module_is_imported_is_patched_on_import(pkg):
    rec = Recorder()
    manager = HookManager()
    manager.add(f"{pkg}.lib:work", rec)
    assert f"{pkg}.lib" not in sys.modules
    lib = importlib.import_module(f"{pkg}.lib")
    assert lib.work(2, y=3) == 5
    assert rec.events == [("before", f"{pkg}.lib:work", (2,), {"y": 3}), ("after", 1, 5, None)]
    assert [path for path, _ in manager._done] == [f"{pkg}.lib:work"]  # patched once
    manager.unpatch()


def test_modules_that_imported_the_function_by_name_are_rebound(pkg):
    user = importlib.import_module(f"{pkg}.user")  # binds the original `work` by name
    lib = sys.modules[f"{pkg}.lib"]
    original = lib.work
    rec = Recorder()
    manager = HookManager()
    manager.add(f"{pkg}.lib:work", rec)
    assert user.work is lib.work is not original
    assert user.call(4) == 5
    assert [e[0] for e in rec.events] == ["before", "after"]
    manager.unpatch()
    assert user.work is original and lib.work is original


def test_patching_twice_wraps_once(pkg):
    lib = importlib.import_module(f"{pkg}.lib")
    rec = Recorder()
    manager = HookManager()
    manager.add(f"{pkg}.lib:work", rec)
    manager.add(f"{pkg}.lib:work", rec)
    HookManager().add(f"{pkg}.lib:work", Recorder())  # another manager sees the sentinel
    assert lib.work(1) == 2
    assert len(rec.events) == 2
    assert getattr(lib.work, SENTINEL) == f"{pkg}.lib:work"
    manager.unpatch()


def test_wrapper_keeps_name_doc_and_wrapped(pkg):
    lib = importlib.import_module(f"{pkg}.lib")
    original = lib.work
    manager = HookManager()
    manager.add(f"{pkg}.lib:work", Recorder())
    assert lib.work.__name__ == "work" and lib.work.__doc__ == "Adds."
    assert lib.work.__wrapped__ is original
    manager.unpatch()


def test_only_a_class_own_methods_are_wrapped(pkg):
    lib = importlib.import_module(f"{pkg}.lib")
    missing = []
    manager = HookManager(on_missing=lambda path, why: missing.append((path, why)))
    rec = Recorder(key="method")
    manager.add(f"{pkg}.lib:Base.method", rec)
    manager.add(f"{pkg}.lib:Child.method", rec)  # inherited: reported, not wrapped
    assert "method" not in lib.Child.__dict__
    assert missing == [(f"{pkg}.lib:Child.method", "Child.method is inherited, not defined here")]
    assert lib.Child().method(3) == 6
    assert len(rec.events) == 2
    manager.unpatch()


def test_a_subclass_calling_its_base_is_one_call_for_a_shared_key(pkg):
    lib = importlib.import_module(f"{pkg}.lib")
    rec = Recorder(key="phase")
    manager = HookManager()
    manager.add(f"{pkg}.lib:Base.method", rec)
    manager.add(f"{pkg}.lib:Sub.method", rec)
    assert lib.Sub().method(5) == 11
    assert [e[0] for e in rec.events] == ["before", "after"]
    assert rec.events[0][1] == f"{pkg}.lib:Sub.method"
    manager.unpatch()


def test_recursive_calls_are_recorded_once(pkg):
    lib = importlib.import_module(f"{pkg}.lib")
    rec = Recorder()
    manager = HookManager()
    manager.add(f"{pkg}.lib:recurse", rec)
    assert lib.recurse(5) == 5
    assert len(rec.events) == 2
    manager.unpatch()


def test_static_and_class_methods_keep_their_kind(pkg):
    lib = importlib.import_module(f"{pkg}.lib")
    manager = HookManager()
    manager.add(f"{pkg}.lib:Base.static", Recorder())
    manager.add(f"{pkg}.lib:Base.klass", Recorder())
    assert isinstance(lib.Base.__dict__["static"], staticmethod)
    assert lib.Base.static(1) == 101 and lib.Base().static(2) == 102
    assert lib.Sub.klass(7) == ("Sub", 7)
    manager.unpatch()
    assert not hasattr(lib.Base.__dict__["static"].__func__, SENTINEL)


def test_an_exception_of_the_original_propagates_and_reaches_after(pkg):
    lib = importlib.import_module(f"{pkg}.lib")
    rec = Recorder()
    manager = HookManager()
    manager.add(f"{pkg}.lib:boom", rec)
    with pytest.raises(KeyError, match="inner"):
        lib.boom()
    assert rec.events[-1] == ("after", 1, None, "KeyError")
    manager.unpatch()


def test_an_error_through_nested_hooks_is_the_same_object_with_one_memtrace_frame(pkg):
    """vLLM's OOM traceback (determine_available_memory > profile_run, both hooked) showed memtrace's
    wrapper twice; now the exception object is the program's own and one wrapper frame remains."""
    importlib.import_module(f"{pkg}.lib")
    user = importlib.import_module(f"{pkg}.user")
    manager = HookManager()
    manager.add(f"{pkg}.lib:work", Recorder())
    manager.add(f"{pkg}.user:call", Recorder())
    err = MemoryError("CUDA out of memory. Tried to allocate 60.00 MiB")

    class Tensor:
        def __add__(self, other):
            raise err

    with pytest.raises(MemoryError) as info:
        user.call(Tensor())
    assert info.value is err and err.__cause__ is None and err.__context__ is None
    frames = traceback.extract_tb(err.__traceback__)
    ours = [f for f in frames if f.filename == hooks.__file__]
    assert len(ours) == 1 and ours[0].name == "wrapper"
    assert [f.name for f in frames if f.filename != hooks.__file__][-3:] == ["call", "work", "__add__"]
    manager.unpatch()


def test_failing_bookkeeping_is_logged_once_and_the_call_goes_through(pkg, caplog):
    lib = importlib.import_module(f"{pkg}.lib")
    errors = []
    manager = HookManager(on_error=lambda path, exc: errors.append((path, str(exc))))
    manager.add(f"{pkg}.lib:work", Recorder(fail_before=True))
    manager.add(f"{pkg}.lib:Base.method", Recorder(fail_after=True))
    with caplog.at_level(logging.WARNING, logger="memtrace"):
        assert [lib.work(i) for i in range(5)] == [1, 2, 3, 4, 5]
        assert [lib.Base().method(i) for i in range(3)] == [0, 2, 4]
    failures = [r for r in caplog.records if "failed" in r.getMessage()]
    assert len(failures) == 2
    assert errors == [(f"{pkg}.lib:work", "bookkeeping broke"), (f"{pkg}.lib:Base.method", "bookkeeping broke after")]
    manager.unpatch()


def test_fault_injection_env_breaks_only_the_named_hook(pkg, monkeypatch, caplog):
    lib = importlib.import_module(f"{pkg}.lib")
    monkeypatch.setenv("MEMTRACE_FAULT", f"{pkg}.lib:work")
    ok = Recorder()
    manager = HookManager()
    manager.add(f"{pkg}.lib:work", Recorder())
    manager.add(f"{pkg}.lib:recurse", ok)
    with caplog.at_level(logging.WARNING, logger="memtrace"):
        assert lib.work(1) == 2 and lib.work(2) == 3
        assert lib.recurse(2) == 2
    assert sum("fault injected by MEMTRACE_FAULT" in r.getMessage() for r in caplog.records) == 1
    assert len(ok.events) == 2
    manager.unpatch()


def test_unpatch_restores_classes_and_stops_watching_imports(pkg):
    manager = HookManager()
    manager.add(f"{pkg}.lib:Base.method", Recorder())
    assert any(type(f).__name__ == "PostImportFinder" for f in sys.meta_path)
    lib = importlib.import_module(f"{pkg}.lib")
    assert hasattr(lib.Base.__dict__["method"], SENTINEL)
    manager.unpatch()
    assert not hasattr(lib.Base.__dict__["method"], SENTINEL)
    assert not any(getattr(f, "_manager", None) is manager for f in sys.meta_path)


def test_a_missing_function_in_an_imported_module_is_reported_not_raised(pkg):
    importlib.import_module(f"{pkg}.lib")
    missing = []
    manager = HookManager(on_missing=lambda path, why: missing.append(path))
    manager.add(f"{pkg}.lib:nope", Recorder())
    manager.add(f"{pkg}.lib:Nope.m", Recorder())
    assert missing == [f"{pkg}.lib:nope", f"{pkg}.lib:Nope.m"]
    manager.unpatch()


def test_imported_module_is_the_real_one_after_post_import_patching(pkg):
    manager = HookManager()
    manager.add(f"{pkg}.lib:work", Recorder())
    lib = importlib.import_module(f"{pkg}.lib")
    assert type(lib.__loader__).__name__ == "SourceFileLoader"
    assert "exec_module" not in vars(lib.__loader__)  # the one-shot hook removed itself
    import inspect

    assert "def work" in inspect.getsource(lib)
    manager.unpatch()
