"""The frames every stack of a flame graph shares, and the flame without them.

In a vLLM worker every Python stack begins with the same launcher frames (``<module>``, multiprocessing's
``spawn_main``/``_bootstrap``/``run``, vLLM's ``run_engine_core``, ``EngineCore.__init__`` ...): eight or
more rows of one full-width box each, above the rows that tell the holders apart. :func:`shared_prefix` finds
them (the longest common prefix of the Python part of every stack: what follows the bracketed pseudo-frames
such as ``[KV cache outside PyTorch (CUDA VMM)]``; stacks without Python frames take no part), and
:func:`without_prefix` gives the flame with those frames taken out of every stack that holds them, its bytes
and counts unchanged. The SVG flame graph draws that and names the frames it left out; the folded export keeps
every frame (it is an input for flamegraph.pl and speedscope, which have their own zoom and focus).
"""

from __future__ import annotations

import dataclasses

from memtrace.analysis.holders.flame import Flame, build_tree


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
