"""A history of runs for CI: what ``history add`` stores, what ``check`` compares, what ``show`` draws.

A run's processes are filed under their matrix key (``history_key``), each with its gated figures
(``diff.figures``) at reserved level and, when it sampled NVML, at device level. ``check`` compares a
new run with the last accepted run of the same key and rank through ``diff.compare`` (the one
comparator: the same threshold syntax, the same figures, the same verdict as ``memtrace diff``).
The level is the finest both runs have. :func:`trends` turns the stored rows into one series per key
and figure for ``plots.history_png``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING

from memtrace.analysis.gate.diff import (
    ALL_HOOKS,
    AVAILABLE_KV,
    BEFORE_KV,
    PEAK_DEVICE,
    PEAK_RESERVED,
    Figures,
    TraceDiff,
    compare,
    figures,
)
from memtrace.analysis.gate.history_key import describe, differences, fingerprint, matrix_key
from memtrace.analysis.memory.curves import Curves, all_curves
from memtrace.analysis.memory.oom import Oom
from memtrace.model import Trace
from memtrace.units import Threshold

if TYPE_CHECKING:
    from memtrace.analysis.memory.categories import Categorized

#: The figures ``show`` draws, in the order of the legend.
TREND_FIGURES = (PEAK_RESERVED, PEAK_DEVICE, BEFORE_KV, AVAILABLE_KV, ALL_HOOKS)
_FIELDS = [f.name for f in fields(Figures)]


def figures_doc(f: Figures) -> dict:
    """A JSON-compatible document of ``f`` (bytes as integers), its keys in the fields' order."""
    return {**asdict(f), "left_to_vllm": sorted(f.left_to_vllm)}


def figures_from_doc(doc: dict) -> Figures:
    """The :class:`Figures` a document of :func:`figures_doc` holds (keys a document from before them lacks take
    their defaults: phases then compare as they are)."""
    tuples = {"phases", "hooks", "phases_less_kv"}
    kw = {k: {n: tuple(v) for n, v in doc[k].items()} if k in tuples else doc[k] for k in _FIELDS if k in doc}
    oom = Oom(**doc["oom"]) if doc.get("oom") else None
    return Figures(**{"where": {}, **kw, "oom": oom, "left_to_vllm": frozenset(doc.get("left_to_vllm", ()))})


@dataclass(frozen=True)
class Recorded:
    """What history keeps of one process of a run."""

    key: str
    fingerprint: dict[str, str]
    rank: int | None
    recorded_us: int | None
    reserved: Figures
    device: Figures | None  # None without NVML samples


def record(trace: Trace, *, curves: Curves | None = None, categorized: Categorized | None = None) -> Recorded:
    """The figures of ``trace`` at both levels, and its matrix key (``curves``, ``categorized``: an analysed
    rank's, so nothing the run computed is computed again)."""
    curves = curves or all_curves(trace)
    fp = fingerprint(trace)
    kw = {"curves": curves, "categorized": categorized}
    return Recorded(
        key=matrix_key(fp),
        fingerprint=fp,
        rank=trace.process.rank,
        recorded_us=trace.recording.start_us,
        reserved=figures(trace, device_level=False, **kw),
        device=figures(trace, device_level=True, **kw) if curves.has_device else None,
    )


def record_run(run, what: str) -> list[Recorded]:
    """:func:`record` of every rank of an analysed run. NothingToJudge (exit 1) when a rank recorded no
    allocator events: an empty run is never a reference, and never passes a check."""
    run.require_every_rank(what)
    return [record(r.trace, curves=r.curves, categorized=r.categorized) for r in run.ranks]


def check(base: Recorded, new: Recorded, threshold: Threshold, *, label: str = "") -> TraceDiff:
    """``new`` against the stored ``base`` with ``diff.compare``, at device level when both have it."""
    level = "device" if base.device is not None and new.device is not None else "reserved"
    return compare(getattr(base, level), getattr(new, level), threshold, label=label)


def closest(keys: dict[str, dict[str, str]], fp: dict[str, str]) -> tuple[str, list[tuple[str, str, str]]] | None:
    """The stored key whose fingerprint differs from ``fp`` in the fewest fields, and those fields."""
    best = min(keys, key=lambda k: len(differences(keys[k], fp)), default=None)
    return None if best is None else (best, differences(keys[best], fp))


@dataclass(frozen=True)
class Point:
    """One stored run on a trend: its order in the history, its label, whether it is a reference."""

    batch: int
    label: str
    accepted: bool
    bytes: int


@dataclass(frozen=True)
class Trend:
    """The series of one matrix key (and rank): each trend figure over the stored runs, oldest first."""

    key: str
    title: str  # history_key.describe of the fingerprint
    rank: int | None
    series: dict[str, list[Point]]  # TREND_FIGURES label -> points (runs that have the figure)


def _trend_value(doc: dict, name: str) -> int | None:
    if name == ALL_HOOKS:
        return sum(map(sum, doc["hooks"].values())) if doc.get("hooks") else None
    v = doc["headline"].get(name)
    return int(v) if v is not None else None


def trends(rows: list) -> list[Trend]:
    """One :class:`Trend` per (key, rank) of ``rows`` (``history_store.Row``, oldest first).

    A key's figures are taken at device level when every stored run of it has them, else reserved.
    """
    groups: dict[tuple[str, int | None], list] = {}
    for r in rows:
        groups.setdefault((r.key, r.rank), []).append(r)
    out = []
    for (key, rank), rs in groups.items():
        device = all(r.figures_device is not None for r in rs)
        docs = [(r, r.figures_device if device else r.figures_reserved) for r in rs]
        values = {n: [(r, _trend_value(doc, n)) for r, doc in docs] for n in TREND_FIGURES}
        points = {
            n: [Point(r.batch, r.label, r.accepted, v) for r, v in vs if v is not None] for n, vs in values.items()
        }
        series = {n: pts for n, pts in points.items() if pts}
        out.append(Trend(key, describe(rs[-1].fingerprint), rank, series))
    return out
