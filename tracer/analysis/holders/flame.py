"""The memory live at one moment, grouped by allocating stack: a tree for flame graphs.

Every live PyTorch allocation (``live.live_allocations_at``) adds its requested bytes to one path of frames,
root → leaf; with ``non_torch``, the non-PyTorch allocations CUPTI saw live go under ``[non-PyTorch, CUPTI]``
then their category, and the KV cache vLLM (0.34+) committed through CUDA's VMM API under ``[KV cache outside
PyTorch (CUDA VMM)]``, each then by its Python stack. Each part equals its curve at that moment to the byte
(``Flame.torch_bytes``: ``Curves.allocated``; ``non_torch_bytes``: ``breakdown``'s ``cupti_bytes``;
``vmm_bytes``: the KV cache's committed curve), and folded lines add up to their sum.

Frames are labelled ``function (path/file.py:line)`` (:func:`frame_label`). A hooked call running when the
allocation was made gets a frame ``[hook] name`` in place of memtrace's own wrapper frames, which are dropped
from every stack. No stack: ``[no stack recorded]`` then the phase (``[phase] kv_cache_init``); blocks from
before recording: ``[present before recording began]``; a block the user annotated gets its note as a leaf,
``[note] result of step 1``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
from memtrace.analysis.holders.frames import python_frames
from memtrace.analysis.holders.live import Lifetimes, LiveAllocation, lifetimes, live_allocations_at
from memtrace.analysis.memory import non_torch as _non_torch
from memtrace.analysis.memory import vmm as _vmm
from memtrace.analysis.memory.phases import path_at
from memtrace.analysis.memory.quantities import BEFORE_RECORDING as BEFORE
from memtrace.analysis.memory.quantities import VMM
from memtrace.analysis.memory.user_metadata import TensorNote, notes_by_block, tensor_notes
from memtrace.model import Frame, HookCall, Trace

#: The top-level frame of the non-PyTorch device memory CUPTI saw (``non_torch.live_allocations``).
NON_TORCH = "[non-PyTorch, CUPTI]"
#: The top-level frame of the KV cache committed through CUDA's VMM API (``vmm.live_kv_chunks``).
VMM_KV = f"[{VMM.label}]"  # the vocabulary's names (analysis.quantities), framed
NO_STACK = "[no stack recorded]"
BEFORE_RECORDING = f"[{BEFORE.label}]"
HOOK_PREFIX = "[hook] "
PHASE_PREFIX = "[phase] "
#: The leaf of a block the user annotated (``user_metadata.tensor_notes``).
NOTE_PREFIX = "[note] "
#: Files of memtrace's own hook wrappers: replaced by the ``[hook]`` frame.
_WRAPPER_FILES = ("memtrace/plugins/hooks.py", "plugins/hooks.py")
_CUT_AFTER = ("site-packages/", "dist-packages/")
_PACKAGE_ROOTS = ("vllm/", "flashinfer/", "torch/", "transformers/", "triton/", "b12x/", "memtrace/")


@dataclass
class FlameNode:
    """One frame of the tree. ``total_bytes`` includes the children; ``self_bytes`` ends here."""

    name: str
    total_bytes: int = 0
    self_bytes: int = 0
    count: int = 0  # allocations at or below this frame
    children: dict[str, FlameNode] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        """ "hook", "marker" (a bracketed pseudo-frame) or "frame"."""
        return "hook" if self.name.startswith(HOOK_PREFIX) else "marker" if self.name.startswith("[") else "frame"

    def sorted_children(self) -> list[FlameNode]:
        """Children, widest first (ties by name, so output is deterministic)."""
        return sorted(self.children.values(), key=lambda c: (-c.total_bytes, c.name))


@dataclass(frozen=True)
class Flame:
    """Live memory at one moment as a tree; ``root.total_bytes`` is the live total, which is
    ``torch_bytes`` + ``non_torch_bytes`` (the latter None when CUPTI recorded nothing, or was left out)."""

    time_us: int
    event_index: int | None  # the state right after this event, when the moment is an event
    root: FlameNode
    stacks: dict[tuple[str, ...], int]  # root→leaf frame labels -> bytes (the folded form)
    since_us: int | None = None  # only allocations made at or after this moment (None: every live one)
    #: PyTorch's live requested bytes in the tree (``Curves.allocated`` at that moment, unless ``since_us``)
    torch_bytes: int = 0
    #: the non-PyTorch bytes CUPTI saw live, under :data:`NON_TORCH` (``breakdown``'s ``cupti_bytes``);
    #: None when the trace holds no CUPTI records or they were left out
    non_torch_bytes: int | None = None
    #: the KV cache committed through CUDA's VMM API then, under :data:`VMM_KV`; None when there is none
    #: (before vLLM 0.34, nothing committed at that moment) or it was left out
    vmm_bytes: int | None = None

    @property
    def total_bytes(self) -> int:
        return self.root.total_bytes


def frame_label(frame: Frame) -> str:
    """``function (vllm/v1/worker/gpu_worker.py:406)``: the path from the package root (after
    ``site-packages/``, else at a known package such as ``vllm/``), else its last two parts.
    ';' is replaced (it separates folded frames)."""
    path = frame.filename.replace("\\", "/")
    for marker in _CUT_AFTER:
        k = path.rfind(marker)
        if k >= 0:
            path = path[k + len(marker) :]
            break
    else:
        roots = [k for k in (path.find(f"/{r}") for r in _PACKAGE_ROOTS) if k >= 0]
        if roots:  # installed elsewhere (pip --target, a source checkout): cut at the package
            path = path[min(roots) + 1 :]
        else:
            path = "/".join(path.split("/")[-2:])
    where = f"{path}:{frame.line}" if frame.line else path
    return f"{frame.name} ({where})".replace(";", ":")


def hook_short_name(hook_name: str) -> str:
    """``pkg.mod:Class.method`` → ``Class.method``; ``pkg.mod.func`` → ``func``."""
    return hook_name.rsplit(":", 1)[1] if ":" in hook_name else hook_name.rsplit(".", 1)[-1]


def _is_wrapper(frame: Frame) -> bool:
    return frame.filename.replace("\\", "/").endswith(_WRAPPER_FILES)


def _hook_position(frames: list[Frame], hook: HookCall) -> int:
    """Where (root→leaf index) a hook call's frame goes: in place of the wrapper frames right outside
    the innermost frame of the hooked function; else right outside that frame; else at the innermost
    wrapper; else at the leaf end."""
    func = hook_short_name(hook.name).rsplit(".", 1)[-1]
    named = [i for i, f in enumerate(frames) if f.name == func]
    at = named or [i for i, f in enumerate(frames) if _is_wrapper(f)]
    if not at:
        return len(frames)
    pos = at[-1]
    while pos > 0 and _is_wrapper(frames[pos - 1]):
        pos -= 1
    return pos


def _insert_hooks(labels: list[str], frames: list[Frame], hooks: list[HookCall]) -> list[str]:
    """Place one ``[hook]`` frame per running hook call (outermost first) into a root→leaf list, and
    drop memtrace's own wrapper frames."""
    items: list[tuple[str, Frame | None]] = list(zip(labels, frames, strict=True))
    for h in reversed(hooks):  # innermost first: an outer hook then lands outside the inner one
        plain = [f if f is not None else Frame("", 0, "") for _, f in items]
        pos = _hook_position(plain, h)
        items.insert(pos, (HOOK_PREFIX + hook_short_name(h.name), None))
    return [lab for lab, f in items if f is None or not _is_wrapper(f)]


def stack_paths(
    trace: Trace,
    live: list[LiveAllocation],
    paths_of: FramePaths | None = None,
    notes: dict[tuple[int, int | None], str] | None = None,
) -> tuple[dict[tuple[str, ...], int], dict[tuple[str, ...], int]]:
    """(bytes, allocation count) per root→leaf frame path (hook frames inserted) of ``live``.

    ``paths_of``: a :class:`FramePaths` of ``trace`` kept by a caller that asks again and again (the view's
    interner). ``notes``: the user's notes by block (``user_metadata.notes_by_block``), each a leaf
    :data:`NOTE_PREFIX` above its block's frames."""
    paths_of = paths_of or FramePaths(trace)
    rows = [paths_of.path(a.stack, a.alloc_us) for a in live]
    # no Python stack: the phase it was allocated in still says a lot (stacks="none" traces)
    phaseless = [i for i, (_, bare) in enumerate(rows) if bare and live[i].alloc_us is not None]
    phase_of = (
        dict(zip(phaseless, _phase_labels(trace, [live[i] for i in phaseless]), strict=True)) if phaseless else {}
    )
    keyed = []
    for i, a in enumerate(live):
        path, bare = rows[i]
        if bare:
            head = [BEFORE_RECORDING] if a.alloc_us is None else [NO_STACK, phase_of[i]]
            path = [*head, *path]
        note = notes.get((a.addr, a.alloc_us)) if notes else None
        if note:
            path = [*path, NOTE_PREFIX + note]
        keyed.append((tuple(path), a.size_bytes))
    return _tally(keyed)


def _outside_paths(
    trace: Trace, items: list, head, phase
) -> tuple[dict[tuple[str, ...], int], dict[tuple[str, ...], int]]:
    """(bytes, count) per root→leaf path of memory outside PyTorch's allocator (CUPTI's allocations, the KV
    cache's VMM chunks): ``head(item)``, then the Python stack that made each (``[no stack recorded]`` and the
    phase ``phase(item)`` when none was taken)."""
    paths_of = FramePaths(trace)
    keyed = []
    for x in items:
        path, bare = paths_of.path(x.stack, x.time_us)
        if bare:
            path = [NO_STACK, phase_label(phase(x)), *path]
        keyed.append(((*head(x), *path), x.bytes))
    return _tally(keyed)


def _made_since(items: list, since_us: int | None) -> list:
    """The CUPTI allocations or VMM chunks (``time_us``) made at or after ``since_us`` (all when None)."""
    return items if since_us is None else [x for x in items if x.time_us >= since_us]


def _tally(keyed: list[tuple[tuple[str, ...], int]]) -> tuple[dict[tuple[str, ...], int], dict[tuple[str, ...], int]]:
    """(bytes, count) per path of ``(path, bytes)`` rows, paths in first-seen order."""
    paths: dict[tuple[str, ...], int] = {}
    counts: dict[tuple[str, ...], int] = {}
    for key, n in keyed:
        paths[key] = paths.get(key, 0) + n
        counts[key] = counts.get(key, 0) + 1
    return paths, counts


def phase_label(path: str) -> str:
    """``[phase] load_model``, or ``[phase] (outside any phase)``: where a stackless allocation was made."""
    return f"{PHASE_PREFIX}{path or '(outside any phase)'}"


class FramePaths:
    """The root→leaf labels of a stack id, hook frames of the calls running at a moment inserted."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.hooks = sorted(trace.hook_calls, key=lambda h: h.start_us)
        self.starts = np.array([h.start_us for h in self.hooks], dtype=np.int64)
        self.cache: dict[int, tuple[list[str], list[Frame]]] = {}

    def path(self, stack: int, t_us: int | None) -> tuple[list[str], bool]:
        """(the labels, True when they hold no Python frame: hook frames at most)."""
        if stack not in self.cache:
            frames = list(reversed(python_frames(self.trace.stack_frames(stack))))  # root → leaf, Python frames
            self.cache[stack] = ([frame_label(f) for f in frames], frames)
        labels, frames = self.cache[stack]
        running = _hook_chain_sorted(self.hooks, self.starts, t_us) if t_us is not None else []
        path = _insert_hooks(labels, frames, running)
        hooks_only = [HOOK_PREFIX + hook_short_name(h.name) for h in running]
        return path, not path or path == hooks_only


def _phase_labels(trace: Trace, live: list[LiveAllocation]) -> list[str]:
    """``[phase] load_model``: the innermost phase path each allocation was made in."""
    from memtrace.analysis.memory.categories import innermost_phase_indices
    from memtrace.analysis.memory.phases import phase_path

    times = np.array([a.alloc_us if a.alloc_us is not None else 0 for a in live], dtype=np.int64)
    idx = innermost_phase_indices(trace, times)
    names = {int(i): phase_path(trace, int(i)) for i in np.unique(idx) if i >= 0}
    return [phase_label(names[int(i)] if i >= 0 else "") for i in idx]


def _hook_chain_sorted(hooks: list[HookCall], starts: np.ndarray, t_us: int) -> list[HookCall]:
    if not hooks:
        return []
    k = int(np.searchsorted(starts, t_us, side="right"))
    running = [h for h in hooks[:k] if t_us <= max(h.end_us, h.start_us)]
    running.sort(key=lambda h: (h.start_us, -h.end_us))
    return running


def build_tree(paths: dict[tuple[str, ...], int], counts: dict[tuple[str, ...], int] | None = None) -> FlameNode:
    """A tree whose every node's ``total_bytes`` sums the paths through it."""
    root = FlameNode("all")
    for path, nbytes in paths.items():
        n = (counts or {}).get(path, 1)
        node = root
        node.total_bytes += nbytes
        node.count += n
        for name in path:
            node = node.children.setdefault(name, FlameNode(name))
            node.total_bytes += nbytes
            node.count += n
        node.self_bytes += nbytes
    return root


def flame_at(
    trace: Trace,
    t_us: int | None = None,
    *,
    event_index: int | None = None,
    since_us: int | None = None,
    non_torch: bool = False,
    lt: Lifetimes | None = None,
    notes: list[TensorNote] | None = None,
) -> Flame:
    """The live allocations at ``t_us`` (or right after event ``event_index``) as a flame tree.

    Args:
        trace: the trace.
        t_us: a Unix-epoch microsecond; every event at or before it has happened.
        event_index: instead, the state right after ``trace.events[event_index]``: use
            ``summary.peak.event_index`` for the exact peak when several events share its microsecond.
        since_us: keep only allocations made at or after this moment: what a phase or a window
            *added and still held* (blocks from before recording never count).
        non_torch: also the non-PyTorch device memory CUPTI saw live at that microsecond, when the
            trace holds CUPTI records (under :data:`NON_TORCH`; ``memtrace flame`` asks for it), and the
            KV cache committed through CUDA's VMM API then (under :data:`VMM_KV`). The
            default, PyTorch's allocations alone, is what the viewer's live set and ``diff`` compare.
        lt: ``live.lifetimes(trace)``, when already computed (``AnalysedRank.lifetimes``).
        notes: ``user_metadata.tensor_notes(trace, lt)``, when already computed (``AnalysedRank.tensor_notes``).
    """
    lt = lt if lt is not None else lifetimes(trace)
    live = live_allocations_at(trace, t_us, event_index=event_index, lt=lt)
    if since_us is not None:
        live = [a for a in live if a.alloc_us is not None and a.alloc_us >= since_us]
    if t_us is None:
        ev = trace.events
        t_us = int(ev["time_us"][event_index]) if event_index is not None and 0 <= event_index < len(ev) else 0
    notes = notes if notes is not None else tensor_notes(trace, lt)
    paths, counts = stack_paths(trace, live, notes=notes_by_block(notes))
    torch_bytes, outside = sum(paths.values()), {}
    if non_torch and _non_torch.has_records(trace):
        cupti = _made_since(_non_torch.live_allocations(trace, int(t_us)), since_us)
        outside["cupti"] = _outside_paths(
            trace, cupti, lambda a: (NON_TORCH, f"[{a.category}]"), lambda a: a.phase_path
        )
    chunks = _made_since(_vmm.live_kv_chunks(trace, int(t_us)), since_us) if non_torch and _vmm.has_vmm(trace) else []
    if chunks:
        outside["vmm"] = _outside_paths(trace, chunks, lambda c: (VMM_KV,), lambda c: path_at(trace, c.time_us))
    for more, more_counts in outside.values():
        paths, counts = {**paths, **more}, {**counts, **more_counts}
    cupti_bytes, vmm_bytes = (sum(outside[k][0].values()) if k in outside else None for k in ("cupti", "vmm"))
    return Flame(
        int(t_us), event_index, build_tree(paths, counts), paths, since_us, torch_bytes, cupti_bytes, vmm_bytes
    )


def widest_leaves(flame: Flame, top: int = 5) -> list[tuple[tuple[str, ...], int]]:
    """The ``top`` root→leaf paths holding the most bytes, largest first."""
    return sorted(flame.stacks.items(), key=lambda kv: (-kv[1], kv[0]))[:top]


# -- the frames every stack shares (vLLM's launcher frames: <module>, spawn_main, run_engine_core...): the SVG
# leaves them out and names them; the folded export keeps every frame


def _python_start(path: tuple[str, ...]) -> int:
    """Index of the first real frame of ``path`` (after its bracketed pseudo-frames); len(path) if none."""
    return next((i for i, name in enumerate(path) if not name.startswith("[")), len(path))


def shared_prefix(flame: Flame) -> tuple[str, ...]:
    """The frames (outermost first) that every stack with Python frames begins its Python part with, short of
    the innermost frame of the shortest one (a stack is never emptied); () when they differ from the root."""
    parts = [path[_python_start(path) :] for path, nbytes in flame.stacks.items() if nbytes > 0]
    parts = [p for p in parts if p]
    if not parts:
        return ()
    limit = min(len(p) for p in parts) - 1
    first = parts[0]
    n = 0
    while n < limit and all(p[n] == first[n] for p in parts):
        n += 1
    return first[:n]


def without_prefix(flame: Flame, prefix: tuple[str, ...]) -> Flame:
    """``flame`` with ``prefix`` taken out of every stack whose Python part begins with it (every one, when
    ``prefix`` is :func:`shared_prefix`); the same bytes per stack, the same total."""
    if not prefix:
        return flame
    n = len(prefix)
    stacks: dict[tuple[str, ...], int] = {}
    counts: dict[tuple[str, ...], int] = {}
    old_counts = stack_counts(flame)
    for path, nbytes in flame.stacks.items():
        k = _python_start(path)
        new = path[:k] + path[k + n :] if path[k : k + n] == prefix else path
        stacks[new] = stacks.get(new, 0) + nbytes
        counts[new] = counts.get(new, 0) + old_counts.get(path, 1)
    root = dataclasses.replace(build_tree(stacks, counts), name=flame.root.name)
    return dataclasses.replace(flame, root=root, stacks=stacks)


def stack_counts(flame: Flame) -> dict[tuple[str, ...], int]:
    """Allocations per stack, read back from the tree (the count ending at each path's leaf)."""
    out: dict[tuple[str, ...], int] = {}
    for path in flame.stacks:
        node = flame.root
        for name in path:
            node = node.children[name]
        below = sum(c.count for c in node.children.values())
        out[path] = node.count - below
    return out
