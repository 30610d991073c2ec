"""Where the hooks find the copies of a patched function: the modules that imported it by name, found by a
dict lookup per module (never a walk of every namespace), in one pass per module patched; real modules."""

from __future__ import annotations

import importlib
import sys
import textwrap
import uuid

import pytest
from memtrace.plugins import hooks
from memtrace.plugins.hooks import SENTINEL, HookManager


class Counting:
    """A handler that counts the calls it saw."""

    def __init__(self) -> None:
        self.key = f"count-{uuid.uuid4().hex}"
        self.calls = 0

    def before(self, target, args, kwargs):
        self.calls += 1

    def after(self, token, result, error):
        pass


@pytest.fixture
def pkg(tmp_path, monkeypatch):
    """A package: ``lib`` defines ``work``; ``owner`` re-exports it (a vLLM worker module binding a
    function it imported, as gpu_worker binds kernel_warmup); ``user`` and ``alias`` import it by name and
    under another; ``other`` has its own ``work``; ``circ`` defines ``step`` then imports ``late``, which
    imports ``step`` from ``circ`` while ``circ`` is still running."""
    name = f"rebindpkg_{uuid.uuid4().hex[:8]}"
    root = tmp_path / name
    root.mkdir()
    files = {
        "__init__.py": "",
        "lib.py": "def work(x):\n    return x + 1\n",
        "owner.py": "from .lib import work\n\ndef run(x):\n    return work(x)\n",
        "user.py": "from .lib import work\n\ndef call(x):\n    return work(x)\n",
        "alias.py": "from .lib import work as other_name\n",
        "other.py": "def work(x):\n    return x - 1\n",
        "circ.py": "def step(x):\n    return x * 2\n\nfrom . import late  # noqa: E402\n",
        "late.py": "from .circ import step\n\ndef call(x):\n    return step(x)\n",
    }
    for file, text in files.items():
        (root / file).write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[mod]


def _imp(pkg: str, *names: str):
    return [importlib.import_module(f"{pkg}.{n}") for n in names]


def test_only_the_modules_that_imported_the_function_by_name_are_rebound(pkg):
    lib, user, alias, other = _imp(pkg, "lib", "user", "alias", "other")
    original, others_own = lib.work, other.work
    manager = HookManager()
    manager.add(f"{pkg}.lib:work", Counting())
    assert user.work is lib.work is not original
    assert other.work is others_own  # the same name, another function: untouched
    assert alias.other_name is original  # another name is not looked for (documented)
    rebound = sorted((b.owner.__name__, b.name) for b in manager._bindings)
    assert rebound == [(f"{pkg}.lib", "work"), (f"{pkg}.user", "work")]
    manager.unpatch()


def test_patching_twice_is_a_no_op(pkg):
    lib, user = _imp(pkg, "lib", "user")
    handler = Counting()
    manager = HookManager()
    manager.add(f"{pkg}.lib:work", handler)
    wrapper, bindings = lib.work, list(manager._bindings)
    manager.add(f"{pkg}.lib:work", handler)
    HookManager().add(f"{pkg}.lib:work", Counting())  # another manager sees the sentinel
    assert lib.work is wrapper and user.work is wrapper and manager._bindings == bindings
    assert user.call(1) == 2 and handler.calls == 1
    manager.unpatch()


def test_unpatch_restores_the_function_and_every_importer(pkg):
    lib, user = _imp(pkg, "lib", "user")
    original = lib.work
    manager = HookManager()
    manager.add(f"{pkg}.lib:work", Counting())
    manager.unpatch()
    assert lib.work is original and user.work is original
    assert not hasattr(lib.work, SENTINEL)


def test_a_module_imported_after_the_patch_is_patched_by_the_post_import_hook(pkg):
    handler = Counting()
    manager = HookManager()
    manager.add(f"{pkg}.lib:work", handler)
    assert f"{pkg}.lib" not in sys.modules
    (user,) = _imp(pkg, "user")  # imports lib: patched right after it ran, before user binds the name
    assert getattr(user.work, SENTINEL) == f"{pkg}.lib:work"
    assert user.call(1) == 2 and handler.calls == 1
    manager.unpatch()


def test_an_importer_that_bound_the_name_before_the_patch_is_rebound(pkg):
    """The gpu_worker case: the hooked module re-exports a function defined in a module imported before it;
    a module that imported that function earlier calls the hook too."""
    lib, user = _imp(pkg, "lib", "user")  # user bound lib's work before anything was patched
    handler = Counting()
    manager = HookManager()
    manager.add(f"{pkg}.owner:work", handler)  # owner is imported later: post-import hook
    (owner,) = _imp(pkg, "owner")
    assert owner.work is lib.work is user.work
    assert owner.run(1) == 2 and user.call(1) == 2 and handler.calls == 2
    manager.unpatch()
    assert owner.work is lib.work is user.work is not None and not hasattr(user.work, SENTINEL)


def test_a_function_defined_in_the_module_just_imported_is_looked_for_only_in_what_that_import_ran(pkg):
    """circ imports late while it runs, and late binds circ's step: late comes after circ in sys.modules,
    and is rebound; the pass looks at those two, and at the modules whose import runs now (this test's none
    but ``__main__``-like runners), not at the thousands before them."""
    handler = Counting()
    manager = HookManager()
    manager.add(f"{pkg}.circ:step", handler)
    seen: list[list[str]] = []
    real = hooks._candidates

    def spy(functions, just_imported):
        found = real(functions, just_imported)
        seen.append(None if found is None else [m.__name__ for m in found])
        return found

    hooks._candidates = spy
    try:
        circ, late = _imp(pkg, "circ", "late")
    finally:
        hooks._candidates = real
    assert late.step is circ.step and getattr(circ.step, SENTINEL) == f"{pkg}.circ:step"
    assert late.call(3) == 6 and handler.calls == 1
    assert len(seen) == 1 and seen[0][:2] == [f"{pkg}.late", f"{pkg}.circ"]
    assert len(seen[0]) < len(sys.modules) / 10
    manager.unpatch()
    assert not hasattr(late.step, SENTINEL)


def test_a_function_a_running_import_bound_before_the_patched_module_ran_is_rebound(tmp_path, monkeypatch):
    """The vLLM worker's case: ``outer`` (still running) imports ``lib`` (which defines ``work``) and binds
    it, then ``done`` binds it and finishes, then ``outer`` imports ``owner``, whose hook patches ``work``:
    ``outer`` (running) and ``done`` (finished, imported after ``outer``) are rebound, and nothing before
    ``outer`` is looked at."""
    name = f"chainpkg_{uuid.uuid4().hex[:8]}"
    root = tmp_path / name
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "lib.py").write_text("def work(x):\n    return x + 1\n")
    (root / "done.py").write_text("from .lib import work\n")
    (root / "owner.py").write_text("from .lib import work\n")
    (root / "outer.py").write_text(
        "from .lib import work\nfrom . import done\nfrom . import owner\nAFTER = (work, done.work, owner.work)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    handler = Counting()
    manager = HookManager()
    manager.add(f"{name}.owner:work", handler)
    seen: list = []
    real = hooks._candidates

    def spy(functions, just_imported):
        found = real(functions, just_imported)
        seen.append(None if found is None else {m.__name__ for m in found})
        return found

    hooks._candidates = spy
    try:
        outer = importlib.import_module(f"{name}.outer")
    finally:
        hooks._candidates = real
        for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[mod]
    work, done_work, owner_work = outer.AFTER
    assert getattr(owner_work, SENTINEL) == f"{name}.owner:work"
    assert work is owner_work and done_work is owner_work and outer.work is owner_work
    assert seen[0] is not None and {f"{name}.outer", f"{name}.done", f"{name}.lib"} <= seen[0]
    assert len(seen[0]) < len(sys.modules) / 10
    manager.unpatch()


def test_a_batch_rebinds_every_function_in_one_pass_when_it_ends(pkg):
    lib, user, circ, late = _imp(pkg, "lib", "user", "circ", "late")
    passes = []
    manager = HookManager()
    real = manager._rebind_importers

    def counting_pass(just_imported=None):
        passes.append(len(manager._pending))
        real(just_imported)

    manager._rebind_importers = counting_pass
    with manager.batch():
        manager.add(f"{pkg}.lib:work", Counting())
        manager.add(f"{pkg}.circ:step", Counting())
        assert hasattr(lib.work, SENTINEL) and not hasattr(user.work, SENTINEL)  # not yet
    assert passes == [2]
    assert user.work is lib.work and late.step is circ.step
    manager.unpatch()


def _package(tmp_path, monkeypatch, prefix: str, files: dict[str, str]) -> str:
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    root = tmp_path / name
    root.mkdir()
    (root / "__init__.py").write_text("")
    for file, text in files.items():
        (root / file).write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def _forget(name: str) -> None:
    for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[mod]


#: ``outer`` (still running when the hook fires) makes ``early`` (imported before it, finished) bind ``lib``'s
#: ``work`` through code that runs after ``early``'s import, then imports ``owner``, whose hook patches ``work``:
#: the pass looks back to ``outer`` only, so ``early``'s copy is not seen by it.
_LATE_BINDERS = {
    "lib.py": "def work(x):\n    return x + 1\n",
    "owner.py": "from .lib import work\n",
    "lazy.py": """
        def __getattr__(name):  # a lazy module: imports on first use and caches, as transformers' and vLLM's
            if name == "work":
                from .lib import work
                globals()["work"] = work
                return work
            raise AttributeError(name)

        def call(x):
            return globals()["work"](x)
        """,
    "glob.py": """
        def setup():
            global work
            from .lib import work

        def call(x):
            return work(x)
        """,
}


def test_a_copy_bound_by_a_lazy_getattr_before_the_patch_is_found_rebound_and_named(tmp_path, monkeypatch):
    name = _package(
        tmp_path,
        monkeypatch,
        "lazypkg",
        {**_LATE_BINDERS, "outer.py": "from . import lazy\nlazy.work\nfrom . import owner\n"},
    )
    handler = Counting()
    manager = HookManager()
    manager.add(f"{name}.owner:work", handler)
    try:
        lazy = importlib.import_module(f"{name}.lazy")  # imported before outer: outside the pass's window
        importlib.import_module(f"{name}.outer")
        owner = sys.modules[f"{name}.owner"]
        assert hasattr(owner.work, SENTINEL) and vars(lazy)["work"] is not owner.work  # the pass missed it
        notes = manager.bypasses()
        assert notes == [
            f"hook {name}.owner:work may have been bypassed: {name}.lazy.work held the unwrapped function, bound "
            "after the patch's pass looked (a lazy module __getattr__ or an import inside a function); rebound "
            "now, its calls before are not in the trace"
        ]
        assert lazy.call(1) == 2 and handler.calls == 1  # rebound: its calls are recorded from now on
        assert manager.bypasses() == []  # told once
        manager.unpatch()
        assert not hasattr(vars(lazy)["work"], SENTINEL)  # the late rebinding is undone too
    finally:
        manager.unpatch()
        _forget(name)


def test_a_copy_bound_by_a_global_import_in_a_function_before_the_patch_is_found_and_named(tmp_path, monkeypatch):
    name = _package(
        tmp_path,
        monkeypatch,
        "globpkg",
        {**_LATE_BINDERS, "outer.py": "from . import glob\nglob.setup()\nfrom . import owner\n"},
    )
    handler = Counting()
    manager = HookManager()
    manager.add(f"{name}.owner:work", handler)
    try:
        glob = importlib.import_module(f"{name}.glob")
        importlib.import_module(f"{name}.outer")
        assert not hasattr(glob.work, SENTINEL)
        (note,) = manager.bypasses()
        assert note.startswith(f"hook {name}.owner:work may have been bypassed: {name}.glob.work held")
        assert glob.call(1) == 2 and handler.calls == 1
    finally:
        manager.unpatch()
        _forget(name)


def test_reloading_the_hooked_module_patches_the_function_it_defines_again(pkg):
    (lib,) = _imp(pkg, "lib")
    handler = Counting()
    manager = HookManager()
    manager.add(f"{pkg}.lib:work", handler)
    first = lib.work
    importlib.reload(lib)  # runs lib again: a new, unwrapped work
    assert lib.work is not first and getattr(lib.work, SENTINEL) == f"{pkg}.lib:work"
    (user,) = _imp(pkg, "user")
    assert user.call(1) == 2 and lib.work(1) == 2 and handler.calls == 2
    assert manager.bypasses() == []
    manager.unpatch()
    assert not hasattr(lib.work, SENTINEL)


def test_reloading_the_home_of_a_re_exported_hooked_function_is_named(pkg):
    """The hook is on ``owner:work``, defined in ``lib``: reloading ``lib`` makes a new ``work`` nobody hooked,
    which a module importing it from ``lib`` afterwards calls; memtrace cannot follow it, and says so."""
    lib, owner = _imp(pkg, "lib", "owner")
    manager = HookManager()
    manager.add(f"{pkg}.owner:work", Counting())
    assert hasattr(lib.work, SENTINEL)
    importlib.reload(lib)
    assert manager.bypasses() == [
        f"hook {pkg}.owner:work may be bypassed: {pkg}.lib was reloaded after the patch and its new work is not "
        "hooked; calls through it are not in the trace"
    ]
    manager.unpatch()
