"""vLLM 0.34's extensible KV cache, sized after warm-up: its figures rebuilt from memtrace's curves (pure).

With the extensible KV cache (vLLM 0.34's default on CUDA) the profiled figure of
``determine_available_memory`` only sizes the address range; the cache's real size is measured after
warm-up and CUDA-graph capture (``measure_kv_cache_blocks``, phase ``kv_cache_sizing``) and committed in
``kv_cache_extend``. vLLM's formula (``measure_kv_cache_bytes``)::

    non_kv_used = init_free - free - committed
    headroom    = free + committed
    margin      = max(margin_floor, int(transient_peak * margin_fraction))
    available   = min(requested - non_kv_used, headroom - margin) - max(transient_peak, torch_reserve_growth)
    num_blocks  = the most blocks whose pages (each segment rounded up to whole granules) fit in available
    torch limit = reserved now + max(free - (pages(num_blocks) - committed) - (available - kv bytes) - non_torch_reserve, 0)

Each input is taken twice: as vLLM read it (the plugin's facts ``vllm.kv_cache_sizing`` and
``vllm.transient_peaks``) and as memtrace's own curves give it at the same moments:

- ``free``: CUDA's total minus this process's device-used curve and the other processes' memory at the
  moment vLLM read it (NVML; sampled, so a sample's lag can show), and the plugin's own
  ``cudaMemGetInfo`` reading at the end of ``kv_cache_sizing`` (the same call vLLM makes, a moment later,
  after nothing allocated);
- ``committed``: the VMM committed curve (``curves.committed_curve``: exact, one step per ``cuMemCreate``);
- ``transient_peak``: the larger of the profiled activation peak vLLM kept from ``determine_available_memory``
  and, at each ``record_transient_peak``, torch's allocated peak since the last reset minus allocated now,
  both from the allocator's events with torch's block rounding (:func:`torch_allocated_curve`);
- ``torch_reserve_growth``: for each sizing step (a reset of the peak counters inside
  ``kv_cache_sizing_warmup``), reserved peak until the step's closing ``record_transient_peak`` minus
  reserved at the reset minus what the step left allocated (reserved is exact: segments);
- ``requested`` is the target (``ceil(total x util)``), ``init_free`` vLLM's init snapshot (before
  recording starts, so vLLM's own figure); the margins are vLLM's constants, recorded with the facts.

The final committed bytes come from the VMM records after ``kv_cache_extend`` and must equal the pages
of ``num_blocks`` ("Extended KV cache to N blocks (X GiB)").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from memtrace import facts as F
from memtrace import vllm_phase_names as PN
from memtrace.analysis.capacity.reconcile import phase_reading, profiled_kv_bytes
from memtrace.analysis.memory.blocks import block_curve
from memtrace.analysis.memory.curves import Curve, Curves, all_curves, committed_curve
from memtrace.analysis.memory.quantities import window_max
from memtrace.model import ACTION_CODE, Trace

_ALLOC = ACTION_CODE["alloc"]
_FREE_COMPLETED = ACTION_CODE["free_completed"]
#: torch's caching allocator rounds every block up to a multiple of 512 B (``round_size``, without
#: ``roundup_power2_divisions``): its ``allocated_bytes`` counters count rounded blocks.
MIN_BLOCK_BYTES = 512
#: vLLM 0.34's margin below the free memory after warm-up on CUDA (``KV_CACHE_MARGIN_FLOOR_BYTES``, ``..._FRACTION``)
MARGIN_FLOOR_BYTES, MARGIN_FRACTION = 1 << 30, 0.75


def torch_allocated_curve(trace: Trace, curves: Curves | None = None) -> Curve:
    """Allocated bytes as torch's own counter counts them: its blocks (``blocks.block_curve``)."""
    return block_curve(trace, curves if curves is not None else all_curves(trace))


def measure_kv_cache_bytes(*, init_free: int, free: int, requested: int, transient_peak: int, torch_reserve_growth: int,
                           committed: int = 0, margin_floor: int = MARGIN_FLOOR_BYTES,
                           margin_fraction: float = MARGIN_FRACTION) -> tuple[int, int, int, int]:  # fmt: skip
    """vLLM 0.34's formula, its margins by default: (available, non_kv_used, headroom, margin)."""
    non_kv_used = init_free - free - committed
    headroom = free + committed
    margin = max(margin_floor, int(transient_peak * margin_fraction))
    available = min(requested - non_kv_used, headroom - margin)
    available -= max(transient_peak, torch_reserve_growth)
    return max(available, 0), non_kv_used, headroom, margin


def extensible_inputs(s: dict, lacks: int = 0, moved: int = 0, tr: float = 1.0) -> dict:
    """vLLM's post-warm-up sizing inputs as recorded (``s``: ``facts.VLLM_KV_SIZING``) on a card with ``lacks``
    bytes less free, the free memory after warm-up less ``moved`` more, the transients x ``tr``: the keyword
    arguments of :func:`measure_kv_cache_bytes` but ``requested``."""
    return dict(init_free=int(s["init_free_memory_bytes"]) - lacks, free=int(s["free_memory_bytes"]) - lacks - moved,
                committed=int(s["committed_bytes"]), transient_peak=int(s["transient_peak_bytes"] * tr),
                torch_reserve_growth=int(s["torch_reserve_growth_bytes"] * tr),
                margin_floor=int(s.get("margin_floor_bytes") or MARGIN_FLOOR_BYTES),
                margin_fraction=float(s.get("margin_fraction") or MARGIN_FRACTION))  # fmt: skip


def pages_for(num_blocks: int, strides: list[int], granule: int) -> int:
    """Bytes a commit of ``num_blocks`` maps: each segment's blocks rounded up to whole granules."""
    return sum(-(-num_blocks * s // granule) * granule for s in strides)


def blocks_within(num_bytes: int, strides: list[int], granule: int, capacity: int) -> int:
    """The most blocks whose pages fit in ``num_bytes`` (vLLM's ``ExtensibleKVCache.blocks_within``)."""
    per_block = sum(strides)
    n = min(num_bytes // per_block, capacity) if per_block else 0
    while n > 0 and pages_for(n, strides, granule) > num_bytes:
        n -= 1
    return max(n, 0)


def null_blocks(trace: Trace) -> tuple[int, int] | None:
    """(from when, bytes): what vLLM 0.34's extensible cache commits in ``kv_cache_init`` (its null block(s)), held
    until the cache is extended; None without that phase. The capacity model's and the what-if's pre-KV curves."""
    init = next((p for p in trace.phases if p.name == PN.KV_CACHE_INIT and p.end_us), None)
    return (init.end_us, int(committed_curve(trace, kv_cache_only=True).at(init.end_us))) if init is not None else None


def address_range(util: float, capacity: int, non_kv: int, per_block: int) -> tuple[int, int]:
    """The address range on a card, (bytes, blocks: the most the sizing after warm-up commits, ``capacity_blocks``):
    ``ceil(util x capacity) - non_kv`` (``Worker.determine_available_memory``), ``non_kv`` with no CUDA-graph estimate:
    ``profile_cudagraph_memory`` returns 0 in this mode, the graphs are captured later. ``fits`` and the what-if's."""
    range_bytes = profiled_kv_bytes(util, capacity, non_kv)
    return range_bytes, max(range_bytes // per_block, 0) if per_block else 0


def sized(inputs: dict, requested: int, strides: list[int], granule: int, most: int) -> tuple[int, int, int]:
    """vLLM 0.34's post-warm-up sizing on ``inputs`` (:func:`extensible_inputs`, moved to another card or other
    flags) to whole blocks: (available bytes, blocks (at most ``most``), the bytes their pages commit). The one
    extensible KV model ``fits`` and the what-if both size with."""
    available, *_ = measure_kv_cache_bytes(requested=requested, **inputs)
    blocks = blocks_within(available, strides, granule, most) if strides and granule else 0
    return available, blocks, pages_for(blocks, strides, granule) if blocks else 0


@dataclass(frozen=True)
class Term:
    """One input of the sizing, as vLLM had it and as memtrace's curves give it (None: not recorded)."""

    name: str
    vllm_bytes: int | None
    memtrace_bytes: int | None
    how: str

    @property
    def difference_bytes(self) -> int | None:
        return None if None in (self.vllm_bytes, self.memtrace_bytes) else self.memtrace_bytes - self.vllm_bytes


@dataclass(frozen=True)
class ExtensibleSizing:
    """vLLM 0.34's post-warm-up sizing, term by term, and what ``kv_cache_extend`` committed."""

    time_us: int  # when vLLM read free memory
    terms: tuple[Term, ...]
    margin_bytes: int
    available_bytes: int  # from vLLM's own inputs: must give vLLM's num_blocks
    num_blocks: int  # vLLM's result (its facts)
    num_blocks_from_inputs: int  # vLLM's formula on vLLM's inputs
    available_memtrace_bytes: int | None  # vLLM's formula on memtrace's terms
    num_blocks_memtrace: int | None
    bytes_per_block: int
    pages_bytes: int  # the pages of num_blocks (what the extension must commit)
    committed_final_bytes: int | None  # the KV cache's VMM committed bytes after kv_cache_extend
    kept_for_transients_bytes: int  # max(transient peak, torch reserve growth): "kept for transient activations"
    torch_limit_bytes: int | None  # the cap vLLM put on PyTorch's allocator
    notes: list[str] = field(default_factory=list)

    def term(self, name: str) -> Term:
        return next(t for t in self.terms if t.name == name)


def _int(d: dict, key: str) -> int | None:
    v = d.get(key)
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _transient_terms(trace: Trace, curves: Curves) -> tuple[int | None, int | None, list[str]]:
    """memtrace's transient peak and torch reserve growth, at the moments vLLM measured them."""
    records = [r for r in trace.facts.get(F.VLLM_TRANSIENT_PEAKS) or [] if isinstance(r, dict) and "time_us" in r]
    resets = sorted(int(t) for t in trace.facts.get(F.PEAK_RESETS_US) or [])
    if not records or not resets or not len(trace.events):
        return None, None, ["no record_transient_peak or peak-reset times: transient terms not rebuilt"]
    alloc = torch_allocated_curve(trace, curves)
    profiled = (trace.facts.get(F.VLLM_PROFILE) or {}).get("peak_activation_memory_bytes")
    peak = int(profiled) if isinstance(profiled, int) else 0
    for t in (int(r["time_us"]) for r in records):
        start = max((x for x in resets if x <= t), default=None)  # the last reset before it
        if start is not None:
            peak = max(peak, window_max(alloc, start, t) - alloc.at(t))
    sizing_phase = next((p for p in trace.phases if p.name == PN.KV_CACHE_SIZING_WARMUP and p.end_us), None)
    if sizing_phase is None:
        return peak, 0, ["no kv_cache_sizing_warmup phase: torch reserve growth not rebuilt"]
    growth = 0
    for reset in (x for x in resets if sizing_phase.start_us <= x <= sizing_phase.end_us):
        close = next((int(r["time_us"]) for r in records if int(r["time_us"]) > reset), None)
        if close is not None:
            left = max(alloc.at(close) - alloc.at(reset), 0)
            growth = max(growth, window_max(curves.reserved, reset, close) - curves.reserved.at(reset) - left)
    return peak, growth, []


def _free_memory(trace: Trace, curves: Curves, t_us: int, total: int | None) -> tuple[int | None, str]:
    """Free device memory when vLLM read it, as memtrace measured it.

    The plugin's own ``cudaMemGetInfo`` at the end of ``kv_cache_sizing`` is the call vLLM makes, a few
    hundred microseconds later with nothing allocated between (on the H200: equal to the byte). Without
    it: CUDA's total - non-PyTorch memory (NVML's last sample) - PyTorch reserved and VMM committed
    (exact, at that microsecond) - other processes. Not NVML's device used itself: vLLM empties
    PyTorch's cache just before it reads, and a sample taken before that release lags it (20 MiB on
    the H200).
    """
    r = phase_reading(trace, PN.KV_CACHE_SIZING, "end") or {}
    if isinstance(r.get("free_bytes"), int):
        return int(r["free_bytes"]), "cudaMemGetInfo read by the plugin at the end of kv_cache_sizing"
    if not total or not curves.has_device:
        return None, "not measured (no NVML samples)"
    held = curves.non_torch.at(t_us) + curves.reserved.at(t_us) + (curves.vmm.at(t_us) if len(curves.vmm) else 0)
    others = curves.others.at(t_us) if len(curves.others) else 0
    return total - held - others, "CUDA total - non-PyTorch (NVML) - PyTorch reserved - VMM committed - others"


def _terms(trace: Trace, curves: Curves, t: int, total: int | None, vllm: dict) -> tuple[tuple, list]:
    """Each input of the sizing as vLLM had it and as memtrace's curves give it at ``t``, and notes."""
    # memtrace's own figures at the moment vLLM read free memory
    free_mt, free_how = _free_memory(trace, curves, t, total)
    committed = curves.vmm.at(t) if len(curves.vmm) else None
    peak, growth, notes = _transient_terms(trace, curves)
    terms = (
        Term("init_free", vllm["init_free_memory"], None, "vLLM's init snapshot, taken before recording starts"),
        Term("free", vllm["free_memory"], free_mt, free_how),
        Term("committed", vllm["committed"], committed, "KV pages committed through the VMM API (exact)"),
        Term("requested", vllm["requested_memory"], trace.facts.get(F.TARGET_BYTES), "the target: ceil(total x util)"),
        Term("transient_peak", vllm["transient_peak"], peak,
             "allocated peak since the last reset - allocated (torch's rounding)"),
        Term("torch_reserve_growth", vllm["torch_reserve_growth"], growth,
             "reserved peak in a sizing step - reserved at its start - kept"),
    )  # fmt: skip
    return terms, notes


def extensible_sizing(trace: Trace, curves: Curves | None = None) -> ExtensibleSizing | None:
    """The sizing of an extensible KV cache, term by term; None for a trace without one."""
    sizing = trace.facts.get(F.VLLM_KV_SIZING)
    if not isinstance(sizing, dict) or "num_blocks" not in sizing:
        return None
    curves = curves or all_curves(trace)
    t = _int(sizing, "free_read_us") or _int(sizing, "time_us") or 0
    strides = [int(s) for s in sizing.get("segment_strides") or []]
    granule = _int(sizing, "granularity_bytes") or 0
    per_block = _int(sizing, "bytes_per_block") or sum(strides)
    capacity = _int(sizing, "capacity_blocks") or 0
    total = _int(sizing, "total_memory_bytes") or trace.process.device_total_bytes
    vllm = {k: _int(sizing, k + "_bytes") for k in ("init_free_memory", "free_memory", "committed", "requested_memory")}
    vllm["transient_peak"] = _int(sizing, "transient_peak_bytes")
    vllm["torch_reserve_growth"] = _int(sizing, "torch_reserve_growth_bytes")
    if None in vllm.values():  # vLLM's sizing inputs are incomplete in this trace
        return None
    terms, notes = _terms(trace, curves, t, total, vllm)
    inputs = extensible_inputs(sizing)  # vLLM's own, as recorded
    available, _, _, margin = measure_kv_cache_bytes(requested=vllm["requested_memory"], **inputs)
    n_vllm = int(sizing["num_blocks"])
    n_inputs = (
        blocks_within(available, strides, granule, capacity) if strides and granule else available // max(per_block, 1)
    )
    mt_available = mt_blocks = None
    mt = {t_.name: t_.memtrace_bytes for t_ in terms}
    if all(mt[k] is not None for k in ("free", "committed", "requested", "transient_peak", "torch_reserve_growth")):
        mine = {k: int(mt[k]) for k in ("free", "committed", "transient_peak", "torch_reserve_growth")}
        mt_available, *_ = measure_kv_cache_bytes(**{**inputs, **mine}, requested=int(mt["requested"]))
        if strides and granule:
            mt_blocks = blocks_within(mt_available, strides, granule, capacity)
    pages = pages_for(n_vllm, strides, granule) if strides and granule else n_vllm * per_block
    extend = next((p for p in trace.phases if p.name == PN.KV_CACHE_EXTEND and p.end_us), None)
    final = None
    if extend is not None and len(trace.vmm):
        final = committed_curve(trace, kv_cache_only=True).at(extend.end_us)
    elif extend is None:
        notes.append("no kv_cache_extend phase: the KV cache was not committed to its final size while recording")
    kept = max(vllm["transient_peak"], vllm["torch_reserve_growth"])
    return ExtensibleSizing(t, terms, margin, available, n_vllm, n_inputs, mt_available, mt_blocks, per_block, pages,
                            final, kept, _int(sizing, "torch_memory_limit_bytes"), notes)  # fmt: skip
