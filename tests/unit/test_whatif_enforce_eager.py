"""The enforce-eager rule of ``analysis.whatif``: with ``--enforce-eager`` vLLM captures no CUDA graph, so an eager
what-if predicts 0 B of CUDA-graph memory, and a what-if that keeps the graphs keeps the recorded graph pool.

This model's graph pool (~36-40 MiB with 5 graphs) is under the held-out table's 256 MiB bar, so the table alone
cannot see the rule broken; these checks are exact. They hold the prediction to the shipped vLLM 0.34 pairs: g08
(2048 tokens, eager) captured nothing, moe-ext and g03 (8192 tokens, 5 graphs) the same pool to the byte, g07
(256 seqs, 51 graphs) a larger one. Breaking the rule (``Flags.graphs`` ignoring enforce-eager, or the calibrated
branch of ``scale_of`` dropped: its fitted line is 33 MB at 0 graphs) fails them.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from memtrace.analysis.capacity import whatif as W
from whatif_heldout_cases import sites

BASES = [("moe-ext", ()), ("g03", ()), ("g07", ()), ("g03", ("g07",)), ("g07", ("g03",))]


def _capture(wi: W.WhatIf) -> W.PhasePeak:
    return next(p for p in wi.phase_peaks(0) if p.phase == "compile_or_warm_up/capture_model")


def _graph_bytes(s: W.Sites) -> np.ndarray:
    """What capture allocates and frees, and what the graphs keep (their pool): every CUDA-graph byte."""
    return s.bytes[W.GRAPHS] + s.bytes[W.GRAPHS_KEPT]


def _graph_kinds(p: W.PhasePeak) -> tuple[int, int]:
    """(recorded, predicted) CUDA-graph bytes at a phase's peak, both kinds."""
    pairs = [p.kinds.get(k, (0, 0)) for k in (W.GRAPHS, W.GRAPHS_KEPT)]
    return sum(r for r, _ in pairs), sum(q for _, q in pairs)


def _what_if(base: str, more: tuple[str, ...], flags: W.Flags) -> W.WhatIf:
    b = sites(base)
    return W.WhatIf(b, flags, W.calibrate([b, *(sites(m) for m in more)]) if more else None)


def test_the_real_eager_start_up_captured_no_cuda_graph_and_the_others_did():
    eager, graphs = sites("g08"), {s: sites(s) for s in ("moe-ext", "g03", "g07")}
    assert eager.flags.enforce_eager and eager.flags.graphs == 0
    assert not any(p.name == "capture_model" for p in eager.trace.phases) and int(_graph_bytes(eager).max()) == 0
    assert {s: g.flags.graphs for s, g in graphs.items()} == {"moe-ext": 5, "g03": 5, "g07": 51}
    assert all(int(_graph_bytes(g).max()) > 30 << 20 for g in graphs.values())


@pytest.mark.parametrize("base, more", BASES, ids=["+".join((b, *m)) for b, m in BASES])
def test_an_eager_what_if_predicts_no_cuda_graph_memory_in_capture(base, more):
    """g08's flags (2048 tokens, eager) from a start-up that captured graphs: the capture phase adds 0 B of graphs."""
    wi = _what_if(base, more, sites("g08").flags)
    assert wi.scales[W.GRAPHS].factor == wi.scales[W.GRAPHS_KEPT].factor == 0.0
    recorded, predicted = _graph_kinds(_capture(wi))
    assert recorded > 30 << 20 and predicted == 0


@pytest.mark.parametrize("base", ["moe-ext", "g03", "g07"])
def test_the_eager_curve_is_the_graph_keeping_one_less_the_recorded_graph_pool_at_every_moment(base):
    s = sites(base)
    lazy = dataclasses.replace(sites("g08").flags, enforce_eager=False)  # g08's flags, graphs kept: 5 of them
    kept, eager = W.WhatIf(s, lazy), W.WhatIf(s, sites("g08").flags)
    pool = s.bytes[W.GRAPHS] * (lazy.graphs / s.flags.graphs) + s.bytes[W.GRAPHS_KEPT]  # the kept pool: as recorded
    assert np.abs((kept.no_kv - eager.no_kv) - pool).max() <= 2  # float rounding of the scaled pool
    assert int((kept.no_kv - eager.no_kv).max()) > 20 << 20  # 30-38 MB: what the 256 MiB bar cannot see


def test_a_graph_keeping_what_if_predicts_the_recorded_graph_pool_the_next_start_up_measured():
    """moe-ext -> g03 (the same flags, 5 graphs): the predicted pool is g03's own, to the byte."""
    wi = _what_if("moe-ext", (), sites("g03").flags)
    assert wi.scales[W.GRAPHS].factor == wi.scales[W.GRAPHS_KEPT].factor == 1.0
    predicted = _graph_kinds(_capture(wi))[1]
    measured = _graph_kinds(_capture(W.WhatIf(sites("g03"), sites("g03").flags)))[0]
    assert predicted == measured == 38_036_516
