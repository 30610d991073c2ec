"""TEST-ONLY: run ``patch(module)`` right after ``name`` is first imported (the worker shims' one mechanism)."""

import importlib.abc
import importlib.util
import sys


def after_import(name: str, patch) -> None:
    """Once ``name`` is imported anywhere in this process, call ``patch`` on the fresh module."""

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path, target=None):
            if fullname != name:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(fullname)
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                patch(module)

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _Finder())
