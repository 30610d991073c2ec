"""The post-import hook of :mod:`.hooks`: patch a module right after it executes, whoever imports it.

A :class:`PostImportFinder` sits first in ``sys.meta_path`` and finds nothing itself. For a module a
manager watches, it asks the other finders for the spec and gives that spec's loader a one-shot
``exec_module`` that runs the real one, removes itself (the loader is pristine again: ``inspect``,
``linecache`` and ``importlib.resources`` see an ordinary loader) and calls
``manager.module_imported(module)``. Nothing here may break an import: any error means the module
is imported normally, unpatched, with one log line.
"""

from __future__ import annotations

import importlib.machinery
import logging
import sys
import threading
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memtrace.plugins.hooks import HookManager

logger = logging.getLogger("memtrace.hooks")


#: loaders created for one module each: safe to give one of them a one-shot exec_module
_PER_MODULE_LOADERS = (
    importlib.machinery.SourceFileLoader,
    importlib.machinery.SourcelessFileLoader,
    importlib.machinery.ExtensionFileLoader,
)


class PostImportFinder:
    """A ``sys.meta_path`` entry that finds nothing itself: for a watched module it asks the other
    finders for the spec, then makes that one import call back the manager after the module ran."""

    def __init__(self, manager: HookManager):
        self._manager = manager
        self._searching = threading.local()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in self._manager._hooks or getattr(self._searching, "name", None) == fullname:
            return None
        self._searching.name = fullname
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                _watch_exec(spec.loader, self._manager)
            return spec
        except Exception:  # noqa: BLE001 - never break an import: let the normal finders do it
            logger.warning("memtrace: cannot watch the import of %s; its hooks are skipped", fullname, exc_info=True)
            return None
        finally:
            self._searching.name = None

    def invalidate_caches(self) -> None:
        pass


def _watch_exec(loader: Any, manager: HookManager) -> None:
    """Make ``loader.exec_module`` call the manager once after it ran, then restore the loader."""
    if not isinstance(loader, _PER_MODULE_LOADERS):
        # shared loaders (builtin, frozen, zip) are not touched: patch on the next add() instead
        return
    original = loader.exec_module

    def exec_module(module: ModuleType) -> None:
        try:
            del loader.exec_module  # back to the class's method: this loader is pristine again
        except AttributeError:
            pass
        original(module)
        try:
            manager.module_imported(module)
        except Exception:  # noqa: BLE001 - patching must never break an import
            logger.warning("memtrace: patching %s failed; continuing without its hooks", module.__name__, exc_info=True)

    loader.exec_module = exec_module
