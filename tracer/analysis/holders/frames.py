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
are kept in the trace (exact) but never blamed. :func:`per_trace` is the memo of a trace's figures (these folders,
its span, its OOM).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

from memtrace import facts as F
from memtrace.model import Frame, Trace, is_python_frame

#: Packages whose frames say nothing about *why* memory was asked for: torch and memtrace itself.
_PLUMBING_PACKAGES = ("torch", "memtrace")
#: The standard library's frames that only pass a call on.
_PLUMBING_FILES = ("<frozen", "/contextlib.py", "/functools.py")
#: Folders a package is installed into, on any machine that recorded a trace.
_INSTALL_DIRS = ("/site-packages/", "/dist-packages/")


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
def _installed_dirs(name: str) -> tuple[str, ...]:
    """Where package ``name`` is installed here, each folder ending in ``/``: through symlinks first, then as
    imported. Found with ``importlib.util.find_spec``, which locates a package without importing it: torch is
    never imported for this. Empty when it is not installed."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return ()
    found = (spec.submodule_search_locations or []) if spec else []
    return tuple(dict.fromkeys(_folder(form(d)) for d in found for form in (os.path.realpath, os.path.abspath)))


@functools.cache
def _local_package_dirs() -> tuple[str, ...]:
    """Where torch and memtrace (its three folders) are installed here (:func:`_installed_dirs`). A user's code
    in a folder that happens to be called ``memtrace``, ``tracer`` or ``torch`` is not under any of them."""
    return tuple(
        d for name in ("torch", "memtrace", "memtrace.plugins", "memtrace.plots") for d in _installed_dirs(name)
    )


#: The libraries whose install folders the recording process states (``facts.INSTALL_PATHS``).
LIBRARIES = ("torch", "vllm", "flashinfer")
#: How a trace's library folders were found: the recording process said where it imported them; the frames
#: of files that exist in the library's own layout here showed it; or neither (path patterns only).
DIRS_RECORDED = "recorded"
DIRS_INFERRED = "the files of its own layout among the frames"
DIRS_PATTERNS = "path patterns (site-packages/torch/)"


@dataclass(frozen=True)
class LibraryDirs:
    """Where the recording process had torch, vLLM and FlashInfer installed: library -> folders, each
    ending in ``/`` (``/tmp/site034/torch/``), and how that is known (``DIRS_*``)."""

    dirs: dict[str, tuple[str, ...]] = field(default_factory=dict)
    source: str = DIRS_PATTERNS

    def library(self, filename: str) -> str | None:
        """The library whose folder holds ``filename``; None when none does."""
        fn = filename.replace("\\", "/")
        return next((name for name, dirs in self.dirs.items() if fn.startswith(dirs)), None)

    def torch_dirs(self) -> tuple[str, ...]:
        return self.dirs.get("torch", ())


#: No folder known: frames are judged by path patterns alone.
NO_DIRS = LibraryDirs()
#: How many traces alive at once a :func:`per_trace` figure is kept for (the oldest leaves first).
MEMO_MAX = 64


def per_trace(fn):
    """``fn(trace)`` computed once a trace (analysis never modifies one), kept in ``.memo`` by the trace's id beside a
    weak reference whose callback (the trace freed) drops the entry, before the id can be another trace's."""
    memo: dict[int, tuple[weakref.ref, object]] = {}

    @functools.wraps(fn)
    def once(trace: Trace):
        key, hit = id(trace), memo.get(id(trace))
        if hit is None or hit[0]() is not trace:
            out = fn(trace)
            while len(memo) >= MEMO_MAX:
                memo.pop(next(iter(memo)), None)
            hit = memo[key] = (weakref.ref(trace, lambda r: memo.get(key, (0,))[0] is r and memo.pop(key, None)), out)
        return hit[1]

    once.memo = memo  # type: ignore[attr-defined]
    return once


@per_trace
def library_dirs(trace: Trace) -> LibraryDirs:
    """Where ``trace``'s process had its libraries: as it recorded them (``facts.INSTALL_PATHS``), else, for
    a trace written before memtrace recorded them, the folders of frames that are certainly the library's
    (:func:`infer_library_dirs`). Computed once a trace; the one source of a trace's library folders, which
    every analysis naming a trace's frame reads (:func:`site_frame`)."""
    recorded = trace.facts.get(F.INSTALL_PATHS)
    if isinstance(recorded, dict) and recorded:
        dirs = {k: (_folder(v),) for k, v in recorded.items() if k in LIBRARIES and isinstance(v, str) and v}
        return LibraryDirs(dirs, DIRS_RECORDED)
    return infer_library_dirs(f.filename for f in trace.frames)


def site_frame(trace: Trace, stack: int) -> Frame | None:
    """The frame shown for ``stack`` of ``trace`` (:func:`meaningful_frame` with the trace's own library folders,
    :func:`library_dirs`); None for no stack (a negative one)."""
    return meaningful_frame(trace.stack_frames(stack), library_dirs(trace)) if stack >= 0 else None


def _folder(path: str) -> str:
    return path.replace("\\", "/").rstrip("/") + "/"


@functools.cache
def _in_layout(name: str, rest: str) -> bool:
    """True when ``rest`` (``utils/_device.py``) is a file of library ``name`` as installed here."""
    here = _installed_dirs(name)
    return bool(here) and "/" in rest and os.path.isfile(here[0] + rest)


def _certain_root(name: str, fn: str) -> str | None:
    """The folder ``.../<name>/`` of frame file ``fn`` when a file at the same place below it exists in the
    library's own layout here (two levels at least: ``utils/_device.py``, never a lone ``app.py``)."""
    seg = f"/{name}/"
    at = fn.rfind(seg)
    while at >= 0:
        if _in_layout(name, fn[at + len(seg) :]):
            return fn[: at + len(seg)]
        at = fn.rfind(seg, 0, at)
    return None


def infer_library_dirs(filenames) -> LibraryDirs:
    """The library folders a trace's frames show: a frame file ``<root>/torch/utils/_device.py`` whose
    ``utils/_device.py`` exists in torch's layout here makes ``<root>/torch/`` torch's; every frame below it is
    then torch's too. Nothing is found for a library not installed here."""
    found: dict[str, set[str]] = {}
    for fn in {f.replace("\\", "/") for f in filenames if f.endswith(".py")}:
        for name in LIBRARIES:
            root = _certain_root(name, fn) if f"/{name}/" in fn else None
            if root is not None:
                found.setdefault(name, set()).add(root)
    if not found:
        return NO_DIRS
    return LibraryDirs({k: tuple(sorted(found[k])) for k in LIBRARIES if k in found}, DIRS_INFERRED)  # one order


def _is_package_plumbing(fn: str, torch_dirs: tuple[str, ...]) -> bool:
    """A frame of torch or memtrace: in the folder the recording process had torch in, in their folders
    installed here, or right below an install folder (``.../site-packages/torch/...``)."""
    if torch_dirs and fn.startswith(torch_dirs):
        return True
    below = [fn[at + len(d) :].split("/", 1)[0] for d in _INSTALL_DIRS if (at := fn.rfind(d)) >= 0]
    return any(p in _PLUMBING_PACKAGES for p in below) or fn.startswith(_local_package_dirs())


def _is_plumbing(f: Frame, torch_dirs: tuple[str, ...]) -> bool:
    fn = f.filename.replace("\\", "/")
    stdlib = "/lib/python3" in fn and not any(d in fn for d in _INSTALL_DIRS)
    return stdlib or any(p in fn for p in _PLUMBING_FILES) or _is_package_plumbing(fn, torch_dirs)


def meaningful_frame(frames: Sequence[Frame], dirs: LibraryDirs | None = None) -> Frame | None:
    """The innermost frame worth showing: the innermost Python frame outside torch (its folder as ``dirs``
    says, :func:`library_dirs`; without ``dirs``, as the stack's own frames show: :func:`_certain_root`),
    memtrace and the standard library; else the innermost Python frame; else a native frame past the
    unwinder and the allocator (:func:`_native_frame`); None for an empty stack."""
    py = [f for f in frames if is_python_frame(f)]
    if dirs is not None:
        torch_dirs = dirs.torch_dirs()
    else:  # the folders this stack's own frames show (infer_library_dirs of one stack)
        torch_dirs = tuple(
            {r for f in py if "/torch/" in f.filename and (r := _certain_root("torch", f.filename.replace("\\", "/")))}
        )
    shown = next((f for f in py if not _is_plumbing(f, torch_dirs)), py[0] if py else None)
    return shown if shown is not None else _native_frame(frames)


def native_name(name: str) -> str:
    """A native frame's function without its arguments and outer namespaces, for a narrow column:
    ``torch::autograd::generated::NllLossBackward0::apply(std::vector<...>&&)`` -> ``NllLossBackward0::apply``."""
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):  # the argument list: the first '(' outside template brackets
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0 and i > 0:
            cut = i
            break
    parts = name[:cut].split("::")
    return "::".join(parts[-2:]) or name


#: Native frames that are the recording machinery or the allocator itself, never the reason.
_NATIVE_PLUMBING = ("torch::unwind", "torch::CapturedTraceback", "torch::cuda::", "c10::")


def _native_frame(frames: Sequence[Frame]) -> Frame | None:
    """For a stack with no Python frame (an autograd engine thread, a C++ extension): the autograd
    node that ran (``DivBackward0::apply``), else the innermost frame past the unwinder and allocator."""
    node = next((f for f in frames if "Backward" in f.name and "::apply" in f.name), None)
    node = node or next((f for f in frames if f.name and not f.name.startswith(_NATIVE_PLUMBING)), None)
    return node or (frames[0] if frames else None)
