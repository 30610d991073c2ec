"""A recorded whole vLLM start-up taken apart into the components of :mod:`.priors` (issue 43): what the library
of priors is fitted on (``tests/bench/fit_priors.py``), and what a recording gives a carried start-up (its
context, weights and what its cut profile_run already reached)."""

from __future__ import annotations

import numpy as np
from memtrace import facts as F
from memtrace import vllm_phase_names as PN
from memtrace.analysis.capacity import priors as P
from memtrace.analysis.capacity.whatif import COMPILE, GRAPHS_KEPT, SEQS, Sites, own_init_used


def _at(s: Sites, t_us: int) -> int:
    """The index of the last sample at or before ``t_us``."""
    return max(int(np.searchsorted(s.time, t_us, side="right")) - 1, 0)


def _window(s: Sites, name: str) -> np.ndarray | None:
    p = s._phase(name)
    if p is None:
        return None
    return s.window_index(p.start_us, p.end_us if p.end_us is not None else int(s.time[-1]))


def _profile_run(s: Sites) -> np.ndarray | None:
    return _window(s, PN.PROFILE_RUN) if s._phase(PN.PROFILE_RUN) else _window(s, PN.DETERMINE_AVAILABLE_MEMORY)


def recorded_base(s: Sites, curve: np.ndarray | None = None) -> tuple[int, int] | None:
    """(context, weights) of a recording that reached profile_run: its init snapshot, and what the start-up
    needed when profile_run began less that (``curve``: the what-if's curve for other flags, else the recording)."""
    idx = _profile_run(s)
    if idx is None:
        return None
    context = own_init_used(s.trace)
    c = s.no_kv if curve is None else curve
    return context, int(c[idx[0]]) - context


def observe(s: Sites, shape, architecture: str, label: str) -> P.Observed:
    """The components of one whole recorded start-up (it must have reached vLLM's KV sizing)."""
    base = recorded_base(s)
    if base is None:
        raise ValueError(f"{label}: no profile_run recorded")
    context, weights = base
    w = context + weights
    prof = _profile_run(s)
    sampler = int(s.bytes[SEQS][prof[0]])  # the sampler's buffers, made while loading (penalties.py)
    run = s.bytes[SEQS][prof] - sampler  # the dummy sampler run's logits and probabilities
    compile_ = s.bytes[COMPILE][prof]  # a cold compile's autotuning examples
    forward = s.no_kv[prof] - w - run - compile_
    values = {P.CONTEXT: context, P.WEIGHTS: weights - sampler, P.SAMPLER: sampler,
              P.ACTIVATIONS: int(forward.max()), P.SAMPLER_RUN: max(int(run.max()), 0),
              P.COMPILE: int(compile_.max())}  # fmt: skip
    warm = _window(s, PN.COMPILE_OR_WARM_UP)
    if warm is not None:
        start = int(s.no_kv[warm[0]])
        values[P.KEPT] = max(start - w, 0)
        values[P.WARMUP] = max(int(s.no_kv[warm].max()) - start, 0)
        values[P.GRAPH_POOL] = int(s.bytes[GRAPHS_KEPT][warm].max())
    f = s.trace.facts
    sizing = f.get(F.VLLM_KV_SIZING) or {}
    if sizing.get("free_memory_bytes"):
        used = int(sizing["init_free_memory_bytes"]) - int(sizing["free_memory_bytes"]) - int(sizing["committed_bytes"])
        at = int(s.no_kv[_at(s, int(sizing.get("time_us") or s.time[-1]))])
        values[P.SLACK] = used - (at - context)
        values[P.TRANSIENT] = int(sizing["transient_peak_bytes"])
        values[P.RESERVE_GROWTH] = int(sizing["torch_reserve_growth_bytes"])
    elif f.get(F.VLLM_AVAILABLE_KV_BYTES) and f.get(F.TARGET_BYTES):
        non_kv = int(f[F.TARGET_BYTES]) - int(f[F.VLLM_AVAILABLE_KV_BYTES])
        values[P.PROFILED_SLACK] = non_kv - int(s.no_kv[prof].max())
    feats = P.features(shape, s.flags, values)
    return P.Observed(label, architecture, values, {k: feats[k] for k in values if k in feats})
