"""Priors: what a vLLM start-up needs where nothing was recorded, from the model's shape and flags (issue 43).

A start-up is a few **components**, each a number of bytes (:data:`COMPONENTS`): the CUDA context, the weights,
the dummy forward pass's activations and workspaces, the sampler's logits, what the profiling leaves held, the
warm-up's transient, the CUDA graphs' pool, and vLLM 0.34's own sizing inputs (its transient peak and the
allocator's reserve growth), a cold compile's autotuning example. Each component is the product of a **feature**
of the model and flags (e.g. max-num-batched-tokens x :func:`act_width` x 2 B) and a coefficient: the median over a
library of real start-ups of several architectures, with its spread (the largest leave-one-architecture-out
relative error). The shipped library (``priors-vllm-0.34.json``) is refitted by ``tests/bench/fit_priors.py``.

:class:`Carried` puts a start-up together from components, each a :class:`Figure` that says where it comes from
(recorded, scaled from the recording, or the prior with its spread), and sizes the KV cache with vLLM's own
formulas (:mod:`.extensible`, :mod:`.reconcile`). Pure functions; bytes.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from memtrace import facts as F
from memtrace import vllm_phase_names as PN
from memtrace.analysis.capacity.extensible import measure_kv_cache_bytes
from memtrace.analysis.capacity.reconcile import profiled_kv_bytes
from memtrace.analysis.capacity.shape import ModelShape, lm_head_example_bytes
from memtrace.errors import UsageError

RECORDED, SCALED, PRIOR = "recorded", "scaled", "prior"
#: the format of a priors file (:func:`load_library` reads it)
FORMAT = 1
LIBRARY_FILE = Path(__file__).with_name("priors-vllm-0.34.json")

CONTEXT, WEIGHTS = "context", "weights"
ACTIVATIONS, SAMPLER, KEPT, WARMUP, GRAPH_POOL = "activations", "sampler", "kept", "warmup", "graph_pool"
SAMPLER_RUN, COMPILE = "sampler_run", "compile"
TRANSIENT, RESERVE_GROWTH, SLACK = "transient", "reserve_growth", "sizing_slack"
PROFILED_SLACK = "profiled_slack"
#: component -> what it is, and its feature in words
COMPONENTS = {
    CONTEXT: ("this process's memory at vLLM's init snapshot (CUDA context, cuBLAS)", "1 (a constant of the card)"),
    WEIGHTS: ("the weights and what load_model leaves held", "the weights' bytes"),
    ACTIVATIONS: ("profile_run's activations and workspaces above the weights", "batched tokens x act_width x 2 B"),
    SAMPLER: ("the sampler's buffers, made while loading (penalties)", "max-num-seqs x vocabulary x 4 B"),
    SAMPLER_RUN: ("profile_run's dummy sampler run: logits, probabilities, sorting", "max-num-seqs x vocabulary x 4 B"),
    COMPILE: ("a cold torch.compile's autotuning example of the LM head in profile_run (Inductor's select_algorithm)",
              "padded vocabulary x hidden x 2 B where vLLM compiles the model (0 with enforce-eager)"),
    KEPT: ("what profiling leaves held (MoE workspaces)", "batched tokens x experts-per-token x hidden x 2 B"),
    WARMUP: ("the warm-up's transient above what is kept", "batched tokens x act_width x 2 B"),
    GRAPH_POOL: ("the CUDA graphs' memory pool (0 with enforce-eager)", "1 (a constant) with CUDA graphs"),
    TRANSIENT: ("vLLM 0.34's transient peak, withheld from the KV cache",
                "max(activations - kept, warm-up, sampler run, compile)"),
    RESERVE_GROWTH: ("the allocator's reserve growth over warm-up, withheld too",
                     "max(activations, kept + warm-up, compile)"),
    SLACK: ("vLLM 0.34's non-KV figure less what the start-up needs after warm-up", "1 (a constant)"),
    PROFILED_SLACK: ("vLLM's profiled non-KV figure less profile_run's peak (graph estimate, non-PyTorch growth)",
                     "1 (a constant)"),
}  # fmt: skip
#: components fitted per feature (the rest: recorded or computed, never a prior)
FITTED = (*(k for k in COMPONENTS if k not in (CONTEXT, WEIGHTS, TRANSIENT, RESERVE_GROWTH)), CONTEXT, TRANSIENT,
          RESERVE_GROWTH)  # fmt: skip


def model_shape(shape) -> ModelShape:
    """``shape`` as a :class:`.shape.ModelShape` (a dict: Hugging Face names, the trace's ``vllm.model_shape``)."""
    return shape if isinstance(shape, ModelShape) else ModelShape.from_facts({F.VLLM_MODEL_SHAPE: shape})


def act_width(m: ModelShape) -> int:
    """One token's activations at profile_run's peak, in elements: the residual stream and its neighbours (4 x
    hidden) and the MLP's intermediates — gate and up, and the activation's output, for a dense MLP (3 x
    intermediate); for a MoE, each routed copy's (experts-per-token x (3 x the expert's intermediate + hidden):
    fused_moe's three caches) and the shared expert's."""
    hidden = m.hidden or 0
    if m.experts_per_tok:
        moe = m.moe_intermediate or m.intermediate or 0
        return 4 * hidden + m.experts_per_tok * (3 * moe + hidden) + 3 * m.shared_expert_intermediate
    return 4 * hidden + 3 * (m.intermediate or 0)


def features(shape, flags, values: dict[str, int] | None = None) -> dict[str, float]:
    """Each fitted component's feature for ``shape`` under ``flags`` (a ``whatif.Flags``). vLLM's transient and
    reserve growth are features of other components (``values``: their bytes, recorded or predicted)."""
    m = model_shape(shape)
    tokens = float(flags.max_num_batched_tokens)
    per_token = tokens * act_width(m) * 2
    seqs = float(flags.max_num_seqs) * (m.vocab or 0) * 4
    out = {ACTIVATIONS: per_token, WARMUP: per_token, KEPT: tokens * m.experts_per_tok * (m.hidden or 0) * 2,
           SAMPLER: seqs, SAMPLER_RUN: seqs, GRAPH_POOL: 0.0 if flags.enforce_eager else 1.0,
           COMPILE: 0.0 if flags.enforce_eager or not m.torch_compiled else float(lm_head_example_bytes(m))}  # fmt: skip
    out[SLACK] = out[PROFILED_SLACK] = out[CONTEXT] = 1.0
    if values is not None:
        a, k, w = (values.get(x, 0) for x in (ACTIVATIONS, KEPT, WARMUP))
        c = values.get(COMPILE, 0)
        out[TRANSIENT] = float(max(a - k, w, values.get(SAMPLER_RUN, 0), c))  # vLLM's: above what stays held
        out[RESERVE_GROWTH] = float(max(a, k + w, c))
    return out


#: the denominator's floor of a prior's relative error: a component smaller than this is judged on this size
SPREAD_FLOOR = 64 << 20


@dataclass(frozen=True)
class Observed:
    """One recorded whole start-up's components (bytes) and features."""

    label: str
    architecture: str
    values: dict[str, int]
    features: dict[str, float]


@dataclass(frozen=True)
class Prior:
    """One component's coefficient (bytes per unit of its feature) over the library, and its spread."""

    component: str
    coefficient: float
    #: the largest relative error of the leave-one-architecture-out coefficient on a start-up; None where the
    #: library holds one architecture (nothing to leave out: the spread is not measured)
    spread: float | None
    starts: int
    architectures: list[str]

    def bytes_for(self, feature: float) -> int:
        return int(round(self.coefficient * feature))


@dataclass(frozen=True)
class Library:
    """The priors of one vLLM release, and the start-ups they were fitted on."""

    vllm: str
    priors: dict[str, Prior]
    observed: list[Observed] = field(default_factory=list)

    @property
    def architectures(self) -> list[str]:
        return sorted({o.architecture for o in self.observed})


@functools.lru_cache(maxsize=4)
def load_library(path: Path | str | None = None) -> Library:
    """The shipped priors (or ``path``'s), read once per process and path (every what-if of ``--suggest`` asks)."""
    p = Path(path) if path is not None else LIBRARY_FILE
    try:
        text = p.read_text()
    except OSError as e:
        raise UsageError(f"cannot read the priors {p}: {e.strerror}") from None
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise UsageError(f"{p}: not a priors file ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise UsageError(f"{p}: priors format {doc.get('format') if isinstance(doc, dict) else '?'}, "
                         f"this memtrace reads {FORMAT}: refit with tests/bench/fit_priors.py")  # fmt: skip
    priors = {k: Prior(**x) for k, x in doc["priors"].items()}
    return Library(doc["vllm"], priors, [Observed(**o) for o in doc.get("observed", [])])


def _spread_bytes(b: int, p: Prior) -> int | None:
    return int(math.ceil(max(abs(b), SPREAD_FLOOR) * p.spread)) if p.spread is not None else None


@dataclass(frozen=True)
class Figure:
    """One component's bytes on a start-up, and where they come from (RECORDED, SCALED, PRIOR with its spread)."""

    component: str
    bytes: int
    source: str
    spread_bytes: int | None = 0  # None: a prior of one architecture (its spread not measured)


@dataclass(frozen=True)
class CarriedKv:
    """vLLM's KV cache sized on the carried start-up."""

    available_bytes: int
    blocks: int
    tokens: int
    kv_bytes: int
    how: str


class Carried:
    """A start-up put together from components: those given (recorded or scaled), the rest from ``library``."""

    def __init__(self, shape, flags, library: Library, given: dict[str, Figure]):
        self.shape, self.flags, self.library = shape, flags, library
        self.figures: dict[str, Figure] = dict(given)
        self.missing: list[str] = []
        feats = features(shape, flags)
        for k in FITTED:  # vLLM's transient and reserve growth last: features of the others
            if k == TRANSIENT:
                feats = features(shape, flags, {x: f.bytes for x, f in self.figures.items()})
            p = library.priors.get(k)
            if k not in self.figures and p is None and k not in (TRANSIENT, RESERVE_GROWTH):
                self.missing.append(k)
            if k in self.figures or p is None:
                continue
            b = max(p.bytes_for(feats[k]), 0) if k not in (SLACK, PROFILED_SLACK) else p.bytes_for(feats[k])
            self.figures[k] = Figure(k, b, PRIOR, _spread_bytes(b, p))
        if WEIGHTS not in self.figures:
            self.missing.append(WEIGHTS)

    def __getitem__(self, k: str) -> int:
        f = self.figures.get(k)
        return f.bytes if f is not None else 0

    # -- the phases: what the start-up needs (no KV cache), in vLLM 0.34's order
    @property
    def base(self) -> int:
        """After load_model: the context, the weights and the sampler's buffers (made while loading)."""
        return self[CONTEXT] + self[WEIGHTS] + self[SAMPLER]

    @property
    def profile_peak(self) -> int:
        """The forward pass's activations, or the sampler's run beside what the forward leaves held, the larger."""
        return self.base + max(self[ACTIVATIONS], self[KEPT] + self[SAMPLER_RUN], self[COMPILE])

    @property
    def after_profile(self) -> int:
        return self.base + self[KEPT]

    @property
    def warmup_peak(self) -> int:
        return self.after_profile + self[WARMUP]

    @property
    def after_warmup(self) -> int:
        """What stays held once warm-up and capture are done (the KV cache apart)."""
        return self.after_profile + self[GRAPH_POOL]

    def phase_peaks(self) -> list[tuple[str, int, str]]:
        """(phase, needed bytes without the KV cache, where its figure comes from), in vLLM's order."""
        src = {k: f.source for k, f in self.figures.items()}

        def worst(*ks: str) -> str:
            order = (PRIOR, SCALED, RECORDED)
            return next((s for s in order if any(src.get(k) == s for k in ks)), RECORDED)

        profile = f"{PN.DETERMINE_AVAILABLE_MEMORY}/{PN.PROFILE_RUN}"
        return [
            (PN.LOAD_MODEL, self.base, worst(CONTEXT, WEIGHTS, SAMPLER)),
            (profile, self.profile_peak, worst(ACTIVATIONS, KEPT, SAMPLER_RUN, COMPILE)),
            (PN.COMPILE_OR_WARM_UP, self.warmup_peak, worst(KEPT, WARMUP)),
            (f"{PN.COMPILE_OR_WARM_UP}/{PN.CAPTURE_MODEL}", self.after_warmup, worst(GRAPH_POOL)),
        ]

    @property
    def pre_kv(self) -> tuple[str, int]:
        """(phase, bytes): the most needed before the KV cache exists (with the extensible cache: everything before
        its extension), the first phase that needs it."""
        return max((p[:2] for p in self.phase_peaks()[: 4 if self.flags.extensible else 2]), key=lambda p: p[1])

    @property
    def sizing_components(self) -> tuple[str, ...]:
        """The components vLLM's KV sizing reads in this mode (their priors' spreads are the KV cache's)."""
        if self.flags.extensible:
            return (CONTEXT, WEIGHTS, SAMPLER, KEPT, GRAPH_POOL, SLACK, TRANSIENT, RESERVE_GROWTH)
        return (WEIGHTS, SAMPLER, ACTIVATIONS, KEPT, SAMPLER_RUN, COMPILE, PROFILED_SLACK)

    def kv(self, capacity: int, others: int, per_block: int, tokens_per_block: int) -> CarriedKv:
        """vLLM's KV cache on ``capacity`` (``others`` held by other processes): 0.34's post-warm-up formula with
        the extensible cache, else the profiled one (``ceil(util x card) - non-KV``)."""
        requested = math.ceil(self.flags.util * capacity)
        if self.flags.extensible:
            init_free = capacity - others - self[CONTEXT]
            non_kv_used = self.after_warmup - self[CONTEXT] + self[SLACK]
            free = init_free - non_kv_used
            available, *_ = measure_kv_cache_bytes(init_free=init_free, free=free, requested=requested,
                transient_peak=self[TRANSIENT], torch_reserve_growth=self[RESERVE_GROWTH])  # fmt: skip
            how = (f"vLLM 0.34's post-warm-up formula: free after warm-up {free:,} B, transient peak "
                   f"{self[TRANSIENT]:,} B, reserve growth {self[RESERVE_GROWTH]:,} B, requested ceil("
                   f"{self.flags.util:g} x {capacity:,} B)")  # fmt: skip
        else:
            non_kv = self.profile_peak + self[PROFILED_SLACK]
            available = profiled_kv_bytes(self.flags.util, capacity, non_kv)
            how = f"ceil({self.flags.util:g} x {capacity:,} B) - non-KV {non_kv:,} B"
        blocks = max(available // per_block, 0) if per_block else 0
        return CarriedKv(available, blocks, blocks * tokens_per_block, blocks * per_block, how)
