"""How well ``analysis.whatif`` predicted a start-up that was then really run: predicted against measured.

A held-out start-up (a trace of the same model with other flags, on a card) is predicted from a base trace and
a calibration (``whatif.calibrate`` over the calibration traces) with the held-out run's own flags, on its card
as it was (other processes kept), and compared figure by figure with what it measured: the pre-KV peak, each
phase's peak (the same curve: what the start-up needs, pinned segments + non-PyTorch memory + the VMM KV pages)
and vLLM's KV cache (its blocks, and the available bytes vLLM's formula gives on the measured run's own inputs).
A figure passes within 2 % of the measured value or 256 MiB, whichever is larger (issue 28's bar). A run that
died (a CUDA OOM ends its recording) measured its peaks only up to the failed request: those are lower bounds,
and a prediction passes when it reaches them (less the bar). The outcome is compared too: what the model says
on the held-out run's card (boots / dies in PHASE / vLLM refuses) against what happened there.
"""

from __future__ import annotations

from dataclasses import dataclass

from memtrace import facts as F
from memtrace import vllm_phase_names as PN
from memtrace.analysis.capacity import whatif as W

#: The bar: 2 % of the measured value, or 256 MiB, whichever is larger.
REL, ABS = 0.02, 256 << 20


@dataclass(frozen=True)
class Figure:
    """One predicted figure against its measured value."""

    name: str
    predicted: int
    measured: int
    bytes_bar: bool = True  # False for a count (blocks): 2 % only
    lower_bound: bool = False  # the measured run died before its peak: the measured figure is a lower bound

    @property
    def error(self) -> int:
        return self.predicted - self.measured

    @property
    def bar(self) -> int:
        return int(max(REL * abs(self.measured), ABS if self.bytes_bar else 0))

    @property
    def ok(self) -> bool:
        if self.lower_bound:
            return self.error >= -self.bar
        return abs(self.error) <= self.bar


@dataclass(frozen=True)
class Check:
    """A held-out run's figures, predicted from the base and calibration, against what it measured."""

    name: str
    changes: list[str]
    verdict: str  # the predicted outcome on the held-out run's card
    figures: list[Figure]
    predicted: str = ""  # the predicted outcome in words: "boots", "dies in PHASE by N GiB", "vLLM refuses"
    happened: str = ""  # what the held-out run did, in the same words

    @property
    def ok(self) -> bool:
        return self.outcome_ok and all(f.ok for f in self.figures)

    @property
    def outcome_ok(self) -> bool:
        return _outcome_key(self.predicted) == _outcome_key(self.happened)


def _outcome_key(words: str) -> str:
    """An outcome without its amount ("dies in determine_available_memory/profile_run")."""
    return words.split(" by ", 1)[0]


def outcome_words(o: W.Outcome) -> str:
    """A predicted outcome in the table's words."""
    from memtrace.units import format_gib

    if o.verdict == W.DIES:
        return f"dies in {o.phase} by {format_gib(o.by_bytes)}"
    return {W.REFUSES: f"vLLM refuses in {o.phase}", W.BOOTS: "boots"}.get(o.verdict, o.verdict)


def happened(sites: W.Sites) -> str:
    """What the recorded start-up did: died at its CUDA OOM, vLLM sized 0 blocks (it refuses), or booted."""
    oom = sites.rank.oom
    if oom is not None:
        return f"dies in {oom.phase_path}"
    blocks = measured_blocks(sites.trace)
    if blocks == 0:
        sizing = PN.path(PN.KV_CACHE_SIZING) if sites.flags.extensible else PN.KV_SIZING_CHECK
        return f"vLLM refuses in {sizing}"
    return "boots" if blocks is not None else "unknown"


def measured_blocks(trace) -> int | None:
    """vLLM's KV blocks (``facts.VLLM_KV_BLOCKS``: 0 when it refused), None before they were sized."""
    return F.int_fact(trace.facts, F.VLLM_KV_BLOCKS)


def check(base: W.Sites, cal: W.Calibration | None, measured: W.Sites, name: str = "") -> Check:
    """Predict ``measured`` (its flags, its card, its other processes) from ``base`` and ``cal``; compare."""
    card = measured.trace.process.device_total_bytes
    others = W.recorded_others(measured.trace)
    pred = W.WhatIf(base, measured.flags, cal).on(card, others_bytes=others)
    own = W.WhatIf(measured, measured.flags).on(card, keep_others=True)  # vLLM's formula on its own inputs
    died = measured.rank.oom is not None  # its peaks are lower bounds; its last phase ends at the OOM
    figures = [Figure("pre-KV peak", pred.pre_kv_peak_bytes, own.pre_kv_peak_bytes, lower_bound=died)]
    by_phase = {p.phase: p for p in pred.phases}
    for p in own.phases:
        q = by_phase.get(p.phase)
        if q is not None:
            at = measured.rank.oom.phase_path if died else ""
            cut = died and (at == p.phase or at.startswith(p.phase + "/"))  # the phase the OOM ended
            figures.append(Figure(f"peak {p.phase}", q.predicted_bytes - pred.others_bytes, p.needed_bytes,
                                  lower_bound=cut))  # fmt: skip
    if pred.kv is not None and own.kv is not None:
        figures.append(Figure("vLLM's available KV", pred.kv.available_bytes, own.kv.available_bytes))
        blocks = measured_blocks(measured.trace)
        if blocks is not None:
            figures.append(Figure("KV blocks", pred.kv.blocks, blocks, bytes_bar=False))
    return Check(
        name, measured.flags.changes(base.flags), pred.verdict, figures, outcome_words(pred), happened(measured)
    )
