"""Which frames of a recorded stack say who asked for memory: Python frames, then the one worth showing.

PyTorch records stacks two ways (``_record_memory_history(stacks=...)``):

- ``"python"``: Python frames only (``.py`` files, ``<frozen ...>``, ``<string>``), innermost first;
- ``"all"``: the native stack as well, innermost first: the unwinder itself (``??:0
  torch::unwind::unwind()``), the caching allocator, ATen and the dispatcher (``.cpp``, ``.h``,
  ``??``), CPython's interpreter (``Objects/methodobject.c cfunction_call``, ``Python/ceval.c``)
  with the Python frames interleaved where the interpreter ran them, the C runtime (``_start``,
  ``__libc_start_main``), and the outermost Python frames appended after ``_start``.

Attribution (holders, flame graphs, diffs) is about the program's Python code, so every analysis
that names a frame goes through :func:`python_frames` / :func:`meaningful_frame`: the native frames
are kept in the trace (exact) but never blamed.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Sequence

from memtrace.model import Frame

#: File endings of native (C, C++, CUDA) frames and of shared objects.
_NATIVE_SUFFIXES = (".c", ".h", ".cc", ".cpp", ".cxx", ".hpp", ".hh", ".cu", ".cuh", ".so", ".S", ".s")
#: Packages whose frames say nothing about *why* memory was asked for: torch and memtrace itself.
_PLUMBING_PACKAGES = ("torch", "memtrace")
#: The standard library's frames that only pass a call on.
_PLUMBING_FILES = ("<frozen", "/contextlib.py", "/functools.py")
#: Folders a package is installed into, on any machine that recorded a trace.
_INSTALL_DIRS = ("/site-packages/", "/dist-packages/")


def is_python_frame(f: Frame) -> bool:
    """True for a frame of Python code: a ``.py`` file or a pseudo-file such as ``<string>``."""
    fn = f.filename
    if not fn or fn == "??":
        return False
    if fn.endswith((".py", ".pyw")) or (fn.startswith("<") and fn.endswith(">")):
        return True
    if fn.endswith(_NATIVE_SUFFIXES) or "::" in f.name:
        return False
    base = fn.rsplit("/", 1)[-1].rsplit("\\", 1)[-1]
    return f.line > 0 and "." not in base  # an extension-less script (a console entry point)


def is_native_frame(f: Frame) -> bool:
    """True for a frame of native code (what only ``stacks="all"`` records)."""
    return not is_python_frame(f)


def stacks_kind(frames: Sequence[Frame]) -> str:
    """``"all"`` when any frame is native, ``"python"`` when there are frames, else ``"none"``."""
    if not frames:
        return "none"
    return "all" if any(is_native_frame(f) for f in frames) else "python"


def python_frames(frames: Sequence[Frame]) -> list[Frame]:
    """The Python frames of a stack, innermost first. A stack with none (an autograd engine
    thread) keeps its native frames from :func:`meaningful_frame`'s choice outwards: the unwinder
    and the allocator below it are dropped."""
    kept = [f for f in frames if is_python_frame(f)]
    if kept:
        return kept
    leaf = _native_frame(frames)
    return list(frames[frames.index(leaf) :]) if leaf is not None else []


@functools.cache
def _local_package_dirs() -> tuple[str, ...]:
    """Where torch and memtrace (its three folders) are installed here, each ending in ``/``.

    Found with ``importlib.util.find_spec``, which locates a package without importing it: torch is
    never imported for this. A user's code in a folder that happens to be called ``memtrace``,
    ``tracer`` or ``torch`` is not under any of them.
    """
    dirs = []
    for name in ("torch", "memtrace", "memtrace.plugins", "memtrace.plots"):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        for d in (spec.submodule_search_locations or []) if spec else []:
            for form in {os.path.abspath(d), os.path.realpath(d)}:  # as imported, and through symlinks
                dirs.append(form.replace("\\", "/").rstrip("/") + "/")
    return tuple(dirs)


def _is_package_plumbing(fn: str) -> bool:
    """A frame of torch or memtrace: in their folders installed here, or (a trace recorded elsewhere)
    right below an install folder (``.../site-packages/torch/...``)."""
    for d in _INSTALL_DIRS:
        at = fn.rfind(d)
        if at >= 0 and fn[at + len(d) :].split("/", 1)[0] in _PLUMBING_PACKAGES:
            return True
    return fn.startswith(_local_package_dirs())


def _is_plumbing(f: Frame) -> bool:
    fn = f.filename.replace("\\", "/")
    if any(p in fn for p in _PLUMBING_FILES) or _is_package_plumbing(fn):
        return True
    return "/lib/python3" in fn and not any(d in fn for d in _INSTALL_DIRS)


def meaningful_frame(frames: Sequence[Frame]) -> Frame | None:
    """The innermost frame worth showing: the innermost Python frame outside torch, memtrace and the
    standard library; else the innermost Python frame; else a native frame past the unwinder and the
    allocator (:func:`_native_frame`); None for an empty stack."""
    py = [f for f in frames if is_python_frame(f)]
    for f in py:
        if not _is_plumbing(f):
            return f
    if py:
        return py[0]
    return _native_frame(frames)


#: Native frames that are the recording machinery or the allocator itself, never the reason.
_NATIVE_PLUMBING = ("torch::unwind", "torch::CapturedTraceback", "torch::cuda::", "c10::")


def _native_frame(frames: Sequence[Frame]) -> Frame | None:
    """For a stack with no Python frame (an autograd engine thread, a C++ extension): the autograd
    node that ran (``DivBackward0::apply``), else the innermost frame past the unwinder and allocator."""
    for f in frames:
        if "Backward" in f.name and "::apply" in f.name:
            return f
    for f in frames:
        if f.name and not f.name.startswith(_NATIVE_PLUMBING):
            return f
    return frames[0] if frames else None
