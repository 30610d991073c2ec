"""Will it boot with other flags? vLLM start-up memory predicted for changed flags, from a recorded start-up
(docs/whatif.md, "The model").

Every allocation PyTorch made after ``load_model`` is assigned to a **site** (its Python stack, or the phase it was
made in) and the site to a **kind** with a scaling rule (:data:`RULES`). With one trace the rules are the documented
ones (an **estimate**); with two or more traces of the same model (:func:`calibrate`) each (phase, kind)'s peak
bytes are fitted to ``a + b x`` of its flag. The predicted curve is the recorded need (:func:`need_curve`) with
each kind's live bytes scaled, the recorded KV cache taken out and the new one put in where vLLM allocates it, sized
again by vLLM's formula (profiled, or 0.34's extensible one: ``extensible.sized``). The card is the card alone
unless ``others_bytes`` is given. Pure functions over a Trace; bytes and microseconds.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
from memtrace import facts as F
from memtrace import vllm_phase_names as PN
from memtrace.analysis.analysed.landmarks import Landmarks, total_curve
from memtrace.analysis.capacity import priors as P
from memtrace.analysis.capacity import shape as S
from memtrace.analysis.capacity.extensible import address_range, extensible_inputs, null_blocks, sized
from memtrace.analysis.capacity.reconcile import MEMTRACE as NON_KV_MEMTRACE
from memtrace.analysis.capacity.reconcile import profiled_kv_bytes
from memtrace.analysis.holders.frames import meaningful_frame
from memtrace.analysis.holders.live import Lifetimes
from memtrace.analysis.memory.categories import sampler_stacks
from memtrace.analysis.memory.curves import Curve, Curves, committed_curve
from memtrace.analysis.memory.phases import path_at, phase_at, phase_path
from memtrace.analysis.memory.pinned import pinned_curve
from memtrace.analysis.memory.quantities import array_max, first_max
from memtrace.errors import UsageError
from memtrace.model import Trace
from memtrace.units import parse_fraction

TOKENS, SEQS, GRAPHS, KV, FIXED, UNSTACKED = "tokens", "seqs", "graphs", "kv", "fixed", "no stack"
GRAPHS_KEPT = "graphs kept"
COMPILE = "compile"  # a cold compile's autotuning example of the LM head (torch/_inductor/select_algorithm.py)
SCALED = (TOKENS, SEQS, GRAPHS, GRAPHS_KEPT)
#: The one-trace rule of each kind, in words.
RULES = {
    TOKENS: "x max-num-batched-tokens (activations and workspaces of the dummy forward passes)",
    SEQS: "x max-num-seqs (sampler and logits: one vocabulary row per request)",
    GRAPHS: "x the number of CUDA graphs captured (vLLM's capture sizes; 0 with enforce-eager): what capture "
    "allocates and frees",
    GRAPHS_KEPT: "as recorded, 0 with enforce-eager: what the captured graphs keep after capture (their memory pool, "
    "which the graphs share: 33.6 MB after 5 graphs, 35.7 MB after 51 on the H200 traces, not their count)",
    KV: "sized again by vLLM's formula",
    FIXED: "as recorded (weights, init_device, load_model, non-PyTorch memory, allocator rounding, the logits of "
    "0.34's KV-sizing warm-up: 1,024 rows on the H200 traces, neither flag's value)",
    UNSTACKED: "as recorded: no stack was recorded, so it cannot be scaled",
    COMPILE: "as recorded (the LM head's example, padded vocabulary x hidden x 2 B; other autotuning examples are the "
    "tokens'); a change that recompiles (a flag in vLLM's compile-cache key, enforce-eager off) puts it in "
    "profile_run: the recording's, else the prior's (issue 43: 1.25 GiB on Gemma3, 1,002 MiB on the dense model)",
}
BOOTS, DIES, REFUSES, UNKNOWN = "boots", "dies", "refuses", "unknown"
#: the flags in vLLM 0.34's compile-cache key (``compile_factors`` of ``config/model.py``, ``cache.py``,
#: ``scheduler.py``: not in their ``ignored_factors``); utilization and the extensible KV cache are not
COMPILE_FACTORS = ("max_num_batched_tokens", "max_num_seqs", "max_model_len", "kv_cache_dtype")
PRE_KV_WHY = "before the KV cache is sized: --gpu-memory-utilization cannot help there"
NO_ROOM_WHY = 'no memory left for one request of max-model-len tokens ("No available memory for the cache blocks")'
#: Where a phase's predicted figure comes from (``PhasePeak.source``).
RECORDED, SCALED_FROM_RECORDING, PRIOR = "recorded", "scaled", "prior"
#: vLLM's default --gpu-memory-utilization by release (since (major, minor): with the extensible KV cache, without),
#: newest first: 0.34 resolves it with the sizing mode (``resolved_gpu_memory_utilization``); 0.33 resolved 0.92
#: (tests/data/vllm-h200-033/moe, source ``vllm-default``); before, 0.9.
VLLM_DEFAULT_UTIL = ((F.VLLM_EXTENSIBLE_SINCE, 1.0, 0.92), ((0, 33), 0.92, 0.92), ((0, 0), 0.9, 0.9))


def resolved_util(user: float | None, version: tuple[int, int], extensible: bool) -> float:
    """vLLM's ``resolved_gpu_memory_utilization``: the user's, else the release's default for the sizing mode."""
    return user if user is not None else next(e if extensible else p for v, e, p in VLLM_DEFAULT_UTIL if version >= v)


def recorded_release(trace, unknown: tuple[int, int] = F.VLLM_EXTENSIBLE_SINCE) -> tuple[int, int]:
    """The recorded vLLM's (major, minor) (``facts.vllm_release``); ``unknown`` where the trace does not say (by
    default 0.34, the newest release :data:`VLLM_DEFAULT_UTIL` knows)."""
    return F.vllm_release(trace.facts.get(F.VLLM_VERSION)) or unknown


def knows_extensible(trace) -> bool:
    """The recorded vLLM is known to have the extensible KV cache (0.34 or later; not when the trace does not say)."""
    return recorded_release(trace, (0, 0)) >= F.VLLM_EXTENSIBLE_SINCE


def one_request_bytes(max_model_len: int, bytes_per_block: float, tokens_per_block: int) -> int:
    """KV bytes one request of ``max_model_len`` tokens needs: whole blocks (vLLM refuses to start below it)."""
    return math.ceil(math.ceil(max_model_len / tokens_per_block) * bytes_per_block)


def need_curve(
    trace: Trace, curves: Curves, lm: Landmarks, non_torch_bytes: int | None = None, lt: Lifetimes | None = None
) -> Curve:
    """What the start-up needs on the card at each moment: the pinned segments (``pinned``: what the
    allocator cannot release) plus non-PyTorch memory, as recorded (steady NVML samples) or, when
    ``non_torch_bytes`` is given, that constant (another card's CUDA context, say)."""
    base = pinned_curve(trace, curves, lt)
    if non_torch_bytes is not None:
        return Curve(base.time_us, base.bytes + int(non_torch_bytes))
    return total_curve(curves, include_non_torch=lm.device_level, base=base)


def kv_block(facts: dict) -> tuple[int, int | None]:
    """(bytes per KV block, tokens per block) as recorded (0 / None where not recorded)."""
    blocks, kv = facts.get(F.VLLM_KV_BLOCKS), facts.get(F.VLLM_KV_BYTES)
    per = (facts.get(F.VLLM_KV_SIZING) or {}).get("bytes_per_block") or (kv // blocks if blocks and kv else 0)
    return int(per), F.kv_tokens_per_block(facts)


def recorded_one_request(trace, kv_bytes: int | None = None) -> int | None:
    """:func:`one_request_bytes` at the recorded ``max_model_len`` and blocks (without blocks: ``kv_bytes`` over
    the recorded tokens, one token a block; else vLLM's arithmetic on the recorded model shape, as the what-if
    sizes a recording cut before KV sizing); None when the trace lacks the figures (not a vLLM trace)."""
    facts = trace.facts
    max_len = (facts.get(F.VLLM_CONFIG) or {}).get("max_model_len")
    per, tpb = kv_block(facts)
    tokens = facts.get(F.VLLM_KV_TOKENS)
    if not (per and tpb) and kv_bytes and isinstance(tokens, int) and tokens > 0:
        per, tpb = kv_bytes / tokens, 1
    elif not per:
        try:
            per, tpb = shape_block(trace, recorded_flags(trace), tpb)
        except ValueError:  # the recorded shape lacks what vLLM's KV arithmetic needs
            per = 0
    return one_request_bytes(max_len, per, tpb) if isinstance(max_len, int) and per and tpb else None


def kv_short(one_request: int | None, available: int) -> int:
    """The KV bytes vLLM lacks to start (its KV check refuses below one request of max-model-len tokens): one
    request less what is available (``-available`` where the one request's size is not known), the one figure of a
    KV refusal in the capacity model and the what-if."""
    return max(one_request - available, 0) if one_request is not None else -available


_AUTOTUNE_FILE = "_inductor/select_algorithm.py"
_KV_FUNCS = ("_allocate_kv_cache_buffer", "allocate_kv_cache", "_allocate_kv_cache_tensors")
_BEFORE = np.iinfo(np.int64).min
_NEVER = np.iinfo(np.int64).max


@dataclass(frozen=True)
class Flags:
    """The vLLM flags that move start-up memory. ``gpu_memory_utilization`` None: vLLM's default for the mode."""

    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    enforce_eager: bool
    kv_cache_dtype: str
    gpu_memory_utilization: float | None
    extensible: bool
    vllm: tuple[int, int] = F.VLLM_EXTENSIBLE_SINCE  # the recorded release (:func:`recorded_release`): its default util

    @property
    def util(self) -> float:
        return resolved_util(self.gpu_memory_utilization, self.vllm, self.extensible)

    @property
    def graphs(self) -> int:
        """How many CUDA graphs vLLM captures per mode (its default capture sizes; 0 with enforce-eager)."""
        if self.enforce_eager:
            return 0
        top = min(self.max_num_seqs * 2, 512, self.max_num_batched_tokens)  # sizes 1, 2, 4, then steps of 8 and 16
        return sum(s <= top for s in (1, 2, 4)) + len(range(8, min(top + 1, 256), 8)) + len(range(256, top + 1, 16))

    def changes(self, base: Flags) -> list[str]:
        """The command-line changes from ``base``, as a user types them."""
        out = []
        for f in dataclasses.fields(self):
            new, old = getattr(self, f.name), getattr(base, f.name)
            if new == old:
                continue
            flag = "--" + f.name.replace("_", "-")
            if f.name == "extensible":
                out.append("--enable-extensible-kv-cache" if new else "--no-enable-extensible-kv-cache")
            elif f.name == "enforce_eager":
                out.append("--enforce-eager" if new else "(no --enforce-eager)")
            elif new is None:
                out.append(f"(no {flag})")
            else:
                out.append(f"{flag} {new:g}" if isinstance(new, float) else f"{flag} {new}")
        return out


_FLAG_KEYS = {
    f.name.replace("_", "-"): f.name for f in dataclasses.fields(Flags) if f.name not in ("extensible", "vllm")
}
_FLAG_KEYS |= {"enable-extensible-kv-cache": "extensible", "extensible-kv-cache": "extensible"}
FLAG_NAMES = tuple(_FLAG_KEYS)


def recorded_flags(trace) -> Flags | None:
    """The flags the recorded start-up ran with (None: not a vLLM trace with its config)."""
    cfg = trace.facts.get(F.VLLM_CONFIG) or {}
    need = ("max_num_batched_tokens", "max_num_seqs", "max_model_len")
    if not all(isinstance(cfg.get(k), int) for k in need):
        return None
    return Flags(*(cfg[k] for k in need), bool(cfg.get("enforce_eager")), str(cfg.get("kv_cache_dtype") or "auto"),
                 user_util(trace), extensible_kv_cache(trace), recorded_release(trace))  # fmt: skip


def user_util(trace) -> float | None:
    """The recorded --gpu-memory-utilization unless vLLM chose it by default (None: another sizing mode moves it,
    :func:`resolved_util`); a trace that does not say who chose it (``facts.UTIL_SOURCE``) keeps vLLM's resolved figure."""
    u = trace.facts.get(F.UTIL)
    return float(u) if u and trace.facts.get(F.UTIL_SOURCE) != F.UTIL_VLLM_DEFAULT else None


def recorded_util(trace) -> float:
    """The utilization the recorded start-up ran with: the user's, else vLLM's default for the recorded release
    (unknown: 0.34) and sizing mode (``Flags.util`` of :func:`recorded_flags`, the one figure every model uses)."""
    return resolved_util(user_util(trace), recorded_release(trace), extensible_kv_cache(trace))


def extensible_kv_cache(trace) -> bool:
    """Whether the start-up sized its KV cache the extensible way (0.34's default where it died before sizing)."""
    source = trace.facts.get(F.VLLM_KV_SIZE_SOURCE)
    return source == F.KV_SIZED_EXTENSIBLE if source is not None else knows_extensible(trace)


def _bool(name: str, value: str) -> bool:
    v = value.strip().lower()
    if v in ("", "1", "on", "true", "yes"):
        return True
    if v in ("0", "off", "false", "no"):
        return False
    raise UsageError(f"--what-if {name}={value}: give on or off")


def apply_what_if(base: Flags, items: list[str]) -> Flags:
    """``base`` with each ``--what-if NAME=VALUE`` (or ``enforce-eager``, ``no-enforce-eager``) applied."""
    changes: dict = {}
    for item in items:
        name, _, value = item.partition("=")
        name = name.strip().lstrip("-")
        negate = name.startswith("no-") and name[3:] in _FLAG_KEYS
        key = _FLAG_KEYS.get(name[3:] if negate else name)
        if key is None:
            raise UsageError(f"--what-if {item}: unknown flag; use one of {', '.join(FLAG_NAMES)} (NAME=VALUE)")
        if key in ("enforce_eager", "extensible"):
            changes[key] = (not _bool(name, value)) if negate else _bool(name, value)
        elif key == "kv_cache_dtype":
            if value not in S.KV_CACHE_DTYPES:
                raise UsageError(f"--what-if {item}: kv-cache-dtype is one of {', '.join(S.KV_CACHE_DTYPES)}")
            changes[key] = value
        elif key == "gpu_memory_utilization":
            changes[key] = parse_fraction(value)
        else:
            try:
                n = int(value.replace(",", "").replace("_", ""))
            except ValueError:
                raise UsageError(f"--what-if {item}: give a whole number, e.g. {name}=2048") from None
            if n < 1:
                raise UsageError(f"--what-if {item}: must be at least 1")
            changes[key] = n
    return dataclasses.replace(base, **changes)


def flag_value(flags: Flags, kind: str) -> float:
    """The flag value a kind scales with."""
    by_kind = {TOKENS: flags.max_num_batched_tokens, SEQS: flags.max_num_seqs, GRAPHS: flags.graphs}
    return by_kind[kind] if kind != GRAPHS_KEPT else min(flags.graphs, 1)


@dataclass(frozen=True)
class Line:
    """A fitted ``a + b x`` of one (phase, kind) over several traces, and its root-mean-square residual."""

    a: float
    b: float
    residual_bytes: int
    points: int

    def at(self, x: float) -> float:
        return self.a + self.b * x


@dataclass(frozen=True)
class Calibration:
    """Per (phase name, kind) fits over several traces of one model (:func:`calibrate`)."""

    lines: dict[tuple[str, str], Line]
    traces: int


# ---------------------------------------------------------------------------------------------------------
# The recorded start-up, taken apart by site


class Sites:
    """One recorded start-up, its allocations assigned to kinds, on the need curve's time grid."""

    def __init__(self, rank, need: Curve):
        self.rank, self.trace, self.flags = rank, rank.trace, recorded_flags(rank.trace)
        self.time, self.need = need.time_us.astype(np.int64), need.bytes.astype(np.int64)
        lt = rank.lifetimes
        self.kind_of = kinds = self._kinds(lt)
        self.bytes: dict[str, np.ndarray] = {
            k: _live_at(lt.alloc_us[kinds == k], lt.free_us[kinds == k], lt.size[kinds == k], self.time)
            for k in (TOKENS, SEQS, GRAPHS, GRAPHS_KEPT, KV, UNSTACKED, COMPILE)
        }
        vmm = committed_curve(self.trace, kv_cache_only=True)
        extend = self._phase(PN.KV_CACHE_EXTEND)
        self.vmm_kv = np.zeros_like(self.time)
        if len(vmm) and extend is not None:
            warm = vmm.at(extend.start_us - 1)
            self.vmm_kv = np.where(self.time >= extend.start_us, np.maximum(vmm.at_each(self.time) - warm, 0), 0)
        self.held = self.need + self.vmm_kv  # the recorded curve: what the start-up needs, VMM KV pages included
        self.no_kv = self.need - self.bytes[KV]  # the recorded curve without any KV cache (torch's nor VMM's)

    def _phase(self, name: str):
        return next((p for p in self.trace.phases if p.name == name), None)

    def need_at(self, time_us: int) -> int:
        """The recorded need at ``time_us`` (the grid's last point at or before it)."""
        return int(self.need[max(int(np.searchsorted(self.time, time_us, side="right")) - 1, 0)])

    def windows(self, *names: str) -> list[tuple[int, int]]:
        return [(p.start_us, p.end_us or _NEVER) for p in self.trace.phases if p.name in names]

    def _kinds(self, lt) -> np.ndarray:
        t = self.trace
        load = self._phase(PN.LOAD_MODEL)
        load_end = (load.end_us or _NEVER) if load is not None else _BEFORE
        graph_w = self.windows(PN.CAPTURE_MODEL, PN.CUDAGRAPH_PROFILE)
        kv_w = self.windows(PN.KV_CACHE_INIT)
        sizing_w = self.windows(PN.KV_CACHE_SIZING_WARMUP)
        sampler = sampler_stacks(t)  # the sampler's files: ``categories``' one definition
        lm_head = lm_head_example_floor(t)

        @functools.cache
        def of_stack(s: int) -> str:
            frames = t.stack_frames(s)
            if any(f.name in _KV_FUNCS for f in frames):
                return KV
            if any(f.filename.endswith(_AUTOTUNE_FILE) for f in frames):
                return COMPILE
            if sampler[s] or any(f.name == "compute_logits" for f in frames):  # the sampler and the logits
                return SEQS
            return TOKENS

        out = np.empty(len(lt.size), dtype=object)
        for i in range(len(lt.size)):
            a = int(lt.alloc_us[i])
            s = int(lt.stack[i])
            if a == _BEFORE or a < load_end:
                # the weights and the rest of start-up's first phases stay as recorded, but for the sampler's
                # buffers made while loading (penalties.py: max-num-seqs rows of the vocabulary)
                out[i] = SEQS if a != _BEFORE and s >= 0 and of_stack(s) == SEQS else FIXED
                continue
            k = of_stack(s) if s >= 0 else UNSTACKED
            if k == COMPILE and lt.size[i] < lm_head:
                k = TOKENS  # an activation-shaped autotuning example: its GEMM's rows are the batched tokens
            in_kv = any(lo <= a <= hi for lo, hi in kv_w)
            if in_kv and k != KV and lt.size[i] >= 1 << 20 and any(lt.free_us[i] > hi for lo, hi in kv_w):
                k = KV  # what initialize_kv_cache made and kept: the KV cache, with or without a stack
            in_graph = any(lo <= a <= hi for lo, hi in graph_w)
            if k == KV and not in_kv:
                k = GRAPHS if in_graph else FIXED  # the minimal KV cache of the graph profile
            elif k == TOKENS and in_graph:
                k = GRAPHS
            if k == GRAPHS and all(lt.free_us[i] > hi for lo, hi in graph_w if lo <= a <= hi):
                k = GRAPHS_KEPT  # still held when its capture ended: the graphs' pool
            elif k == SEQS and any(lo <= a <= hi for lo, hi in sizing_w):
                k = FIXED  # the sizing warm-up's logits: 1,024 rows on the H200 traces, neither flag's value
            out[i] = k
        return out

    def top_sites(self, kind: str, t_us: int, n: int = 3) -> list[tuple[str, int]]:
        """The largest sites (innermost meaningful frame) of ``kind`` live at ``t_us``."""
        lt = self.rank.lifetimes
        m = (self.kind_of == kind) & (lt.alloc_us <= t_us) & (lt.free_us > t_us)
        tally: dict[str, int] = {}
        for s, z in zip(lt.stack[m], lt.size[m], strict=True):
            f = meaningful_frame(self.trace.stack_frames(int(s))) if s >= 0 else None
            name = f"{f.filename.rsplit('/', 1)[-1]}:{f.line} {f.name}" if f is not None else "(no stack)"
            tally[name] = tally.get(name, 0) + int(z)
        return sorted(tally.items(), key=lambda x: -x[1])[:n]

    def window_index(self, start_us: int, end_us: int) -> np.ndarray:
        lo = max(int(np.searchsorted(self.time, start_us, side="right")) - 1, 0)
        hi = int(np.searchsorted(self.time, end_us, side="right"))
        return np.arange(lo, max(hi, lo + 1))


def _live_at(alloc_us, free_us, size, times: np.ndarray) -> np.ndarray:
    """Bytes live at each of ``times`` of the allocations given (alive on [alloc, free))."""
    if not len(size):
        return np.zeros(len(times), np.int64)
    a = np.sort(alloc_us.astype(np.int64))
    order = np.argsort(alloc_us, kind="stable")
    ca = np.concatenate(([0], np.cumsum(size[order].astype(np.int64))))
    fo = np.argsort(free_us, kind="stable")
    f = free_us[fo].astype(np.int64)
    cf = np.concatenate(([0], np.cumsum(size[fo].astype(np.int64))))
    return ca[np.searchsorted(a, times, side="right")] - cf[np.searchsorted(f, times, side="right")]


# ---------------------------------------------------------------------------------------------------------
# Scaling


@dataclass(frozen=True)
class Scale:
    """How one kind moves in one phase: the factor and where it came from."""

    kind: str
    factor: float
    rule: str


def scale_of(kind: str, phase: str, rec: Flags, new: Flags, cal: Calibration | None, base_bytes: int) -> Scale:
    """The factor of ``kind`` in ``phase`` (fitted when calibrated, else the one-trace rule)."""
    x_new, x_rec = flag_value(new, kind), flag_value(rec, kind)
    if kind in (GRAPHS, GRAPHS_KEPT) and x_new == 0 and x_rec:
        return Scale(kind, 0.0, "no CUDA graphs are captured with enforce-eager")
    line = cal.lines.get((phase, kind)) if cal is not None else None
    if line is not None and base_bytes > 0:
        f = max(line.at(x_new), 0.0) / base_bytes
        return Scale(kind, f, f"fitted over {line.points} traces: {line.a:,.0f} B + {line.b:,.0f} B x {x_new:g} "
                              f"(residual {line.residual_bytes:,} B)")  # fmt: skip
    if x_new == x_rec:
        return Scale(kind, 1.0, "unchanged")
    if x_rec == 0:
        return Scale(kind, 1.0, "cannot scale: the recording captured no CUDA graphs (kept as recorded)")
    return Scale(kind, x_new / x_rec, f"{RULES[kind]}: x {x_new:g}/{x_rec:g} (estimate, one trace)")


def _phase_names(sites: Sites) -> np.ndarray:
    """The top-level-or-innermost phase name at each grid time (for per-phase calibration)."""
    return np.array([(p.name if (p := phase_at(sites.trace, int(t))) is not None else "") for t in sites.time])


# ---------------------------------------------------------------------------------------------------------
# The prediction


@dataclass(frozen=True)
class PhasePeak:
    """A phase's recorded and predicted peak, and what moved it (kind -> (recorded, predicted) bytes; the KV
    cache: the most the phase recorded, and what it holds on this card)."""

    phase: str
    recorded_bytes: int | None  # report's peak of the phase: device used (NVML, ``phases.phase_stats``); None unsampled
    needed_bytes: int  # what the start-up needed in the phase as recorded (pinned + non-PyTorch + KV)
    predicted_bytes: int  # the same on this card with these flags
    time_us: int
    after_kv: bool
    kinds: dict[str, tuple[int, int]]
    sites: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    #: where the predicted figure comes from: RECORDED (nothing in it moved), SCALED (the recording, kinds moved
    #: by their rules or fits) or PRIOR (a phase the recording never reached, e.g. cut by its OOM: from the
    #: model's config, issue 43; no prior is built yet, so such a phase is not in the table)
    source: str = "recorded"


def lm_head_example_floor(trace) -> float:
    """The smallest autotuning example counted as the LM head's (:func:`.shape.lm_head_example_bytes`, 99 % of it);
    infinite without the shape (every example is then the tokens')."""
    return 0.99 * S.lm_head_example_bytes(S.ModelShape.from_facts(trace.facts)) or math.inf


def lm_head_example(trace) -> int | None:
    """The LM head's autotuning example (:func:`.shape.lm_head_example_bytes`) as the allocator asks for it (2 MiB
    blocks): what a cold compile's profile_run died asking for on the H100 (issue 43: 594 MiB on Qwen3-MoE, 1,002 MiB
    on a Llama-shaped model, both untied: "Failed to run autotuning code block: CUDA out of memory"). None without
    the shape."""
    example = S.lm_head_example_bytes(S.ModelShape.from_facts(trace.facts))
    return -(-example // (2 << 20)) * (2 << 20) if example else None


def model_shape(trace) -> dict | None:
    """The model's shape as recorded (``facts.VLLM_MODEL_SHAPE``; ``fits --config`` gives it to older recordings)."""
    shape = trace.facts.get(F.VLLM_MODEL_SHAPE)
    return shape if isinstance(shape, dict) and shape.get("hidden_size") else None


def shape_block(trace, flags: Flags | None, tokens_per_block: int | None) -> tuple[int, int]:
    """(bytes per KV block, tokens per block) by vLLM's arithmetic on the recorded model shape with ``flags``;
    (0, the block size) without the shape or flags."""
    shape = model_shape(trace)
    if shape is None or flags is None:
        return 0, tokens_per_block or 16
    dtype = (trace.facts.get(F.VLLM_CONFIG) or {}).get("dtype")
    plan = S.kv_plan(kv_shape(shape, flags, tokens_per_block or 16, dtype))
    return plan.bytes_per_block, plan.block_size


def kv_shape(shape: dict, flags: Flags, block_size: int, dtype: str | None = None):
    """The model's shape with the flags that size its KV cache (``shape.ModelShape``): vLLM 0.34's arithmetic on it
    (``shape.kv_plan``: groups, sliding windows, a hybrid's raised block, the blocks one request takes)."""
    cfg = {"kv_cache_dtype": flags.kv_cache_dtype, "block_size": block_size, "max_model_len": flags.max_model_len,
           "max_num_batched_tokens": flags.max_num_batched_tokens,
           "dtype": dtype or shape.get("dtype") or shape.get("torch_dtype") or "bfloat16"}  # fmt: skip
    return S.ModelShape.from_facts({F.VLLM_MODEL_SHAPE: shape, F.VLLM_CONFIG: cfg})


@dataclass(frozen=True)
class KvSizing:
    """vLLM's KV cache on one card: its available figure, blocks, tokens, and where it came from."""

    available_bytes: int
    blocks: int
    tokens: int
    kv_bytes: int
    concurrency: float  # tokens / max_model_len
    how: str
    one_request_bytes: int


@dataclass(frozen=True)
class Outcome:
    """The answer for one card: boots, dies in a phase by N bytes, or vLLM refuses."""

    capacity_bytes: int
    others_bytes: int  # other processes' memory kept on the card (0 unless --keep-others)
    others_left_out_bytes: int  # the recording's other processes' memory, not put on this card
    verdict: str  # BOOTS, DIES, REFUSES
    phase: str
    by_bytes: int  # DIES: over the card; REFUSES: short
    why: str
    kv: KvSizing | None
    phases: list[PhasePeak]
    pre_kv_peak_bytes: int
    pre_kv_peak_phase: str
    #: how much larger a card must be to boot with these flags (``boot``: the smallest such card less this one, to
    #: ``fits.SEARCH_STEP``); 0 when it boots; None where no card up to the search's ceiling does
    short_bytes: int | None = None
    #: past the recording's end the start-up was carried on from priors (issue 43): each component that came from
    #: a prior and its spread, in words ("" when every figure is recorded or scaled); the sum of the spreads of
    #: those vLLM's KV sizing reads, in bytes (how far the KV cache may be off)
    carried: str = ""
    spread_bytes: int | None = 0


class WhatIf:
    """The recorded start-up under ``flags``: the card-independent curve, and :meth:`on` for each card."""

    def __init__(self, sites: Sites, flags: Flags, cal: Calibration | None = None, library: P.Library | None = None):
        self.sites, self.flags, self.cal = sites, flags, cal
        #: the priors that carry the start-up past the recording's end (None: the shipped library, when asked)
        self.library = library
        self.rec = sites.flags
        self.notes: list[str] = []
        s = sites
        names = _phase_names(s) if cal is not None else np.full(len(s.time), "")  # one trace: one scale a kind
        self.scales: dict[str, Scale] = {}
        delta = np.zeros_like(s.held, dtype=np.float64)
        for k in SCALED:
            factor = np.ones(len(s.time))
            for ph in sorted(set(names.tolist())):
                m = names == ph
                base = int(s.bytes[k][m].max()) if m.any() else 0
                sc = scale_of(k, ph, self.rec, flags, cal, base)
                factor[m] = sc.factor
                if k not in self.scales or (sc.rule.startswith("fitted") and base > 0):
                    self.scales[k] = sc  # shown: a fitted phase's scaling, when there is one
            delta += (factor - 1.0) * s.bytes[k]
        if flags.enforce_eager and s.bytes[COMPILE].any():  # enforce-eager compiles nothing: no autotuning example
            delta -= s.bytes[COMPILE]
            self.notes.append(f"enforce-eager compiles nothing: the recorded autotuning examples "
                              f"({array_max(s.bytes[COMPILE]):,} B at most) are left out")  # fmt: skip
        if s.bytes[UNSTACKED].any():
            self.notes.append(
                f"{array_max(s.bytes[UNSTACKED]):,} B allocated without a recorded stack are kept as recorded "
                "(record with MEMTRACE_STACKS=python to scale them)"
            )
        if self.rec.graphs == 0 and flags.graphs > 0:
            self.notes.append("the recording captured no CUDA graphs (enforce-eager): their memory is not predicted")
        #: the predicted curve without any KV cache
        self.no_kv = s.no_kv + delta.astype(np.int64)
        self._failed = (0, 0)  # (grid index, bytes) of a recorded OOM's failed request as counted here
        oom = s.rank.oom
        if oom is not None:  # the request that failed counts at its moment (nothing after it is known)
            i = max(int(np.searchsorted(s.time, oom.time_us, side="right")) - 1, 0)
            example = (
                not self.rec.enforce_eager
                and PN.PROFILE_RUN in oom.phase_path.split("/")
                and oom.requested_bytes == lm_head_example(s.trace)
            )  # an eager recording compiled nothing
            # all of it (the start-up needs it to get past there: at no change, ``fits.failed_request_peak``'s rule),
            # unless it was the cold compile's example and the change turns compilation off
            count = 0 if example and flags.enforce_eager else oom.requested_bytes
            self.no_kv[i] += count
            self._failed = (i, count)  # not in vLLM's non-KV figure (:meth:`_moved_peak`)
            how = (", unscaled" if not example else " as the cold compile's autotuning example of the LM head "
                   f"(vocabulary x hidden x 2 B), {'which enforce-eager does not compile' if not count else 'unscaled'}")  # fmt: skip
            self.notes.append(
                f"the recording ends at its CUDA OOM in {oom.phase_path}: the failed {oom.requested_bytes:,} B "
                f"request counts there{how}; nothing after it is known"
            )
        self._cold_compile()
        extend = s._phase(PN.KV_CACHE_EXTEND)
        if extend is not None:  # vLLM allocates nothing else while extending; NVML's samples lag the VMM pages there
            self._hold(extend.start_us, _NEVER)
        #: the recorded phases vLLM does not run under ``flags`` (their names), flattened out of the curve
        self.skipped = skipped_phases(self.rec, flags)
        for name in self.skipped:
            self._flatten(name)
        if self.skipped:
            self.notes.append(
                f"without the extensible KV cache vLLM does not run {', '.join(self.skipped)}: what the recording "
                "allocated there is left out"
            )

    def recompiles(self) -> bool:
        """These flags change vLLM's compile-cache key for a model it compiles: it compiles again, cold."""
        f, r = self.flags, self.rec
        if f.enforce_eager or not S.ModelShape.from_facts(self.sites.trace.facts).torch_compiled:
            return False
        return r.enforce_eager or any(getattr(f, k) != getattr(r, k) for k in COMPILE_FACTORS)

    def _cold_compile(self) -> None:
        """A change that recompiles brings back Inductor's autotuning examples in profile_run (a 1.25 GiB example
        tensor on Gemma3's 262k x 2,560 vocabulary, issue 43): the recording's own, else the priors'."""
        s = self.sites
        p = s._phase(PN.PROFILE_RUN)
        #: the cold compile's autotuning examples put in profile_run (0: none; vLLM 0.34 counts them in its transient)
        self.compile_extra = 0
        if p is None or not self.recompiles():
            return
        idx = s.window_index(p.start_us, p.end_us if p.end_us is not None else int(s.time[-1]))
        recorded = int(s.bytes[COMPILE][idx].max())
        extra, src = recorded, "the recording's"
        if not recorded and model_shape(s.trace) is not None:
            prior = (self.library or P.load_library()).priors.get(P.COMPILE)
            shape = S.ModelShape.from_facts(s.trace.facts)
            extra = prior.bytes_for(P.features(shape, self.flags)[P.COMPILE]) if prior is not None else 0
            src = "the priors'"
        if not extra:
            return
        j = idx[0] + 1 if len(idx) > 1 else idx[0]
        self.no_kv[j] = max(self.no_kv[j], self.no_kv[idx[0]] + extra)
        self.compile_extra = extra
        self.notes.append(f"these flags recompile: a cold compile's autotuning examples, {extra:,} B ({src}), count "
                          "in profile_run")  # fmt: skip

    def _flatten(self, name: str) -> None:
        """Nothing allocated in the phases called ``name``: the curve holds its value from just before each."""
        for p in self.sites.trace.phases:
            if p.name == name:
                self._hold(p.start_us, p.end_us if p.end_us is not None else int(self.sites.time[-1]))

    def _hold(self, start_us: int, end_us: int) -> None:
        """The curve in [``start_us``, ``end_us``] holds its value from just before ``start_us``."""
        inside = (self.sites.time >= start_us) & (self.sites.time <= end_us)
        before = np.flatnonzero(self.sites.time < start_us)
        if inside.any() and len(before):
            self.no_kv[inside] = self.no_kv[before[-1]]

    # -- the phases --------------------------------------------------------------------------------------
    @cached_property
    def kv_at_us(self) -> int:
        """When the new KV cache exists: kv_cache_init (profiled), kv_cache_extend (extensible)."""
        name = PN.KV_CACHE_EXTEND if self.flags.extensible else PN.KV_CACHE_INIT
        p = self.sites._phase(name)
        if p is None and self.flags.extensible and self.sites.trace.facts.get(F.VLLM_KV_BLOCKS) == 0:
            return _NEVER  # vLLM sized 0 blocks and refused: no KV cache was ever committed
        p = p or self.sites._phase(PN.KV_CACHE_INIT)
        return p.start_us if p is not None else _NEVER

    def _window_peak(self, curve: np.ndarray, start: int, end: int) -> tuple[int, int]:
        idx = self.sites.window_index(start, end)
        j = idx[first_max(curve[idx])]
        return int(curve[j]), int(self.sites.time[j])

    def curve(self, kv_bytes: int) -> np.ndarray:
        return self.no_kv + np.where(self.sites.time >= self.kv_at_us, kv_bytes, 0)

    def phase_peaks(self, kv_bytes: int, others: int = 0) -> list[PhasePeak]:
        s, out = self.sites, []
        pred = self.curve(kv_bytes) + others
        for i, p in enumerate(s.trace.phases):
            path = phase_path(s.trace, i)
            if any(part in self.skipped for part in path.split("/")):
                continue  # vLLM does not run it under these flags
            end = p.end_us if p.end_us is not None else int(s.time[-1])
            peak, t = self._window_peak(pred, p.start_us, end)
            j = int(np.searchsorted(s.time, t, side="right")) - 1
            kinds = {k: (rb, int(round(rb * self.scales[k].factor))) for k in SCALED if (rb := int(s.bytes[k][j]))}
            idx = s.window_index(p.start_us, end)
            kvb = int((s.bytes[KV][idx] + s.vmm_kv[idx]).max())  # the most KV cache the phase recorded
            if kvb or t >= self.kv_at_us:
                kinds[KV] = (kvb, kv_bytes if t >= self.kv_at_us else 0)
            sites = {k: s.top_sites(k, t) for k in kinds if k != KV}
            moved = any(rec != new for rec, new in kinds.values())
            out.append(PhasePeak(path, s.rank.phases[i].peak_device_used_bytes, self._window_peak(s.held, p.start_us, end)[0],
                                 peak, t, t >= self.kv_at_us, kinds, sites,
                                 SCALED_FROM_RECORDING if moved else RECORDED))  # fmt: skip
        return out

    @cached_property
    def before_kv(self) -> np.ndarray:
        """The predicted curve before the KV cache exists: without it, but for the null block(s) that vLLM 0.34's
        extensible cache commits in kv_cache_init, held until the cache is extended (``fits.prepare`` alike)."""
        held = null_blocks(self.sites.trace)
        if not (self.flags.extensible and self.rec.extensible) or held is None:
            return self.no_kv
        return self.no_kv + np.where(self.sites.time >= held[0], held[1], 0).astype(np.int64)

    @cached_property
    def pre_kv(self) -> tuple[int, int]:
        """The predicted peak before the KV cache exists, and when."""
        first = int(self.sites.time[0])
        return self._window_peak(self.before_kv, first, min(self.kv_at_us - 1, int(self.sites.time[-1])))

    # -- the KV cache ------------------------------------------------------------------------------------
    def _moved_peak(self, name: str) -> int:
        """How much the predicted peak of phase ``name`` moved from the recorded one (0 if absent)."""
        p = self.sites._phase(name)
        if p is None:
            return 0
        end = p.end_us or int(self.sites.time[-1])
        predicted = self.no_kv
        if self._failed[1]:  # a recorded OOM's failed request counts where it was asked, not in the non-KV figure
            predicted = self.no_kv.copy()  # (``reconcile.non_kv``, which report and fits show, is the part recorded)
            predicted[self._failed[0]] -= self._failed[1]
        new, old = (self._window_peak(c, p.start_us, end)[0] for c in (predicted, self.sites.no_kv))
        return new - old

    @cached_property
    def per_block(self) -> tuple[int, int]:
        """(bytes per KV block, tokens per block) on the new flags."""
        per, tpb = kv_block(self.sites.trace.facts)
        if not per:  # a recording cut before KV sizing: vLLM's arithmetic on the model's shape
            return shape_block(self.sites.trace, self.flags, tpb)
        ratio = S.dtype_bytes(self.flags.kv_cache_dtype, unknown=2) / S.dtype_bytes(self.rec.kv_cache_dtype, unknown=2)
        return int(per * ratio), tpb or 16

    def kv_on(self, capacity: int, others: int, left_out: int) -> KvSizing | None:
        per, tpb = self.per_block
        if not per:
            return None
        one = one_request_bytes(self.flags.max_model_len, per, tpb)
        if self.flags.extensible:
            return self._kv_extensible(capacity, others, left_out, per, tpb, one)
        withheld, how = self.withheld
        available = profiled_kv_bytes(self.flags.util, capacity, withheld)
        blocks = max(available // per, 0)
        tokens, how = blocks * tpb, f"ceil({self.flags.util:g} x {capacity:,} B) - {how}"
        return KvSizing(available, blocks, tokens, blocks * per, tokens / self.flags.max_model_len, how, one)

    @cached_property
    def withheld(self) -> tuple[int, str]:
        """vLLM's non-KV figure (``reconcile.non_kv``) on the new flags, and its words (the same on every card)."""
        nk = self.sites.rank.non_kv
        moved = self._moved_peak(PN.PROFILE_RUN) or self._moved_peak(PN.DETERMINE_AVAILABLE_MEMORY)
        base = nk.bytes if nk is not None else 0
        cg = int((self.sites.trace.facts.get(F.VLLM_PROFILE) or {}).get("cudagraph_memory_estimate_bytes") or 0)
        kept = 0
        if self.flags.extensible:  # the address range's: no graph estimate (``extensible.address_range``)
            base, cg = base - cg, 0
        elif self.rec.extensible:  # vLLM measured no graph estimate: the captured graphs' memory stands for it
            cap = self.sites._phase(PN.CAPTURE_MODEL)
            if cap:
                idx = self.sites.window_index(cap.start_us, cap.end_us or _NEVER)
                b = self.sites.bytes
                j = idx[first_max(b[GRAPHS][idx] + b[GRAPHS_KEPT][idx])]
                cg, kept = int(b[GRAPHS][j]), int(b[GRAPHS_KEPT][j])
            base += cg + kept
        move = int(cg * (self.scales[GRAPHS].factor - 1.0) + kept * (self.scales[GRAPHS_KEPT].factor - 1.0))
        new = base + moved + move
        how = (
            f"non-KV {new:,} B = recorded {base:,} B ({nk.source if nk else 'none'}) + the profiling peak's move "
            f"{moved:,} B + the CUDA-graph estimate's move {move:,} B"
        )
        return new, how

    def _kv_extensible(self, capacity, others, left_out, per, tpb, one) -> KvSizing:
        f = self.sites.trace.facts
        s = f.get(F.VLLM_KV_SIZING) or {}
        requested = math.ceil(self.flags.util * capacity)
        withheld, _ = self.withheld
        s_time = int(s.get("time_us") or self.sites.time[-1])
        j = int(np.searchsorted(self.sites.time, s_time, side="right")) - 1
        moved_at_sizing = int(self.no_kv[j] - self.sites.no_kv[j])
        warm = self.sites._phase(PN.COMPILE_OR_WARM_UP)
        tr = 1.0
        if warm is not None:
            idx = self.sites.window_index(warm.start_us, s_time)
            r0, p0 = self.sites.no_kv[idx[0]], self.no_kv[idx[0]]
            rmax, pmax = self.sites.no_kv[idx].max() - r0, self.no_kv[idx].max() - p0
            tr = pmax / rmax if rmax > 0 else 1.0
        if s.get("free_memory_bytes"):  # recorded in this mode: vLLM's inputs, moved
            total = int(s.get("total_memory_bytes") or self.sites.trace.process.device_total_bytes)
            inputs = extensible_inputs(s, total - left_out - (capacity - others), moved_at_sizing, tr)
            strides = [int(x * per / max(int(s["bytes_per_block"]), 1)) for x in s.get("segment_strides") or []]
            granule = int(s.get("granularity_bytes") or 2 << 20)
            src = "vLLM's post-warm-up inputs as recorded, moved to this card and these flags"
        else:  # recorded profiled: vLLM's inputs rebuilt from the curve (an estimate)
            transient = int(((f.get(F.VLLM_PROFILE) or {}).get("peak_activation_memory_bytes") or 0) * tr)
            inputs = dict(init_free=capacity - others - own_init_used(self.sites.trace), transient_peak=transient,
                          free=capacity - others - int(self.no_kv[j]), torch_reserve_growth=transient)  # fmt: skip
            strides, granule = [per], 2 << 20
            src = "vLLM 0.34's post-warm-up formula on the predicted curve (estimate: the recording was profiled)"
        # vLLM's transient is the most allocated above what stays held, profile_run's included: a cold compile's
        # autotuning examples there (cut-gemma3-1 on the H100: 0.58 -> 1.26 GiB) are withheld too
        inputs["transient_peak"] = max(inputs["transient_peak"], self.compile_extra)
        _, range_blocks = address_range(self.flags.util, capacity, withheld, per)
        available, blocks, kv_bytes = sized(inputs, requested, strides, granule, range_blocks)
        tokens = blocks * tpb
        how = (
            f"{src}: free after warm-up {inputs['free']:,} B, transient peak {inputs['transient_peak']:,} B, reserve "
            f"growth {inputs['torch_reserve_growth']:,} B, requested ceil({self.flags.util:g} x {capacity:,} B)"
        )
        return KvSizing(available, blocks, tokens, kv_bytes, tokens / self.flags.max_model_len, how, one)

    # -- one card ----------------------------------------------------------------------------------------
    def on(self, capacity: int, *, keep_others: bool = False, others_bytes: int | None = None,
           table: bool = True) -> Outcome:  # fmt: skip
        """The answer on a card of ``capacity`` holding this process alone, or with the recording's other
        processes (``keep_others``), or with ``others_bytes`` held by other processes (``--others``); ``table``:
        False while searching cards (the verdict alone, no per-phase table)."""
        peaks = self.phase_peaks if table else lambda kv_bytes, others=0: []
        rec_others = recorded_others(self.sites.trace)
        others = others_bytes if others_bytes is not None else rec_others if keep_others else 0
        left_out = 0 if keep_others else rec_others
        room = capacity - others
        pre_peak, pre_t = self.pre_kv
        kv = self.kv_on(capacity, others, rec_others)
        common = dict(capacity_bytes=capacity, others_bytes=others, others_left_out_bytes=left_out,
                      pre_kv_peak_bytes=pre_peak, pre_kv_peak_phase=path_at(self.sites.trace, pre_t))  # fmt: skip
        out = functools.partial(Outcome, **common)
        context = init_used(self.sites.trace, self.sites.need_at)  # vLLM's snapshot, else the need at its end
        requested = math.ceil(self.flags.util * capacity)
        # vLLM checks the free memory at init_device, before it loads a byte of weights: where that refuses, the
        # start-up never gets to the pre-KV peak (the CUDA context itself must fit, or it dies there)
        refused_at_init = not self.flags.extensible and 0 < context <= room and requested > room - context
        if pre_peak > room and not refused_at_init:
            over = np.flatnonzero(self.before_kv[self.sites.time < self.kv_at_us] > room)
            t = int(self.sites.time[over[0]]) if len(over) else pre_t
            phases = peaks(0, others)
            ph = path_at(self.sites.trace, t)
            return out(verdict=DIES, phase=ph, by_bytes=pre_peak - room, why=PRE_KV_WHY, kv=kv, phases=phases)
        if refused_at_init:
            why = f"free memory at start-up ({room - context:,} B) is less than util x card ({requested:,} B)"
            by = requested - (room - context)
            return out(verdict=REFUSES, phase=PN.INIT_DEVICE, by_bytes=by, why=why, kv=kv, phases=peaks(0, others))
        if kv is None or self.sites.trace.facts.get(F.VLLM_KV_BLOCKS) is None:
            phases = peaks(0, others)
            refused = self._refused_short_of_the_kv_cache(requested)
            if refused is not None:
                phase, by, why = refused
                return out(verdict=REFUSES, phase=phase, by_bytes=by, why=why, kv=None, phases=phases)
            carried = self._carried(capacity, others, common, peaks)
            if carried is not None:
                return carried
            at = f" at its CUDA OOM in {oom.phase_path}," if (oom := self.sites.rank.oom) is not None else ""
            why = f"the recording ends{at} before the KV cache was sized"
            why += f": up to there it fits, {room - pre_peak:,} B to spare; what comes after was never recorded"
            if model_shape(self.sites.trace) is None:
                why += " (the model's shape was not recorded: --config config.json carries it on from priors)"
            return out(verdict=UNKNOWN, phase="", by_bytes=0, why=why, kv=None, phases=phases)
        phases = peaks(kv.kv_bytes, others)
        rng = address_range(self.flags.util, capacity, self.withheld[0], self.per_block[0])[0]
        if self.flags.extensible and rng < kv.one_request_bytes:  # vLLM checks the address range first
            short = kv_short(kv.one_request_bytes, rng)
            why = f"the address range vLLM may reserve ({rng:,} B) cannot hold one request of max-model-len tokens"
            return out(verdict=REFUSES, phase=PN.KV_SIZING_CHECK, by_bytes=short, why=why, kv=None, phases=phases)
        sizing = PN.path(PN.KV_CACHE_SIZING) if self.flags.extensible else PN.KV_SIZING_CHECK
        usable = kv.blocks - (1 if self.flags.extensible else 0)  # vLLM's null block holds no tokens
        if kv.available_bytes <= 0 or usable * self.per_block[1] < self.flags.max_model_len:
            short = kv_short(kv.one_request_bytes, kv.available_bytes)
            return out(verdict=REFUSES, phase=sizing, by_bytes=short, why=NO_ROOM_WHY, kv=kv, phases=phases)
        post = self.curve(kv.kv_bytes) + others
        after = self.sites.time >= self.kv_at_us
        over = np.flatnonzero(after & (post > capacity))
        if len(over):
            t = int(self.sites.time[over[0]])
            by = int(post[after].max()) - capacity
            why = f"after the KV cache ({kv.kv_bytes:,} B) was allocated"
            return out(verdict=DIES, phase=path_at(self.sites.trace, t), by_bytes=by, why=why, kv=kv, phases=phases)
        return out(verdict=BOOTS, phase="", by_bytes=0, why="", kv=kv, phases=phases)

    # -- past the recording (issue 43) -------------------------------------------------------------------
    @cached_property
    def carried(self) -> P.Carried | None:
        """The start-up carried on from the recording's profile_run with priors (None: no model shape, or the
        recording ends before profile_run began)."""
        shape = model_shape(self.sites.trace)
        s = self.sites
        p = s._phase(PN.PROFILE_RUN) or s._phase(PN.DETERMINE_AVAILABLE_MEMORY)
        if shape is None or p is None:
            return None
        library = self.library or P.load_library()
        j = max(int(np.searchsorted(s.time, p.start_us, side="right")) - 1, 0)
        context = init_used(s.trace, s.need_at)
        f = self.scales[SEQS].factor
        sampler = int(round(int(s.bytes[SEQS][j]) * f))
        start = int(self.no_kv[j]) - (int(s.bytes[SEQS][j]) - sampler)
        given = {P.CONTEXT: P.Figure(P.CONTEXT, context, P.RECORDED),
                 P.WEIGHTS: P.Figure(P.WEIGHTS, start - context - sampler, P.RECORDED),
                 P.SAMPLER: P.Figure(P.SAMPLER, sampler, P.SCALED if f != 1.0 else P.RECORDED)}  # fmt: skip
        reached = self.pre_kv[0] - start  # what profile_run reached (the failed request with it), scaled
        prior = P.Carried(shape, self.flags, library, given)
        if reached >= prior[P.ACTIVATIONS]:  # the recording already went further than the prior: it stands
            src = P.SCALED if self.scales[TOKENS].factor != 1.0 else P.RECORDED
            given[P.ACTIVATIONS] = P.Figure(P.ACTIVATIONS, reached, src)
            return P.Carried(shape, self.flags, library, given)
        return prior

    def _carried(self, capacity: int, others: int, common: dict, peaks) -> Outcome | None:
        """The answer on ``capacity`` with the start-up carried past the recording's end (None where it cannot be;
        ``peaks``: the recorded phases' table, or none while searching)."""
        c = self.carried
        per, tpb = self.per_block
        if c is None or P.WEIGHTS in c.missing or not per:
            return None
        dtype = (self.sites.trace.facts.get(F.VLLM_CONFIG) or {}).get("dtype")
        m = kv_shape(model_shape(self.sites.trace), self.flags, tpb, dtype)
        try:
            return carried_outcome(c, capacity, others, m, peaks(0, others), int(self.sites.time[-1]), common)
        except ValueError as e:  # the recorded shape lacks what vLLM's KV arithmetic needs: it stays unknown
            self.notes.append(f"not carried past the recording: {e}")
            return None

    def _refused_short_of_the_kv_cache(self, requested: int) -> tuple[str, int, str] | None:
        """Where the recording ends before vLLM sized the KV cache: (phase, short, why) when vLLM's own sizing
        refuses already (what it keeps out of the KV cache, vLLM's formula on the part recorded, is at least
        ``requested``: the profiling peak only grows past the end of the recording), else None."""
        nk = self.sites.rank.non_kv
        if nk is None or nk.source != NON_KV_MEMTRACE:
            return None
        withheld, how = self.withheld
        if withheld < requested:
            return None
        phase = PN.KV_SIZING_CHECK  # the profiled cache's and the extensible address range's check
        why = (
            f"vLLM keeps at least {withheld:,} B out of the KV cache ({how}), not less than ceil({self.flags.util:g} x "
            f'card) = {requested:,} B ("No available memory for the cache blocks"); the recording ends before the '
            "KV cache was sized, and what it did not reach only adds to that figure"
        )
        per, tpb = self.per_block
        one = one_request_bytes(self.flags.max_model_len, per, tpb) if per else None
        return phase, kv_short(one, requested - withheld), why


def carried_outcome(c: P.Carried, capacity: int, others: int, kv: object, recorded: list[PhasePeak] = (),
                    t_end: int = 0, common: dict | None = None) -> Outcome:  # fmt: skip
    """The answer on ``capacity`` (``others`` held by other processes) of a start-up put together from components
    (``c``): past a recording's end (``recorded``: its phases as predicted, up to ``t_end``), or with nothing recorded.
    ``kv``: the model's shape with the KV cache's flags (:func:`kv_shape`): vLLM's blocks, tokens, one request."""
    flags, room = c.flags, capacity - others
    plan = S.kv_plan(kv)
    per, tpb, per_request = plan.bytes_per_block, plan.block_size, plan.blocks_per_request
    names = {x.phase for x in recorded}
    phases = list(recorded) + [PhasePeak(name, None, 0, b + others, t_end, False, {}, {}, src)
                               for name, b, src in c.phase_peaks() if name not in names]  # fmt: skip
    priors = [f for f in c.figures.values() if f.source == P.PRIOR and f.bytes]
    words = ", ".join(f"{f.component} {f.bytes:,} B " + (f"±{f.spread_bytes:,}" if f.spread_bytes is not None else
                      "(one architecture: spread not measured)") for f in priors)  # fmt: skip
    spreads = [f.spread_bytes for f in priors if f.component in c.sizing_components]
    spread = None if None in spreads or c.missing else sum(spreads)  # the KV cache's
    if c.missing:
        words += f"; no prior for {', '.join(c.missing)} (no start-up of this kind in the library): counted 0 B"
    pre_phase, pre_peak = c.pre_kv
    common = {**(common or dict(capacity_bytes=capacity, others_bytes=others, others_left_out_bytes=0)),
              "pre_kv_peak_phase": pre_phase, "pre_kv_peak_bytes": pre_peak, "spread_bytes": spread,
              "carried": f"from priors (vLLM {c.library.vllm}): {words}" if priors else ""}  # fmt: skip
    out = functools.partial(Outcome, **common, phases=phases)
    if pre_peak > room:
        phase = next((name for name, b, _ in c.phase_peaks() if b > room), PN.PROFILE_RUN)
        return out(verdict=DIES, phase=PN.path(phase), by_bytes=pre_peak - room, why=PRE_KV_WHY, kv=None)
    k = c.kv(capacity, others, per, tpb)
    blocks, tokens = S.kv_cache_for_bytes(kv, k.available_bytes)
    one = S.kv_bytes_for_tokens(kv, flags.max_model_len)
    kv = KvSizing(k.available_bytes, blocks, tokens, blocks * per, tokens / flags.max_model_len, k.how, one)
    usable = kv.blocks - (1 if flags.extensible else 0)  # vLLM's null block holds no tokens
    if kv.available_bytes <= 0 or usable < per_request:
        sizing = PN.path(PN.KV_CACHE_SIZING) if flags.extensible else PN.KV_SIZING_CHECK
        by = kv_short(one, kv.available_bytes)
        return out(verdict=REFUSES, phase=sizing, by_bytes=by, why=NO_ROOM_WHY, kv=kv)
    post = (c.after_warmup if flags.extensible else c.warmup_peak + c[P.GRAPH_POOL]) + kv.kv_bytes
    if post > room:
        why = f"after the KV cache ({kv.kv_bytes:,} B) was allocated"
        return out(verdict=DIES, phase=PN.COMPILE_OR_WARM_UP, by_bytes=post - room, why=why, kv=kv)
    return out(verdict=BOOTS, phase="", by_bytes=0, why="", kv=kv)


def skipped_phases(rec: Flags, new: Flags) -> tuple[str, ...]:
    """The phases of a start-up recorded with ``rec`` that vLLM 0.34 does not run with ``new``
    (``gpu_worker.compile_or_warm_up_model``): the KV-sizing warm-up, the sizing and the extension run only with
    the extensible KV cache; ``warmup_kernels`` with it or with JIT warm-up, which enforce-eager turns off."""
    if not rec.extensible or new.extensible:
        return ()
    out = (PN.KV_CACHE_SIZING_WARMUP, PN.KV_CACHE_SIZING, PN.KV_CACHE_EXTEND)
    return (*out, PN.WARMUP_KERNELS) if new.enforce_eager else out


def own_init_used(trace) -> int:
    """What this process used at vLLM's init snapshot (its CUDA context...): the card's used memory then, less
    what other processes held on the recorded card (0 when vLLM's snapshot was not recorded)."""
    init = (trace.facts.get(F.VLLM_PROFILE) or {}).get("init_snapshot") or {}
    used = int(init.get("total_memory", 0)) - int(init.get("free_memory", 0))
    return max(used - recorded_others(trace), 0) if used > 0 else 0


def init_used(trace, need_at: Callable[[int], int]) -> int:
    """What this process used at init_device, the one rule of both models of booting: vLLM's own snapshot
    (:func:`own_init_used`), else (not recorded: a recording cut before profiling) the start-up's need when init_device
    ended (its CUDA context), read by ``need_at(time_us)``; 0 without either."""
    used = own_init_used(trace)
    end = init_device_end(trace)
    return used if used or end is None else int(need_at(end))


def init_device_end(trace) -> int | None:
    """When vLLM's init_device ended (None: not recorded)."""
    return min((p.end_us for p in trace.phases if p.name == PN.INIT_DEVICE and p.end_us is not None), default=None)


def recorded_others(trace) -> int:
    """The most memory other processes held on the recorded card (NVML's per-process list; 0 unsampled)."""
    o = trace.others
    return int(o["others_bytes"].max()) if len(o) else 0


def sites_of(rank) -> Sites:
    """The analysed rank's start-up taken apart by site (needs a vLLM trace with its config)."""
    rank = rank.boot_rank  # start-up alone: a serving window joined to it (``serving.joined``) is not start-up's
    if recorded_flags(rank.trace) is None:
        raise UsageError(f"{rank.label}: --what-if / --suggest need a vLLM start-up (its config was not recorded)")
    return Sites(rank, need_curve(rank.trace, rank.curves, rank.landmarks, None, rank.lifetimes))


def calibrate(all_sites: list[Sites]) -> Calibration | None:
    """Fit each (phase name, kind)'s peak bytes to ``a + b x`` of its flag over traces of one model (None with one)."""
    if len(all_sites) < 2:
        return None
    points: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for s in all_sites:
        names = _phase_names(s)
        for ph in set(names.tolist()):
            m = names == ph
            for k in SCALED:
                points.setdefault((ph, k), []).append((flag_value(s.flags, k), float(s.bytes[k][m].max())))
    lines = {}
    for key, pts in points.items():
        x, y = (np.array(v) for v in zip(*pts, strict=True))
        if len(set(x.tolist())) < 2:
            continue
        b, a = np.polyfit(x, y, 1)
        res = int(round(float(np.sqrt(np.mean((a + b * x - y) ** 2)))))
        lines[key] = Line(float(a), float(b), res, len(pts))
    return Calibration(lines, len(all_sites))


# ---------------------------------------------------------------------------------------------------------
# Which flags would boot


@dataclass(frozen=True)
class Suggestion:
    """One set of changes to the recorded flags, and what it gives on the card."""

    changes: list[str]
    flags: Flags
    outcome: Outcome


def search(base: Flags, singles: list[dict], most: int, answer, ok: tuple[str, ...]) -> tuple[list[Suggestion], int]:
    """The sets of ``singles`` (one change, else two at once, ... up to ``most``) applied to ``base`` whose
    ``answer(flags)`` has a verdict in ``ok``, from the fewest changes that have any; and how many sets were tried."""
    sets, found, tried = [(i,) for i in range(len(singles))], [], 0
    for _size in range(most):
        for parts in sets:
            f = dataclasses.replace(base, **{k: v for i in parts for k, v in singles[i].items()})
            o = answer(f)
            tried += 1
            if o.verdict in ok:
                found.append(Suggestion(f.changes(base), f, o))
        if found:
            break
        sets = [(*p, j) for p in sets for j in range(p[-1] + 1, len(singles))
                if not any(set(singles[j]) & set(singles[i]) for i in p)]  # fmt: skip
    return found, tried


@dataclass(frozen=True)
class Suggestions:
    """What ``--suggest`` answers on one card: the changes that boot (fewest first, then the most KV cache),
    or the floor no flag goes under."""

    capacity_bytes: int
    recorded: Outcome
    booting: list[Suggestion]
    floor_bytes: int  # the predicted pre-KV peak with the most frugal flags tried + one request's KV cache
    floor_flags: list[str]
    tried: int
    floor_outcome: Outcome | None = None  # the most frugal flags on this card (why nothing boots when the floor fits)


def candidates(rec: Flags, extensible_known: bool, shared_util: float | None = None) -> list[dict]:
    """Single changes worth trying, each a dict of Flags fields. ``shared_util``: on a card other processes
    share, the largest utilization vLLM's start-up check lets through there, tried (and 4 steps of 0.002 and 4 of
    0.01 below it: room for the warm-up after the KV cache, which vLLM's profiled sizing can leave too little of)
    with the profiled KV cache: the extensible one keeps a post-warm-up margin no flag makes room for on a nearly
    full card."""
    out: list[dict] = []
    out += [{"max_num_batched_tokens": v} for v in (1024, 2048, 4096, 8192) if v < rec.max_num_batched_tokens]
    out += [{"max_num_seqs": v} for v in (1, 2, 4, 8, 16, 32, 64, 128) if v < rec.max_num_seqs]
    if not rec.enforce_eager:
        out.append({"enforce_eager": True})
    out += [{"max_model_len": rec.max_model_len // d} for d in (2, 4, 8, 16) if rec.max_model_len // d >= 1024]
    if S.dtype_bytes(rec.kv_cache_dtype, unknown=2) > 1:
        out.append({"kv_cache_dtype": "fp8"})
    out += [{"gpu_memory_utilization": u} for u in (0.8, 0.85, 0.9, 0.95, 0.98) if u != rec.util]
    if extensible_known:
        out.append({"extensible": not rec.extensible})
    if shared_util is not None and shared_util < rec.util:  # the largest, and below it room for the warm-up
        profiled = {"extensible": False} if extensible_known else {}
        for u in sorted({round(shared_util - d * k, 4) for k in range(5) for d in (0.002, 0.01)}, reverse=True):
            if u > 0:
                out.append({"gpu_memory_utilization": u, **profiled})
    return out


def shared_utilization(sites: Sites, capacity: int, others: int) -> float | None:
    """The largest utilization (4 decimals, rounded down) whose request fits what is free at vLLM's start-up
    on a card where other processes hold ``others`` bytes (None: the card is not shared, or unknown)."""
    used = init_used(sites.trace, sites.need_at)
    if others <= 0 or not used or capacity <= 0:
        return None
    u = math.floor((capacity - others - used) / capacity * 10_000) / 10_000
    return u if u > 0 else None


def suggest(sites: Sites, capacity: int, *, keep_others: bool = False, others_bytes: int | None = None,
            cal: Calibration | None = None, top: int = 8, base: Flags | None = None,
            recorded: Outcome | None = None, library: P.Library | None = None) -> Suggestions:  # fmt: skip
    """The changes (one, else two at once, else three, else four) to ``base`` (default: the recorded flags) that boot on ``capacity``
    (``recorded``: ``base``'s outcome there, when already answered)."""
    rec = base or sites.flags
    ext_known = knows_extensible(sites.trace)
    card = dict(keep_others=keep_others, others_bytes=others_bytes)
    others = others_bytes if others_bytes is not None else recorded_others(sites.trace) if keep_others else 0
    singles = candidates(rec, ext_known, shared_utilization(sites, capacity, others))
    recorded_outcome = recorded or WhatIf(sites, rec, cal, library).on(capacity, **card, table=False)
    # UNKNOWN: gets past all the recording covers
    ok = (BOOTS, UNKNOWN) if recorded_outcome.verdict != BOOTS else (BOOTS,)
    booting, tried = search(
        rec, singles, 4, lambda f: WhatIf(sites, f, cal, library).on(capacity, **card, table=False), ok
    )
    booting.sort(
        key=lambda s: (len(s.changes), s.outcome.verdict != BOOTS, not clear_of_spread(s.outcome),
                       -(s.outcome.kv.tokens if s.outcome.kv else 0), s.outcome.pre_kv_peak_bytes)
    )  # fmt: skip
    frugal = _frugal(rec, singles)
    w = WhatIf(sites, frugal, cal, library)
    per, tpb = w.per_block
    one = one_request_bytes(frugal.max_model_len, per, tpb) if per else 0
    return Suggestions(capacity, recorded_outcome, booting[:top], w.pre_kv[0] + one, frugal.changes(rec), tried,
                       w.on(capacity, **card, table=False))  # fmt: skip


def clear_of_spread(o: Outcome) -> bool:
    """It boots with more KV cache than one request needs by more than the priors' spread (``Outcome.spread_bytes``;
    0 where nothing came from a prior): it boots even where every prior errs the wrong way."""
    return (
        o.kv is not None
        and o.spread_bytes is not None
        and o.kv.available_bytes - o.kv.one_request_bytes > o.spread_bytes
    )


def _frugal(rec: Flags, singles: list[dict]) -> Flags:
    """The most frugal flags tried: the fewest batched tokens and sequences, no CUDA graphs, the shortest
    max-model-len and the smallest KV dtype among the changes tried (``rec``'s own where none is smaller)."""
    lens = [rec.max_model_len, *(c["max_model_len"] for c in singles if "max_model_len" in c)]
    dtypes = [rec.kv_cache_dtype, *(c["kv_cache_dtype"] for c in singles if "kv_cache_dtype" in c)]
    return dataclasses.replace(rec, max_num_batched_tokens=min(256, rec.max_num_batched_tokens), max_num_seqs=1,
                               enforce_eager=True, max_model_len=min(lens),
                               kv_cache_dtype=min(dtypes, key=lambda d: S.dtype_bytes(d, unknown=2)))  # fmt: skip


@dataclass(frozen=True)
class Answer:
    """``memtrace fits --what-if / --suggest`` for one rank: every figure the outputs show."""

    recorded: Flags
    flags: Flags
    changes: list[str]
    scales: dict[str, Scale]
    calibrated_traces: int  # 0: one trace, the documented rules (an estimate)
    fitted_lines: int  # (phase, kind) pairs fitted over the traces (the rest: the one-trace rules)
    notes: list[str]
    outcomes: list[Outcome]
    suggestions: list[Suggestions]
    keep_others: bool
    vllm_version: str
