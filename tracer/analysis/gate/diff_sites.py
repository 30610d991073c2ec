"""What grew by allocating stack between two runs: live bytes at each run's peak, stack by stack.

Two releases of a library move its lines, so a stack is matched by its frames' function and file, never by
line: ``allocate_sm120_dynamic_workspace`` in ``blackwell_sm12x/moe_dispatch.py`` is the same frame at line
2781 or 2790. A file is named by its path inside the installed package (after ``site-packages/``), else by
its last two parts, so two machines' install folders match too. Stacks live at one peak and not the other
are listed as new or vanished (``SiteChange.is_new`` / ``vanished``). A run recorded without Python stacks
(``MEMTRACE_STACKS=none``, or a snapshot without frames) has nothing to match: the comparison is not made,
and :attr:`Sites.missing` says which side lacks them, instead of calling everything "new".
"""

from __future__ import annotations

from dataclasses import dataclass

from memtrace.analysis.holders.frames import site_frame
from memtrace.analysis.holders.live import Lifetimes, holders_by_stack, lifetimes
from memtrace.model import Frame, Trace

#: How many stacks to report in each direction (grew or new, shrank or vanished).
TOP_SITES = 8


@dataclass(frozen=True)
class SiteChange:
    """Live bytes of one allocating stack (matched by function and file) at each run's peak."""

    frames: tuple[Frame, ...]  # innermost first, from the run that has it (new preferred)
    base_bytes: int
    new_bytes: int
    #: when another listed stack is printed under the same frame: this stack's innermost frame that differs
    #: from theirs (the caller that tells the two apart); None when the printed frame alone is unique
    apart: Frame | None = None
    #: the frame printed for it, told by the library folders of the run it came from (``frames.site_frame``)
    shown: Frame | None = None

    @property
    def delta(self) -> int:
        return self.new_bytes - self.base_bytes

    @property
    def is_new(self) -> bool:
        return self.base_bytes == 0 and self.new_bytes > 0

    @property
    def vanished(self) -> bool:
        return self.new_bytes == 0 and self.base_bytes > 0


@dataclass(frozen=True)
class Sites:
    """The stacks that changed (grew or new first, then shrank or vanished), or why none are compared."""

    changes: list[SiteChange]
    missing: str = ""  # "base", "new" or "both": the side(s) recorded without Python stacks


def file_name(filename: str) -> str:
    """A frame's file without the install folder: the path after ``site-packages/``, else its last two parts."""
    fn = filename.replace("\\", "/")
    cut = next((fn.split(m, 1)[1] for m in ("site-packages/", "dist-packages/") if m in fn), None)
    return cut if cut is not None else "/".join(fn.split("/")[-2:])


def site_key(frames: list[Frame]) -> tuple[tuple[str, str], ...]:
    """A stack as (function, file) pairs, innermost first: no line numbers."""
    return tuple((f.name, file_name(f.filename)) for f in frames)


class SiteKeys:
    """:func:`site_key` of a trace's interned stacks, each frame's (function, file) derived once: a start-up's
    few thousand stacks share a few hundred frames and files. ``SiteKeys(trace)(stack)`` is
    ``site_key(trace.stack_frames(stack))`` (stack -1, no stack: the empty key)."""

    def __init__(self, trace: Trace) -> None:
        self._trace = trace
        self._keys: list[tuple[str, str]] | None = None

    def __call__(self, stack: int) -> tuple[tuple[str, str], ...]:
        if stack < 0:
            return ()
        if self._keys is None:  # every frame's (function, file) once, each file's name once
            files: dict[str, str] = {}
            self._keys = [
                (
                    f.name,
                    files[f.filename] if f.filename in files else files.setdefault(f.filename, file_name(f.filename)),
                )
                for f in self._trace.frames
            ]
        return tuple(map(self._keys.__getitem__, self._trace.stacks[stack]))


def sites_at_peak(trace: Trace, peak_index: int, lt: Lifetimes | None = None) -> dict[tuple, tuple[int, int]] | None:
    """(live bytes, a stack that shows them) by :func:`site_key` right after event ``peak_index``; None when no live
    block has a stack."""
    if len(trace.events) == 0 and not trace.segments:
        return {}
    lt = lt if lt is not None else lifetimes(trace)
    out: dict[tuple, tuple[int, int]] = {}  # key -> (bytes, the stack that shows it)
    keys = SiteKeys(trace)
    for h in holders_by_stack(trace, top=1 << 30, event_index=peak_index, lt=lt):
        key = keys(h.stack)
        out[key] = (out.get(key, (0, 0))[0] + h.bytes, h.stack)
    return None if out and all(not key for key in out) else out  # None: no live block has a stack


def site_changes(base, new, top: int = TOP_SITES) -> Sites:
    """Stacks new at the new run's peak or that grew most, then those that vanished or shrank most: two analysed
    ranks (``AnalysedRank``) read at their headline peak (``headline_event``), with their lifetimes."""
    b = sites_at_peak(base.trace, base.headline_event, base.lifetimes)
    n = sites_at_peak(new.trace, new.headline_event, new.lifetimes)
    if b is None or n is None:
        return Sites([], "both" if b is None and n is None else "base" if b is None else "new")
    moved = [(key, *b.get(key, (0, -1)), *n.get(key, (0, -1))) for key in dict.fromkeys([*n, *b])]
    grew = sorted((m for m in moved if m[3] > m[1]), key=lambda m: m[1] - m[3])[:top]
    shrank = sorted((m for m in moved if m[3] < m[1]), key=lambda m: m[3] - m[1])[:top]
    changes = []
    for key, bb, bs, nb, ns in grew + shrank:  # frames read for the stacks listed alone: the new run's when it has them
        trace, stack = (new.trace, ns) if key and key in n else (base.trace, bs)
        changes.append(SiteChange(tuple(trace.stack_frames(stack)), bb, nb, shown=site_frame(trace, stack)))
    return Sites(tell_apart(changes))


def _first_difference(a: tuple[Frame, ...], b: tuple[Frame, ...]) -> int:
    """The innermost index where the two stacks' (function, file) differ (one past the shorter if none)."""
    ka, kb = site_key(list(a)), site_key(list(b))
    return next((i for i, (x, y) in enumerate(zip(ka, kb, strict=False)) if x != y), min(len(ka), len(kb)))


def tell_apart(changes: list[SiteChange]) -> list[SiteChange]:
    """Each change printed under the same frame as another (:attr:`SiteChange.shown`) gets the frame of its
    own stack that tells it apart from them (:attr:`SiteChange.apart`): the innermost one where the stacks
    differ, taken past the last point any of them shares with it."""
    from dataclasses import replace

    groups: dict[tuple, list[int]] = {}
    for i, c in enumerate(changes):
        f = c.shown
        groups.setdefault((f.name, file_name(f.filename), f.line) if f else None, []).append(i)
    out = list(changes)
    for members in groups.values():
        if len(members) < 2:
            continue
        for i in members:
            c = changes[i]
            k = max(_first_difference(c.frames, changes[j].frames) for j in members if j != i)
            out[i] = replace(c, apart=c.frames[k] if k < len(c.frames) else None)
    return out
