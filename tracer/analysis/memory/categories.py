"""What kind of memory each allocation is: weights, KV cache, activations, FlashInfer workspace...

Every allocation (an ``alloc`` event, or a block that was already live when recording began) gets
exactly one category, decided by the first rule that applies, in this order:

1. **flashinfer_workspace** — allocated while a hooked function was running (``trace.hook_calls``
   time windows, nested calls included). Hooks are FlashInfer's workspace allocators by default
   (``allocate_sm120_dynamic_workspace`` and siblings); ``MEMTRACE_HOOKS`` adds others, and their
   allocations land here too. The window is one of time, not of thread: an allocation made by
   another thread during the call is counted in. Also, without hook calls (hooks off, an imported
   torch snapshot): an allocation whose recorded stack passes through one of FlashInfer's workspace
   allocators (``WORKSPACE_FUNCTIONS``).
2. **cudagraph_pool** — the block lies in a segment of a private pool in the final snapshot
   (``Segment.pool_id != "0,0"``; CUDA-graph capture allocates from such pools) and was allocated
   after that segment was created; or it was allocated inside a graph-capture phase
   (``capture_model``; ``cudagraph_profile``, vLLM's estimate of graph memory, whose minimal
   ``is_profiling`` KV cache and sample captures are freed again when it ends).
3. By the phase it was allocated in: the innermost phase whose name is known (the ``_*_PHASES`` below) decides,
   an unknown name (a user's ``memtrace.phase``) defers to its parent, and none known is **activations**.
   ``load_model`` → **weights**, except vLLM's sampler's buffers (a stack through a ``sample/`` folder of vLLM)
   → **other**; a KV-cache phase → **kv_cache**, but **activations** inside a profiling phase (a KV cache made
   to profile is freed again); ``init_device`` → **other**; forward passes and warm-ups → **activations**.
4. Outside every phase, and blocks already live before the first recorded event (the baseline), → **other**.

Frees carry the category of the allocation they release (paired by address, ``live.lifetimes``); a free with no
recorded allocation releases baseline memory and comes out of **other**. So the category curves add up, at every
step, to the exact ``Curves.allocated`` (requested bytes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from memtrace import vllm_phase_names as PN
from memtrace.analysis.holders.live import Lifetimes, lifetimes
from memtrace.analysis.memory.curves import Curves
from memtrace.analysis.memory.phases import phase_chain, phase_depth, recording_span
from memtrace.model import ACTION_CODE, Trace

#: Category names, in stacking order (bottom first). Codes are indices into this tuple.
CATEGORIES: tuple[str, ...] = (
    "weights",
    "kv_cache",
    "flashinfer_workspace",
    "cudagraph_pool",
    "activations",
    "other",
)
WEIGHTS, KV_CACHE, WORKSPACE, CUDAGRAPH, ACTIVATIONS, OTHER = range(len(CATEGORIES))

#: FlashInfer's workspace allocators (0.6.x, 0.7.x; see memtrace.plugins.flashinfer): a stack through
#: one of these makes an allocation flashinfer_workspace even when no hook recorded the call.
WORKSPACE_FUNCTIONS = frozenset(
    {
        "allocate_sm120_moe_workspace",
        "allocate_sm120_static_workspace",
        "allocate_sm120_dynamic_workspace",
        "_allocate_sm120_w4a16_workspace",
    }
)
#: Generic names that count only in FlashInfer's / b12x's own files.
_WORKSPACE_IN_FLASHINFER = frozenset({"_allocate_buffers", "_allocate_core_arena", "_alloc_route_workspace"})

_ALLOC = ACTION_CODE["alloc"]
_FREE = ACTION_CODE["free_completed"]
_SEG_ALLOC = (ACTION_CODE["segment_alloc"], ACTION_CODE["segment_map"])
_DEFAULT_POOL = "0,0"

# Phase-name rules (lower-cased, matched as substrings in this order; first hit wins).
_GRAPH_PHASES = (PN.CAPTURE_MODEL, PN.CUDAGRAPH_PROFILE, "profile_cudagraph", "cudagraph_capture", "capture_graph")
_KV_PHASES = (PN.KV_CACHE_INIT, "initialize_kv_cache", "allocate_kv_cache", "init_kv_cache", "initialize_from_config")
_WEIGHT_PHASES = (PN.LOAD_MODEL, "load_weights")
_OTHER_PHASES = (PN.INIT_DEVICE,)
_ACTIVATION_PHASES = (
    PN.PROFILE_RUN,
    "dummy_run",
    "dummy_sampler",
    PN.DETERMINE_AVAILABLE_MEMORY,
    "warm",  # compile_or_warm_up_model, kernel_warmup, warmup_kernels
    "forward",
    "execute_model",
)


def _rule_for_name(name: str) -> int | None:
    """The category a phase name decides, or None when the name is unknown (defer to the parent)."""
    low = name.lower()
    for keys, code in (
        (_GRAPH_PHASES, CUDAGRAPH),
        (_KV_PHASES, KV_CACHE),
        (_WEIGHT_PHASES, WEIGHTS),
        (_OTHER_PHASES, OTHER),
        (_ACTIVATION_PHASES, ACTIVATIONS),
    ):
        if any(k in low for k in keys):
            return code
    return None


def phase_categories(trace: Trace) -> list[int]:
    """The category code each phase assigns to allocations made directly inside it (rule 3)."""
    out = []
    for i in range(len(trace.phases)):
        chain = [trace.phases[j].name for j in phase_chain(trace, i)]
        profiling = any("profil" in n.lower() for n in chain)
        code = ACTIVATIONS
        for name in chain:  # innermost first
            rule = _rule_for_name(name)
            if rule is not None:
                code = ACTIVATIONS if (rule == KV_CACHE and profiling) else rule
                break
        out.append(code)
    return out


def innermost_phase_indices(trace: Trace, times_us: np.ndarray) -> np.ndarray:
    """For each time, the index of the innermost phase in force (start <= t < end), -1 outside.

    ``times_us`` need not be sorted. Vectorised: one pass per phase, shallow phases first.
    """
    times = np.asarray(times_us, dtype=np.int64)
    out = np.full(len(times), -1, dtype=np.int64)
    if not trace.phases or not len(times):
        return out
    _, end_of_trace = recording_span(trace)
    order = sorted(range(len(trace.phases)), key=lambda i: (phase_depth(trace, i), trace.phases[i].start_us, i))
    for i in order:
        p = trace.phases[i]
        end = p.end_us if p.end_us is not None else max(end_of_trace, p.start_us) + 1
        out[(times >= p.start_us) & (times < end)] = i
    return out


def in_hook_calls(trace: Trace, times: np.ndarray) -> np.ndarray:
    """Whether each of ``times`` lies inside a hook call's [start, end]: a call starting at or before it that
    ends at or after it (the latest end among the calls begun by then)."""
    spans = np.array(sorted((h.start_us, max(h.end_us, h.start_us)) for h in trace.hook_calls), np.int64)
    if not len(spans):
        return np.zeros(len(times), dtype=bool)
    k = np.searchsorted(spans[:, 0], times, side="right") - 1
    return (k >= 0) & (times <= np.maximum.accumulate(spans[:, 1])[np.clip(k, 0, None)])


def outermost_hook_calls(trace: Trace) -> tuple[int, int] | None:
    """(calls, bytes returned) of the hooked calls no other hooked call encloses: what the hooks returned in all,
    a nested call's bytes counted once (``summary.hook_totals`` counts them under each function they ran in, so
    those must not be added up); None without hook calls."""
    top = [c for c in trace.hook_calls if c.parent is None]
    return (len(top), sum(c.returned_bytes or 0 for c in top)) if trace.hook_calls else None


def _graph_pool_ranges(trace: Trace) -> list[tuple[int, int, int]]:
    """(start address, end address, created_us) of final-snapshot segments in private pools."""
    private = [s for s in trace.segments if s.pool_id not in ("", _DEFAULT_POOL)]
    if not private:  # no CUDA graph's pool: no pass over the events for segment creations
        return []
    ev = trace.events
    seg_mask = np.isin(ev["action"], _SEG_ALLOC)
    seg_addr, seg_time = ev["addr"][seg_mask], ev["time_us"][seg_mask]
    out = []
    for s in private:
        hits = np.flatnonzero(seg_addr == s.address)
        created = int(seg_time[hits[-1]]) if len(hits) else np.iinfo(np.int64).min
        out.append((s.address, s.address + s.total_bytes, created))
    return out


def _stacks_through(trace: Trace, hit) -> np.ndarray:
    """For each interned stack, whether it holds a frame for which ``hit(frame)`` is true."""
    hits = {i for i, f in enumerate(trace.frames) if hit(f)}
    if not hits:
        return np.zeros(len(trace.stacks), dtype=bool)
    return np.fromiter((not hits.isdisjoint(stack) for stack in trace.stacks), dtype=bool, count=len(trace.stacks))


def workspace_stacks(trace: Trace) -> np.ndarray:
    """For each interned stack, whether it passes through a FlashInfer workspace allocator."""

    def allocator(f) -> bool:
        in_flashinfer = "flashinfer" in f.filename or "b12x" in f.filename
        return f.name in WORKSPACE_FUNCTIONS or (f.name in _WORKSPACE_IN_FLASHINFER and in_flashinfer)

    return _stacks_through(trace, allocator)


def sampler_stacks(trace: Trace) -> np.ndarray:
    """For each interned stack, whether it passes through vLLM's sampler (a file in a ``sample/`` folder of
    vLLM: ``v1/sample/``, ``v1/worker/gpu/sample/``): state the sampler keeps, never the model's weights."""
    return _stacks_through(trace, lambda f: _is_sampler_file(f.filename.replace("\\", "/")))


def _is_sampler_file(path: str) -> bool:
    at = path.rfind("/vllm/")
    return at >= 0 and "/sample/" in path[at:] and path.endswith(".py")


def classify(trace: Trace, times_us: np.ndarray, addrs: np.ndarray, stacks: np.ndarray | None = None) -> np.ndarray:
    """Category codes (int8, indices into CATEGORIES) of allocations made at ``times_us`` at ``addrs``
    (with interned ``stacks``, -1 for none, when known).

    Applies rules 1-3 of the module docstring; a time outside every phase gives ``OTHER``.
    """
    times = np.asarray(times_us, dtype=np.int64)
    addrs = np.asarray(addrs, dtype=np.int64)
    codes = np.full(len(times), OTHER, dtype=np.int8)
    if not len(times):
        return codes
    phase_idx = innermost_phase_indices(trace, times)
    table = np.array(phase_categories(trace) + [OTHER], dtype=np.int8)  # index -1 -> OTHER
    codes[:] = table[phase_idx]
    for lo, hi, created in _graph_pool_ranges(trace):
        codes[(addrs >= lo) & (addrs < hi) & (times >= created)] = CUDAGRAPH
    codes[in_hook_calls(trace, times)] = WORKSPACE
    if stacks is not None and len(trace.stacks):
        st = np.asarray(stacks, dtype=np.int64)
        st = np.where((st >= 0) & (st < len(trace.stacks)), st, -1)
        if (codes == WEIGHTS).any():
            sampler = np.append(sampler_stacks(trace), False)  # index -1 (no stack) -> False
            codes[(codes == WEIGHTS) & sampler[st]] = OTHER
        ws = np.append(workspace_stacks(trace), False)
        codes[ws[st]] = WORKSPACE
    return codes


@dataclass(frozen=True)
class Categorized:
    """Category code of every event (-1 for events that are not alloc/free_completed)."""

    codes: np.ndarray  # int8, one per event


def categorize(trace: Trace, lt: Lifetimes | None = None) -> Categorized:
    """Categories of all alloc and free_completed events of ``trace`` (see the module docstring).

    Frees are paired with their allocations by ``live.lifetimes`` (pass it to share the work).
    """
    lt = lt if lt is not None else lifetimes(trace)
    ev = trace.events
    n = len(ev)
    codes = np.full(n, -1, dtype=np.int8)
    allocs = np.flatnonzero(ev["action"] == _ALLOC)
    codes[allocs] = classify(trace, ev["time_us"][allocs], ev["addr"][allocs], ev["stack"][allocs])
    frees = ev["action"] == _FREE
    codes[frees] = OTHER  # frees of memory allocated before recording, unless paired below
    paired = (lt.alloc_pos >= 0) & (lt.free_pos < n)
    a_pos, f_pos = lt.alloc_pos[paired], lt.free_pos[paired]
    is_free = frees[f_pos]  # the allocation's end may be a later alloc at its address (a lost free)
    codes[f_pos[is_free]] = codes[a_pos[is_free]]
    return Categorized(codes=codes)


@dataclass(frozen=True)
class CategorySteps:
    """Allocated bytes by category at any curve index, without building the curves: per category the
    positions of its events and the running sum of their signed sizes (one pass over the events, not
    one per category). ``at(idx)[k]`` is category ``CATEGORIES[k]``'s allocated bytes after event ``idx - 1``."""

    positions: list[np.ndarray]  # event indices of each category, sorted
    sums: list[np.ndarray]  # 0, then the running sum of those events' signed sizes
    starts: list[int]  # each category's value before the first event (the baseline is "other")

    def at(self, idx: np.ndarray) -> np.ndarray:
        """(len(CATEGORIES), len(idx)) int64: each category's bytes at curve indices ``idx``."""
        idx = np.asarray(idx, dtype=np.int64)
        rows = [
            st + sm[np.searchsorted(pos, idx, side="left")]
            for pos, sm, st in zip(self.positions, self.sums, self.starts, strict=True)
        ]
        return np.array(rows, dtype=np.int64).reshape(len(CATEGORIES), len(idx))


def category_totals_at(trace: Trace, categorized: Categorized, curves: Curves, index: int) -> np.ndarray:
    """``CategorySteps.at([index])[:, 0]`` in one weighted count (diff's one moment: not every step, 10x faster)."""
    ev = trace.events
    signed = np.where(ev["action"][:index] == _FREE, -1.0, 1.0) * ev["size"][:index]  # exact below 2**53 B
    sums = np.bincount(categorized.codes[:index].astype(np.intp) + 1, signed, minlength=len(CATEGORIES) + 1)
    out = sums[1:].astype(np.int64)
    out[OTHER] += curves.baseline.allocated_bytes
    return out


def category_steps(trace: Trace, categorized: Categorized, curves: Curves) -> CategorySteps:
    """:class:`CategorySteps` of ``trace`` (what the view's zoom reads at a few thousand indices)."""
    ev = trace.events
    positions, sums = [], []
    for code in range(len(CATEGORIES)):  # only allocs and frees have a category: +size, -size
        pos = np.flatnonzero(categorized.codes == code)  # (no sort or signed size of every event: 10M are 80 MB each)
        delta = ev["size"][pos].astype(np.int64)
        delta[ev["action"][pos] == _FREE] *= -1
        positions.append(pos)
        sums.append(np.concatenate(([0], np.cumsum(delta))).astype(np.int64))
    starts = [curves.baseline.allocated_bytes if code == OTHER else 0 for code in range(len(CATEGORIES))]
    return CategorySteps(positions, sums, starts)
