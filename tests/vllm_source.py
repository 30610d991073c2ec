"""Whether a hook target (``pkg.mod:func`` / ``pkg.mod:Class.method``) is defined in a vLLM source tree.

Read with ``ast``, never imported: a class's own method, or a module-level name (a ``def`` or a name
imported into the module, as ``gpu_worker`` imports ``kernel_warmup``). Used by the unit test against the
installed vLLM (``memtrace doctor`` does the same for any release: ``memtrace.plugins.doctor``).
"""

from __future__ import annotations

import ast
from pathlib import Path


def module_file(root: Path, module: str) -> Path | None:
    """The source file of ``module`` under ``root`` (the folder holding the top-level package)."""
    base = root.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def defined_in(source: Path | None, qualname: str) -> bool:
    """Whether ``qualname`` is defined in the module whose source is ``source`` (False when None)."""
    if source is None:
        return False
    tree = ast.parse(source.read_text())
    parts = qualname.split(".")
    for node in tree.body:
        if len(parts) == 1:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == parts[0]:
                return True
            if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == parts[0] for a in node.names):
                return True
        elif isinstance(node, ast.ClassDef) and node.name == parts[0]:
            return any(isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and m.name == parts[1] for m in node.body)
    return False


def target_defined(root: Path, path: str) -> bool:
    """Whether the target ``path`` is defined in the vLLM source tree under ``root``."""
    module, qual = path.split(":")
    return defined_in(module_file(root, module), qual)
