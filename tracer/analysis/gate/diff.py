"""Compare two traces of the same start-up: what grew, where, and whether it breaks a threshold.

The gate (``TraceDiff.regressions``) fails when any of these grew past the threshold: the global peaks
(reserved, allocated, device used when both runs sampled it), each phase's peak (matched by path, a repeat by
occurrence: ``profile_run#2``), the memory before KV sizing, the post-KV transient, the bytes returned by each
hooked function and by all together; or when the new run died of OOM where the base did not. Growth below
``MIN_GROWTH_BYTES`` (allocator rounding) never fails a percentage threshold. A trace is judged on the quantity
it is ranked by (``quantities.ranked_by``): the CPU's from torch.profiler on allocated alone, without a floor.

The gated figures of one trace are a :class:`Figures` (what ``history`` stores); :func:`compare` is the one
comparator (``diff`` and ``history check``); categories and sites explain the change. Runs whose environment
fingerprints differ (``history_key``) are compared anyway, the differences in ``mismatches``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memtrace.analysis.analysed.run import AnalysedRun

from collections import Counter
from dataclasses import dataclass, field, replace

import numpy as np
from memtrace.analysis.analysed.landmarks import landmarks, total_curve
from memtrace.analysis.capacity.extensible import extensible_sizing
from memtrace.analysis.gate.diff_sites import SiteChange, site_changes
from memtrace.analysis.gate.history_key import differences, fingerprint, left_to_vllm
from memtrace.analysis.memory import quantities as Q
from memtrace.analysis.memory.curves import Curve, Curves, all_curves, committed_curve
from memtrace.analysis.memory.oom import Oom, find_oom
from memtrace.analysis.memory.phases import path_at, phase_stats
from memtrace.analysis.memory.quantities import is_one_moment, window_peak
from memtrace.model import ACTION_CODE, Trace
from memtrace.units import MiB, Threshold, format_bytes

#: Growth under this never fails a percentage threshold (one large-segment rounding unit).
MIN_GROWTH_BYTES = 2 * MiB

#: Headline figures, in the order shown; GATED ones fail the gate when they grow past the threshold.
AVAILABLE_KV = "available KV cache (vLLM)"
BEFORE_KV = "memory before KV sizing"
KV_CACHE = "KV cache"
#: How a run's KV cache was allocated (``Figures.kv_via``).
VIA_TORCH = "PyTorch's allocator"
VIA_VMM = "CUDA's VMM API"  # vLLM 0.34's extensible KV cache
POST_KV = "post-KV transient"
PEAK_RESERVED = "peak reserved"
#: Fingerprint fields that a release gate changes on purpose (``history_key.ENV_FIELDS`` less the GPU).
VERSION_FIELDS = frozenset({"driver", "cuda", "torch", "vllm", "flashinfer"})
PEAK_ALLOCATED = "peak allocated"
PEAK_DEVICE = "peak device used"
#: PyTorch reserved + the KV cache committed outside PyTorch (``quantities.HELD``): shown when a run has one
PEAK_HELD = f"peak {Q.HELD.label}"
HEADLINE = (AVAILABLE_KV, BEFORE_KV, KV_CACHE, POST_KV, PEAK_HELD, PEAK_RESERVED, PEAK_ALLOCATED, PEAK_DEVICE)
GATED = frozenset({BEFORE_KV, POST_KV, PEAK_HELD, PEAK_RESERVED, PEAK_ALLOCATED, PEAK_DEVICE})
#: PyTorch's own figures: not like with like when the KV cache moved between PyTorch and CUDA VMM
TORCH_ONLY = frozenset({PEAK_RESERVED, PEAK_ALLOCATED})
MOVED_OUT_NOTE = "not gated: the KV cache moved outside PyTorch"
MOVED_IN_NOTE = "not gated: the KV cache moved into PyTorch"
#: vLLM 0.34's extensible KV cache is made after warm-up: its post-KV transient is 0 by construction
MOVED_WARMUP_NOTE = "not gated: the KV cache moved, and one run warmed up before making it"
#: Allocator events that create / release a segment's memory (a KV cache tensor of its own segment).
_SEG_UP = (ACTION_CODE["segment_alloc"], ACTION_CODE["segment_map"])
_SEG_DOWN = (ACTION_CODE["segment_free"], ACTION_CODE["segment_unmap"])
#: The label of all hooked calls' bytes together.
ALL_HOOKS = "all hooked calls"
#: What :func:`diff_ranks` reads of each analysed rank (``AnalysedRank`` properties): ``memtrace diff``
#: computes them for both runs at once.
RANK_NEEDS = ("curves", "lifetimes", "categorized", "oom")


@dataclass(frozen=True)
class Change:
    """One figure in both runs. ``base``/``new`` are None where a run lacks it."""

    label: str
    base: int | None
    new: int | None
    limit: int | None = None  # allowed growth in bytes; None: the figure is not gated
    phase: str = ""  # where the new value happened (peaks)
    note: str = ""  # why a figure is shown but not gated (MOVED_OUT_NOTE, MOVED_IN_NOTE)

    @property
    def delta(self) -> int | None:
        return None if self.base is None or self.new is None else self.new - self.base

    @property
    def over(self) -> bool:
        d = self.delta
        return self.limit is not None and d is not None and d > self.limit


@dataclass(frozen=True)
class PhaseChange:
    """A phase matched by path: its peak in both runs and how much it grew inside itself."""

    path: str
    depth: int
    peak: Change
    inside_base: int | None  # peak above the phase's starting memory
    inside_new: int | None

    @property
    def inside_delta(self) -> int | None:
        return None if self.inside_base is None or self.inside_new is None else self.inside_new - self.inside_base


@dataclass(frozen=True)
class HookChange:
    """Calls of one hooked function (FlashInfer workspace allocators): count and bytes per call."""

    name: str
    base_calls: int
    new_calls: int
    base_bytes_per_call: tuple[int, ...]
    new_bytes_per_call: tuple[int, ...]

    @property
    def base_total(self) -> int:
        return sum(self.base_bytes_per_call)

    @property
    def new_total(self) -> int:
        return sum(self.new_bytes_per_call)


@dataclass(frozen=True)
class Figures:
    """The gated figures of one trace, computed once (``figures``): what diff compares and history stores."""

    device_level: bool  # phase peaks and the memory before KV sizing include non-PyTorch memory (NVML)
    fingerprint: dict[str, str]  # analysis.history_key.fingerprint
    headline: dict[str, int]  # HEADLINE label -> bytes, for the figures the trace has
    where: dict[str, str]  # HEADLINE label -> phase path of the moment (peaks, post-KV transient)
    phases: dict[str, tuple[int, int, int]]  # path (name#n for repeats) -> (peak, peak above start, depth)
    hooks: dict[str, tuple[int, ...]]  # hooked function -> bytes added per outermost call (hook_call_bytes)
    nested: dict[str, int] = field(default_factory=dict)  # hooked function called inside another -> bytes added
    #: nested hooked function -> the hooked function it is called in (empty in history documents before it)
    nested_in: dict[str, str] = field(default_factory=dict)
    oom: Oom | None = None  # the OOM the run died of
    #: fingerprint fields vLLM chose itself in this run (``history_key.left_to_vllm``)
    left_to_vllm: frozenset[str] = frozenset()
    #: how the KV cache was allocated: VIA_TORCH, VIA_VMM (vLLM 0.34+), or "" (none)
    kv_via: str = ""
    #: the key of the quantity the trace is ranked by (``quantities.ranked_by``): its phase peaks are that curve's
    ranked: str = Q.RESERVED.key
    #: ``phases`` less the KV cache at every moment (its tensors, or what CUDA VMM committed for it): what is
    #: compared when the KV cache moved between PyTorch and CUDA VMM, as the two runs make it in other phases
    #: (vLLM 0.34's extensible cache after warm-up, PyTorch's in kv_cache_init). Empty without a KV cache
    phases_less_kv: dict[str, tuple[int, int, int]] = field(default_factory=dict)


@dataclass
class TraceDiff:
    """The comparison of one process's trace in both runs."""

    label: str
    device_level: bool  # both traces hold NVML samples: figures include non-PyTorch memory
    threshold: str
    headline: list[Change]  # HEADLINE order; gated ones carry a limit
    phases: list[PhaseChange]
    categories: list[Change] | None  # None when not computed (history) or unavailable
    sites: list[SiteChange]
    hooks: list[HookChange]
    hook_totals: list[Change] = field(default_factory=list)  # bytes per hooked function, then ALL_HOOKS
    nested_hooks: list[Change] = field(default_factory=list)  # per nested hook target, not gated (nested_order)
    nested_in: dict[str, str] = field(default_factory=dict)  # nested hook target -> the hooked function it runs in
    base_only_phases: list[str] = field(default_factory=list)
    new_only_phases: list[str] = field(default_factory=list)
    new_oom: Oom | None = None  # the new run died of OOM (and the base did not)
    mismatches: list[tuple[str, str, str]] = field(default_factory=list)  # fingerprint fields that differ
    #: fingerprint fields the new run left to vLLM (``Figures.left_to_vllm``): with other versions, a change
    #: there is the versions' own doing, not a different set-up
    left_to_vllm: frozenset[str] = frozenset()
    kv_via: tuple[str, str] = ("", "")  # how each run's KV cache was allocated (``Figures.kv_via``)
    environment_unknown: bool = False  # a run recorded no environment (an imported snapshot): unchecked
    #: "base", "new" or "both": the side(s) recorded without Python stacks, so no stack is compared
    sites_missing: str = ""
    #: the key of the quantity both runs are judged by (``Figures.ranked``): "allocated" for the CPU's traces
    ranked: str = Q.RESERVED.key
    #: "base", "new" or "both": the side(s) that are one moment (``quantities.ONE_MOMENT``): their "peaks"
    #: are that moment's state, so the diff compares states, not peaks
    one_moment: str = ""
    #: the phases compare what each run held less its KV cache (``Figures.phases_less_kv``): the KV cache moved
    phases_less_kv: bool = False

    @property
    def regressions(self) -> list[Change]:
        gated = [c for c in self.headline if c.over] + [p.peak for p in self.phases if p.peak.over]
        return gated + [c for c in self.hook_totals if c.over]

    @property
    def new_empty(self) -> bool:
        """The new run recorded no PyTorch memory where the base did (it crashed first, or recorded
        nothing): there is nothing to compare, and a gate must not call that a pass."""
        peak = {c.label: c for c in self.headline}.get(_ranked_peak(self.ranked))
        return peak is not None and bool(peak.base) and not peak.new

    @property
    def failed(self) -> bool:
        return bool(self.regressions) or self.new_oom is not None or self.new_empty

    @property
    def version_changes(self) -> list[tuple[str, str, str]]:
        """Software versions that differ (driver, CUDA, torch, vLLM, FlashInfer): what a release gate
        compares on purpose, not a reason the runs do not compare."""
        return [m for m in self.mismatches if m[0] in VERSION_FIELDS]

    @property
    def default_changes(self) -> list[tuple[str, str, str]]:
        """With other versions, the fields the new run left to vLLM and that came out differently: what the
        new versions changed by themselves (vLLM 0.34's utilization 1.0 and extensible KV cache)."""
        others = [m for m in self.mismatches if m[0] not in VERSION_FIELDS and m[0] in self.left_to_vllm]
        return others if self.version_changes else []

    @property
    def setup_changes(self) -> list[tuple[str, str, str]]:
        """Everything else that differs (GPU, model, flags, the program): the runs do not compare."""
        defaults = {m[0] for m in self.default_changes}
        return [m for m in self.mismatches if m[0] not in VERSION_FIELDS and m[0] not in defaults]

    @property
    def comparable(self) -> bool:
        return not self.setup_changes


def _limit(threshold: Threshold, base: int | None, floor: int = MIN_GROWTH_BYTES) -> int | None:
    if base is None:
        return None
    return max(threshold.of(abs(base)), floor) if threshold.fraction is not None else threshold.of(abs(base))


def _floor(base: Figures, new: Figures) -> int:
    """The growth a percentage threshold never fails below: one segment's rounding, none for the CPU's traces."""
    return MIN_GROWTH_BYTES if Q.RESERVED.key in (base.ranked, new.ranked) else 0


def _ranked_peak(ranked: str) -> str:
    """The headline peak of the quantity a trace is ranked by (``Figures.ranked``)."""
    return PEAK_ALLOCATED if ranked == Q.ALLOCATED.key else PEAK_RESERVED


def _phase_peaks(
    trace: Trace, curves: Curves, device_level: bool, less: Curve | None = None
) -> dict[str, tuple[int, int, int]]:
    """path (with #n for repeats) -> (peak, peak above start, depth), of what the process
    held (the allocated curve for a trace without reserved memory: ``quantities.holds_reserved``), less the
    curve ``less`` when given."""
    held = None if Q.holds_reserved(trace.process) else curves.allocated
    curve = total_curve(curves, include_non_torch=device_level, base=held)
    if less is not None and len(less):  # its few steps inserted (after a curve's own at equal times): O(events)
        at = np.searchsorted(curve.time_us, less.time_us, side="right")
        times = np.insert(curve.time_us, at, less.time_us)
        curve = Curve(times, np.insert(curve.bytes, at, curve.at_each(less.time_us)) - less.at_each(times))
    seen: Counter[str] = Counter()
    out: dict[str, tuple[int, int, int]] = {}
    for st in phase_stats(trace, curves):
        seen[st.path] += 1
        key = st.path if seen[st.path] == 1 else f"{st.path}#{seen[st.path]}"
        peak, _ = window_peak(curve, st.start_us, st.end_us)
        out[key] = (peak, peak - curve.at(st.start_us), st.depth)
    return out


def hook_call_bytes(returned: int | None, allocated_delta: int | None) -> int:
    """The bytes one hooked call added: what it returned, but no more than PyTorch's allocated bytes grew
    during it when that is known. A wrapper handed shared workspaces (FlashInfer 0.7's
    ``shared_static_workspace``...) returns them again without allocating: it adds nothing."""
    if returned is None or allocated_delta is None:
        return max(0, allocated_delta or 0) if returned is None else returned
    return min(returned, max(0, allocated_delta))


def _hook_bytes(trace: Trace) -> tuple[dict[str, tuple[int, ...]], dict[str, int], dict[str, str]]:
    """(bytes added per outermost call, by hooked function; bytes added by each hooked function called inside
    another, shown, not gated: their outermost caller counts them; each of those -> the hooked function its first
    call ran in: ``allocate_sm120_static_workspace`` runs inside ``allocate_sm120_moe_workspace``, inside
    ``B12xMoEWrapper._allocate_buffers``, so their bytes are parts of one another, not a sum)."""
    outer: dict[str, list[int]] = {}
    nested: dict[str, int] = {}
    callers: dict[str, str] = {}
    calls = trace.hook_calls
    for c in calls:
        added = hook_call_bytes(c.returned_bytes, c.allocated_delta_bytes)
        if c.parent is None:
            outer.setdefault(c.name, []).append(added)
            continue
        nested[c.name] = nested.get(c.name, 0) + added
        if 0 <= c.parent < len(calls):
            callers.setdefault(c.name, calls[c.parent].name)
    return {k: tuple(v) for k, v in outer.items()}, nested, callers


def nested_order(names: set[str], nested_in: dict[str, str]) -> list[tuple[str, int]]:
    """``names`` depth first under their callers (depth 1: called in an outermost hooked call), alphabetical
    among siblings; a name whose caller is unknown is at depth 1."""
    children: dict[str | None, list[str]] = {}
    for n in sorted(names):
        parent = nested_in.get(n)
        children.setdefault(parent if parent in names else None, []).append(n)
    out: list[tuple[str, int]] = []

    def walk(parent: str | None, depth: int) -> None:
        for n in children.get(parent, []):
            out.append((n, depth))
            walk(n, depth + 1)

    walk(None, 1)
    return out


def category_changes(base, new) -> list[Change]:
    """Allocated bytes per category (weights, KV cache, workspaces...) of two analysed ranks (``AnalysedRank``) at
    their headline peak (``headline_event``: the moment their sites are compared at), with the KV cache committed
    outside PyTorch then."""
    from memtrace.analysis.memory.categories import CATEGORIES, category_totals_at

    def at_peak(rank) -> dict[str, int]:
        curves = rank.curves
        if len(curves.reserved) == 0:
            return {}
        at = category_totals_at(rank.trace, rank.categorized, curves, rank.headline_event + 1)
        totals = dict(zip(CATEGORIES, map(int, at), strict=True))
        if len(curves.vmm):  # the KV cache committed outside PyTorch is the KV cache still
            totals["kv_cache"] = totals.get("kv_cache", 0) + rank.vmm_kv.at(rank.headline.point.time_us)
        return totals

    bd, nd = at_peak(base), at_peak(new)
    return [Change(k, bd.get(k, 0), nd.get(k, 0)) for k in dict.fromkeys([*bd, *nd])]


def kv_cache_curve(trace: Trace, curves: Curves, via: str, categorized=None) -> Curve:
    """The KV cache's bytes over time: what CUDA VMM committed for it (``via`` VIA_VMM), else its tensors (the
    allocations ``memory.categories`` calls kv_cache). Empty without one."""
    if via == VIA_VMM:
        return committed_curve(trace, kv_cache_only=True)
    if via != VIA_TORCH:
        return Curve(np.zeros(0, np.int64), np.zeros(0, np.int64))
    from memtrace.analysis.memory.categories import KV_CACHE as KV_CODE
    from memtrace.analysis.memory.categories import categorize

    codes = (categorized if categorized is not None else categorize(trace)).codes
    ev = trace.events
    pos = np.flatnonzero(codes == KV_CODE)
    action, addr, times = ev["action"], ev["addr"], ev["time_us"].astype(np.int64)
    freed = action[pos] == ACTION_CODE["free_completed"]
    signed = ev["size"][pos].astype(np.int64)
    signed[freed] *= -1
    # a tensor of its own segment counts from the segment's creation to its release: reserved holds it then
    before, after = np.clip(pos - 1, 0, None), np.clip(pos + 1, 0, len(ev) - 1)
    made = ~freed & np.isin(action[before], _SEG_UP) & (addr[before] == addr[pos])
    gone = freed & np.isin(action[after], _SEG_DOWN) & (addr[after] == addr[pos])
    at = np.where(made, times[before], np.where(gone, times[after], times[pos]))
    order = np.argsort(at, kind="stable")
    return Curve(at[order], np.cumsum(signed[order]))


def figures(
    trace: Trace,
    *,
    device_level: bool | None = None,
    curves: Curves | None = None,
    categorized=None,
    less_kv: bool = True,
) -> Figures:
    """The gated figures of ``trace``.

    Args:
        trace: the trace.
        device_level: add steady non-PyTorch memory (NVML) to phase peaks and to the memory before
            KV sizing; default: when the trace has NVML samples. Compare like with like.
        curves: its precomputed ``all_curves``.
        categorized: its precomputed ``categories.categorize`` (the KV cache's tensors).
        less_kv: also the phase peaks less the KV cache (``Figures.phases_less_kv``; what history keeps).
    """
    curves = curves or all_curves(trace)
    device_level = (device_level is None or device_level) and curves.has_device
    lm = landmarks(trace, curves, include_non_torch=device_level)
    sizing = extensible_sizing(trace, curves)
    head = {
        # vLLM's own KV figure: with the extensible KV cache the size it committed after warm-up
        # ("Extended KV cache to N blocks"), not the profiled figure that only sizes the address range
        AVAILABLE_KV: sizing.pages_bytes if sizing is not None else lm.vllm_available_kv_bytes,
        BEFORE_KV: lm.before_kv_bytes,
        KV_CACHE: lm.kv_cache_bytes,
        POST_KV: lm.post_kv_transient_bytes,
    }
    where = {POST_KV: lm.post_kv_peak.phase} if lm.post_kv_peak else {}
    # reserved + the KV cache committed outside PyTorch (vLLM 0.34+), so a release that moves the KV cache
    # out of PyTorch's allocator does not look like one that freed it
    peaks = [(PEAK_HELD, curves.held), (PEAK_RESERVED, curves.reserved), (PEAK_ALLOCATED, curves.allocated)]
    ranked = Q.ranked_by(trace.process)
    if ranked is Q.ALLOCATED:  # nothing reserved (the CPU's trace): no reserved figure is shown or gated
        peaks = peaks[2:]
    if device_level:
        peaks.append((PEAK_DEVICE, curves.device_used))
    for name, curve in peaks:  # the same moments as ``memtrace report``'s peaks
        if len(curve):
            top = Q.peak(curve)
            head[name], where[name] = top.bytes, path_at(trace, top.time_us)
    kv_via = (VIA_VMM if len(curves.vmm) else VIA_TORCH) if lm.kv_cache_bytes else ""
    hooks, nested, nested_in = _hook_bytes(trace)
    return Figures(
        device_level=device_level,
        fingerprint=fingerprint(trace),
        headline={k: int(v) for k, v in head.items() if v is not None},
        where=where,
        phases=_phase_peaks(trace, curves, device_level),
        hooks=hooks,
        nested=nested,
        nested_in=nested_in,
        oom=find_oom(trace),  # once a trace: the analysed rank's own
        left_to_vllm=left_to_vllm(trace),
        kv_via=kv_via,
        ranked=ranked.key,
        phases_less_kv=phase_peaks_less_kv(trace, curves, device_level, kv_via, categorized) if less_kv else {},
    )


def phase_peaks_less_kv(
    trace: Trace, curves: Curves, device_level: bool, kv_via: str, categorized=None
) -> dict[str, tuple[int, int, int]]:
    """``Figures.phases_less_kv``: each phase's peak less the KV cache held through ``kv_via`` ({} without one);
    ``categorized``: the trace's ``categories.categorize``, when the run already holds it."""
    less = kv_cache_curve(trace, curves, kv_via, categorized) if kv_via else None
    return _phase_peaks(trace, curves, device_level, less) if kv_via else {}


def _hook_totals(base: Figures, new: Figures, threshold: Threshold) -> list[Change]:
    names = sorted(set(base.hooks) | set(new.hooks))
    out = []
    for name in names:
        b = sum(base.hooks[name]) if name in base.hooks else None
        out.append(Change(name, b, sum(new.hooks.get(name, ())), _limit(threshold, b)))
    if len(names) < 2:
        return out
    b_all, n_all = sum(map(sum, base.hooks.values())), sum(map(sum, new.hooks.values()))
    return out + [Change(ALL_HOOKS, b_all, n_all, _limit(threshold, b_all))]


def compare(base: Figures, new: Figures, threshold: Threshold, *, label: str = "") -> TraceDiff:
    """The gate over two :class:`Figures` (the one comparator: diff and history check call it).

    Categories and sites need the traces: :func:`diff_ranks` adds them.
    """
    headline = []
    floor = _floor(base, new)
    moved = VIA_VMM in (base.kv_via, new.kv_via) and base.kv_via != new.kv_via and base.kv_via and new.kv_via
    vmm = VIA_VMM in (base.kv_via, new.kv_via)
    for name in HEADLINE:
        b, n = base.headline.get(name), new.headline.get(name)
        if b is None and n is None or (name == PEAK_HELD and not vmm):
            continue  # held is reserved itself when neither run committed memory outside PyTorch
        if name == PEAK_HELD:  # a figure stored before "held" was one: reserved, without a KV cache outside
            b = base.headline.get(PEAK_RESERVED) if b is None and base.kv_via != VIA_VMM else b
        note = ""
        if moved and name in TORCH_ONLY:
            note = MOVED_IN_NOTE if new.kv_via == VIA_TORCH else MOVED_OUT_NOTE
        elif moved and name == POST_KV:
            note = MOVED_WARMUP_NOTE
        limit = _limit(threshold, b, floor) if name in GATED and not note else None
        headline.append(Change(name, b, n, limit, new.where.get(name, ""), note))
    less_kv = bool(moved and base.phases_less_kv and new.phases_less_kv)  # like with like: both less the KV cache
    base_phases, new_phases = (base.phases_less_kv, new.phases_less_kv) if less_kv else (base.phases, new.phases)
    phases = []
    for key, (peak, inside, depth) in new_phases.items():
        if key in base_phases:
            b_peak, b_inside, _ = base_phases[key]
            limit = _limit(threshold, b_peak, floor)
            phases.append(PhaseChange(key, depth, Change(key, b_peak, peak, limit), b_inside, inside))
    names = sorted(set(base.hooks) | set(new.hooks))
    return TraceDiff(
        label=label,
        device_level=base.device_level and new.device_level,
        threshold=_threshold_text(threshold),
        headline=headline,
        phases=phases,
        categories=None,
        sites=[],
        hooks=[
            HookChange(
                n, len(base.hooks.get(n, ())), len(new.hooks.get(n, ())), base.hooks.get(n, ()), new.hooks.get(n, ())
            )
            for n in names
        ],  # fmt: skip
        hook_totals=_hook_totals(base, new, threshold),
        nested_hooks=[
            Change(n, base.nested.get(n), new.nested.get(n, 0), None)
            for n, _ in nested_order(set(base.nested) | set(new.nested), {**base.nested_in, **new.nested_in})
        ],
        nested_in={**base.nested_in, **new.nested_in},
        base_only_phases=[k for k in base.phases if k not in new.phases],
        new_only_phases=[k for k in new.phases if k not in base.phases],
        new_oom=new.oom if base.oom is None else None,
        mismatches=differences(base.fingerprint, new.fingerprint),
        left_to_vllm=new.left_to_vllm,
        kv_via=(base.kv_via, new.kv_via),
        environment_unknown=len(base.fingerprint) <= 1 or len(new.fingerprint) <= 1,  # "kind" alone
        ranked=Q.ALLOCATED.key if Q.ALLOCATED.key in (base.ranked, new.ranked) else Q.RESERVED.key,
        phases_less_kv=less_kv,
    )


def _sides(base: bool, new: bool) -> str:
    """ "both", "base", "new" or "" for a property each side has or not."""
    return "both" if base and new else "base" if base else "new" if new else ""


def diff_ranks(base, new, threshold: Threshold, *, label: str = "") -> TraceDiff:
    """Compare two analysed ranks (``analysis.rank.AnalysedRank``, the same process of two runs), sharing their figures."""
    bc, nc = base.curves, new.curves
    device_level = bc.has_device and nc.has_device

    def figures_of(rank) -> Figures:
        return figures(rank.trace, device_level=device_level, curves=rank.curves, less_kv=False)

    def less_kv(rank, f: Figures) -> Figures:
        return replace(f, phases_less_kv=phase_peaks_less_kv(rank.trace, rank.curves, f.device_level, f.kv_via,
                                                             rank.categorized))  # fmt: skip

    fb, fn = figures_of(base), figures_of(new)
    if fb.kv_via and fn.kv_via and fb.kv_via != fn.kv_via:  # the KV cache moved: its phases compare less it, added
        fb, fn = less_kv(base, fb), less_kv(new, fn)
    d = compare(fb, fn, threshold, label=label or new.label)
    sites = site_changes(base, new)
    cats = category_changes(base, new)
    moment = _sides(is_one_moment(base.trace.facts), is_one_moment(new.trace.facts))
    return replace(d, categories=cats, sites=sites.changes, sites_missing=sites.missing, one_moment=moment)


def diff_runs(base, new, threshold: Threshold) -> list[TraceDiff]:
    """Rank by rank, two analysed runs (``analysis.run.AnalysedRun``) in the loader's order.

    Raises:
        NothingToJudge: a rank of either run recorded no allocator events (exit 1: never a pass).
        UsageError: the runs hold different numbers of ranks.
    """
    from memtrace.errors import UsageError

    if len(base.ranks) != len(new.ranks):
        raise UsageError(
            f"{base.path} holds {len(base.ranks)} traces and {new.path} {len(new.ranks)}; pick one with --rank N"
        )
    base.require_every_rank("compare")
    new.require_every_rank("compare")
    return [diff_ranks(b, n, threshold, label=n.label) for b, n in zip(base.ranks, new.ranks, strict=True)]


def _threshold_text(threshold: Threshold) -> str:
    if threshold.fraction is not None:
        return f"{threshold.fraction * 100:g}%"
    return format_bytes(threshold.bytes or 0)


def compared(base: AnalysedRun, new: AnalysedRun, threshold) -> list:
    """``new`` against ``base``, rank by rank (:func:`diff_runs`), computed once per question and kept on ``new``
    (the gate's exit code and the renderer ask the same question)."""
    key = ("diff", id(base), threshold)
    if key not in new.memo:
        new.memo[key] = diff_runs(base, new, threshold)
    return new.memo[key]
