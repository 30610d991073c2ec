"""Compare two traces of the same start-up: what grew, where, and whether it breaks a threshold.

The gate (``TraceDiff.regressions``) fails when any of these grew by more than the threshold:
the peak of every phase (matched by phase path; a phase repeated under the same path is matched by
occurrence, ``profile_run#2``), the memory before KV sizing, and the post-KV transient. Phase
peaks are gated one by one, so a regression inside ``profile_run`` fails even when the global
peak (often in warm-up) did not move. Growth below ``MIN_GROWTH_BYTES`` never fails a percentage
threshold: it is allocator rounding, not a regression.

Everything else (categories, sites, FlashInfer workspace calls) explains the change. Pure
functions over Traces; rendering is the CLI's job.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ..model import FACT_OOM, Frame, Trace
from ..units import MiB, Threshold
from .curves import Curves, all_curves
from .landmarks import Landmarks, landmarks, total_curve
from .live import holders_by_stack, lifetimes
from .phases import phase_stats, window_peak

#: Growth under this never fails a percentage threshold (one large-segment rounding unit).
MIN_GROWTH_BYTES = 2 * MiB
#: How many sites to report.
TOP_SITES = 8


@dataclass(frozen=True)
class Change:
    """One figure in both runs. ``base``/``new`` are None where a run lacks it."""

    label: str
    base: int | None
    new: int | None
    limit: int | None = None  # allowed growth in bytes; None: the figure is not gated
    phase: str = ""  # where the new value happened (peaks)

    @property
    def delta(self) -> int | None:
        if self.base is None or self.new is None:
            return None
        return self.new - self.base

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
        if self.inside_base is None or self.inside_new is None:
            return None
        return self.inside_new - self.inside_base


@dataclass(frozen=True)
class SiteChange:
    """Live bytes of one allocating stack at each run's peak."""

    frames: tuple[Frame, ...]  # innermost first, from the run that has it (new preferred)
    base_bytes: int
    new_bytes: int

    @property
    def delta(self) -> int:
        return self.new_bytes - self.base_bytes

    @property
    def is_new(self) -> bool:
        return self.base_bytes == 0 and self.new_bytes > 0


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


@dataclass
class TraceDiff:
    """The comparison of one process's trace in both runs."""

    label: str
    device_level: bool  # both traces hold NVML samples: figures include non-PyTorch memory
    threshold: str
    headline: list[Change]  # available KV, memory before KV sizing, KV cache, post-KV transient, peak
    phases: list[PhaseChange]
    categories: list[Change] | None  # None when memtrace.analysis.categories is unavailable
    sites: list[SiteChange]
    hooks: list[HookChange]
    base_only_phases: list[str] = field(default_factory=list)
    new_only_phases: list[str] = field(default_factory=list)
    new_oom: str | None = None  # the new run died of OOM (and the base did not): where

    @property
    def regressions(self) -> list[Change]:
        gated = [c for c in self.headline if c.over] + [p.peak for p in self.phases if p.peak.over]
        return gated

    @property
    def failed(self) -> bool:
        return bool(self.regressions) or self.new_oom is not None


def _limit(threshold: Threshold, base: int | None) -> int | None:
    if base is None:
        return None
    if threshold.fraction is not None:
        return max(threshold.of(abs(base)), MIN_GROWTH_BYTES)
    return threshold.of(abs(base))


def _phase_peaks(trace: Trace, curves: Curves, device_level: bool) -> dict[str, tuple[int, int, int, str]]:
    """path (with #n for repeats) -> (peak, peak above start, depth, path of the peak's phase)."""
    curve = total_curve(curves, include_non_torch=device_level)
    seen: Counter[str] = Counter()
    out: dict[str, tuple[int, int, int, str]] = {}
    for st in phase_stats(trace, curves):
        seen[st.path] += 1
        key = st.path if seen[st.path] == 1 else f"{st.path}#{seen[st.path]}"
        peak, _ = window_peak(curve, st.start_us, st.end_us)
        out[key] = (peak, peak - curve.at(st.start_us), st.depth, st.path)
    return out


def _site_key(trace: Trace, stack: int) -> tuple[tuple[str, int, str], ...]:
    return tuple((f.filename, f.line, f.name) for f in trace.stack_frames(stack))


def _sites_at_peak(trace: Trace, curves: Curves) -> dict[tuple, tuple[int, tuple[Frame, ...]]]:
    """Live bytes by stack at the reserved peak (``flame.peak_event_index``: the fullest moment of it)."""
    if len(trace.events) == 0 and not trace.segments:
        return {}
    from .flame import peak_event_index

    idx = peak_event_index(curves.allocated, curves.reserved)  # the event after which the peak holds
    lt = lifetimes(trace)
    holders = holders_by_stack(trace, top=1 << 30, event_index=idx, lt=lt)
    out: dict[tuple, tuple[int, tuple[Frame, ...]]] = {}
    for h in holders:
        key = _site_key(trace, h.stack)
        prev = out.get(key, (0, ()))[0]
        out[key] = (prev + h.bytes, tuple(trace.stack_frames(h.stack)))
    return out


def site_changes(
    base: Trace, new: Trace, base_curves: Curves, new_curves: Curves, top: int = TOP_SITES
) -> list[SiteChange]:
    """Stacks that are new at the new run's peak or whose live bytes grew most; then those that shrank most."""
    b = _sites_at_peak(base, base_curves)
    n = _sites_at_peak(new, new_curves)
    changes = []
    for key in set(b) | set(n):
        bb, bf = b.get(key, (0, ()))
        nb, nf = n.get(key, (0, ()))
        if nb != bb:
            changes.append(SiteChange(nf or bf, bb, nb))
    grew = sorted((c for c in changes if c.delta > 0), key=lambda c: -c.delta)
    shrank = sorted((c for c in changes if c.delta < 0), key=lambda c: c.delta)
    return grew[:top] + shrank[: max(0, top - len(grew[:top])) // 2]


def _hook_bytes(trace: Trace) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for c in trace.hook_calls:
        if c.parent is not None:
            continue  # nested calls are counted by their outermost hooked caller
        b = c.returned_bytes if c.returned_bytes is not None else (c.allocated_delta_bytes or 0)
        out.setdefault(c.name, []).append(int(b))
    return out


def hook_changes(base: Trace, new: Trace) -> list[HookChange]:
    """Per hooked function: number of calls and bytes per call in both runs."""
    b, n = _hook_bytes(base), _hook_bytes(new)
    return [
        HookChange(name, len(b.get(name, [])), len(n.get(name, [])), tuple(b.get(name, [])), tuple(n.get(name, [])))
        for name in sorted(set(b) | set(n))
    ]


def category_changes(base: Trace, new: Trace, base_curves: Curves, new_curves: Curves) -> list[Change] | None:
    """Allocated bytes per category (weights, KV cache, workspaces...) at each run's reserved peak.

    None when ``memtrace.analysis.categories`` is not available.
    """
    try:
        from .categories import category_curves
    except ImportError:
        return None

    from .flame import peak_event_index

    def at_peak(trace: Trace, curves: Curves) -> dict[str, int]:
        if len(curves.reserved) == 0:
            return {}
        # the same moment as the sites: right after the peak's fullest event (curve index = event + 1)
        i = peak_event_index(curves.allocated, curves.reserved) + 1
        return {name: int(c.bytes[i]) for name, c in category_curves(trace).items()}

    bd, nd = at_peak(base, base_curves), at_peak(new, new_curves)
    names = [k for k in dict.fromkeys([*bd, *nd])]
    return [Change(k, bd.get(k, 0), nd.get(k, 0)) for k in names]


def _headline(lb: Landmarks, ln: Landmarks, threshold: Threshold) -> list[Change]:
    def peak_of(m):
        return m.bytes if m is not None else None

    return [
        Change("available KV cache (vLLM)", lb.vllm_available_kv_bytes, ln.vllm_available_kv_bytes),
        Change(
            "memory before KV sizing", lb.before_kv_bytes, ln.before_kv_bytes, _limit(threshold, lb.before_kv_bytes)
        ),
        Change("KV cache", lb.kv_cache_bytes, ln.kv_cache_bytes),
        Change(
            "post-KV transient",
            lb.post_kv_transient_bytes,
            ln.post_kv_transient_bytes,
            _limit(threshold, lb.post_kv_transient_bytes),
            ln.post_kv_peak.phase if ln.post_kv_peak else "",
        ),
        Change("peak", peak_of(lb.peak), peak_of(ln.peak), phase=ln.peak.phase),
    ]


def _oom_phase(trace: Trace) -> str | None:
    oom = trace.facts.get(FACT_OOM)
    if not oom:
        return None
    from .phases import path_at

    t = oom.get("time_us") if isinstance(oom, dict) else None
    return (path_at(trace, int(t)) or "outside any phase") if t is not None else "unknown phase"


def diff_traces(base: Trace, new: Trace, threshold: Threshold, *, label: str = "") -> TraceDiff:
    """Compare ``new`` against ``base`` (the same process of two runs)."""
    bc, nc = all_curves(base), all_curves(new)
    device_level = bc.has_device and nc.has_device
    # compare like with like: reserved-only figures on both sides unless both have NVML samples
    lb = landmarks(base, bc, include_non_torch=device_level)
    ln = landmarks(new, nc, include_non_torch=device_level)
    bp = _phase_peaks(base, bc, device_level)
    np_ = _phase_peaks(new, nc, device_level)
    phases = []
    for key, (peak, inside, depth, _) in np_.items():
        if key in bp:
            b_peak, b_inside, _, _ = bp[key]
            phases.append(
                PhaseChange(key, depth, Change(key, b_peak, peak, _limit(threshold, b_peak)), b_inside, inside)
            )
    new_oom = _oom_phase(new) if _oom_phase(base) is None else None
    return TraceDiff(
        label=label or new.label,
        device_level=device_level,
        threshold=_threshold_text(threshold),
        headline=_headline(lb, ln, threshold),
        phases=phases,
        categories=category_changes(base, new, bc, nc),
        sites=site_changes(base, new, bc, nc),
        hooks=hook_changes(base, new),
        base_only_phases=[k for k in bp if k not in np_],
        new_only_phases=[k for k in np_ if k not in bp],
        new_oom=new_oom,
    )


def _threshold_text(threshold: Threshold) -> str:
    if threshold.fraction is not None:
        return f"{threshold.fraction * 100:g}%"
    from ..units import format_bytes

    return format_bytes(threshold.bytes or 0)
