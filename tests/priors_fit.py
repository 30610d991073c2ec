"""Fitting the library of priors (issue 43; ``tests/bench/fit_priors.py``): a recorded whole vLLM start-up taken
apart into the components of ``analysis.capacity.priors`` (:func:`observe`), each component's median coefficient
over the start-ups and its leave-one-architecture-out spread (:func:`fit`), the library written back
(:func:`to_json`)."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict
from pathlib import Path

import numpy as np
from memtrace import facts as F
from memtrace import vllm_phase_names as PN
from memtrace.analysis.analysed.run import analyse
from memtrace.analysis.capacity import priors as P
from memtrace.analysis.capacity.shape import ModelShape
from memtrace.analysis.capacity.whatif import COMPILE, GRAPHS_KEPT, SEQS, Sites, own_init_used, sites_of
from memtrace.store import load_run


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
              P.ACTIVATIONS: int(forward.max()), P.SAMPLER_RUN: max(int(run.max()), 0)}  # fmt: skip
    if compile_.max() > 0:  # a cold compile's example; a warm compile (the cache hit) says nothing of its size
        values[P.COMPILE] = int(compile_.max())
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


def observe_folder(folder: Path, architecture: str, config: Path) -> P.Observed:
    """:func:`observe` of the run in ``folder``; ``config`` (a config.json) gives the model's shape where the
    recording lacks it, as ``fits --config`` does (older recordings did not record it)."""
    traces = load_run(str(folder)).traces
    for t in traces:
        if not isinstance(t.facts.get(F.VLLM_MODEL_SHAPE), dict):
            t.facts[F.VLLM_MODEL_SHAPE] = json.loads(Path(config).read_text())
    rank = analyse(traces, path=str(folder)).worst
    shape = ModelShape.from_facts(rank.trace.facts)  # with vllm.config's compile mode
    return observe(sites_of(rank), shape, architecture, folder.name)


def _coefficient(obs: list[P.Observed], k: str) -> float | None:
    ratios = [o.values[k] / o.features[k] for o in obs if k in o.values and o.features.get(k)]
    return float(statistics.median(ratios)) if ratios else None


def fit(observed: list[P.Observed], vllm: str) -> P.Library:
    """Each component's median coefficient over ``observed`` and its leave-one-architecture-out spread (None where
    no start-up's error could be measured without its architecture: one architecture has the component)."""
    priors = {}
    for k in P.FITTED:
        c = _coefficient(observed, k)
        if c is None:
            continue
        errors = []
        for o in observed:
            if k not in o.values or not o.features.get(k):
                continue
            c_out = _coefficient([x for x in observed if x.architecture != o.architecture], k)
            if c_out is not None:
                errors.append(abs(c_out * o.features[k] - o.values[k]) / max(abs(o.values[k]), P.SPREAD_FLOOR))
        archs = sorted({o.architecture for o in observed if k in o.values and o.features.get(k)})
        n = sum(1 for o in observed if k in o.values and o.features.get(k))
        priors[k] = P.Prior(k, c, round(max(errors), 4) if errors else None, n, archs)
    return P.Library(vllm, priors, list(observed))


def without(lib: P.Library, architecture: str) -> P.Library:
    """``lib`` refitted without ``architecture``'s start-ups (leave one architecture out)."""
    return fit([o for o in lib.observed if o.architecture != architecture], lib.vllm)


def to_json(lib: P.Library) -> str:
    """``lib`` as a priors file (``priors.load_library`` reads it back)."""
    doc = {"format": P.FORMAT, "vllm": lib.vllm, "priors": {k: asdict(p) for k, p in lib.priors.items()},
           "observed": [asdict(o) for o in lib.observed]}  # fmt: skip
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"
