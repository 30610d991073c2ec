"""How well ``analysis.whatif`` predicted a start-up that was then really run: predicted against measured.

A held-out start-up (a trace of the same model with other flags, on a card) is predicted from a base trace and
a calibration (``whatif.calibrate`` over the calibration traces) with the held-out run's own flags, on its card
as it was (other processes kept), and compared figure by figure with what it measured: the pre-KV peak, each
phase's peak (the same curve: what the start-up needs, pinned segments + non-PyTorch memory + the VMM KV pages)
and vLLM's KV cache (its blocks, and the available bytes vLLM's formula gives on the measured run's own inputs).
A figure passes within 2 % of the measured value or 256 MiB, whichever is larger (issue 28's bar).
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import facts as F
from . import whatif as W

#: The bar: 2 % of the measured value, or 256 MiB, whichever is larger.
REL, ABS = 0.02, 256 << 20


@dataclass(frozen=True)
class Figure:
    """One predicted figure against its measured value."""

    name: str
    predicted: int
    measured: int
    bytes_bar: bool = True  # False for a count (blocks): 2 % only

    @property
    def error(self) -> int:
        return self.predicted - self.measured

    @property
    def ok(self) -> bool:
        bar = max(REL * abs(self.measured), ABS if self.bytes_bar else 0)
        return abs(self.error) <= bar


@dataclass(frozen=True)
class Check:
    """A held-out run's figures, predicted from the base and calibration, against what it measured."""

    name: str
    changes: list[str]
    verdict: str  # the predicted outcome on the held-out run's card
    figures: list[Figure]

    @property
    def ok(self) -> bool:
        return all(f.ok for f in self.figures)


def check(base: W.Sites, cal: W.Calibration | None, measured: W.Sites, name: str = "") -> Check:
    """Predict ``measured`` (its flags, its card, its other processes) from ``base`` and ``cal``; compare."""
    card = measured.trace.process.device_total_bytes
    others = W.recorded_others(measured.trace)
    pred = W.WhatIf(base, measured.flags, cal).on(card, others_bytes=others)
    own = W.WhatIf(measured, measured.flags).on(card, keep_others=True)  # vLLM's formula on its own inputs
    figures = [Figure("pre-KV peak", pred.pre_kv_peak_bytes, own.pre_kv_peak_bytes)]
    by_phase = {p.phase: p for p in pred.phases}
    for p in own.phases:
        q = by_phase.get(p.phase)
        if q is not None:
            figures.append(Figure(f"peak {p.phase}", q.predicted_bytes - pred.others_bytes, p.recorded_bytes))
    if pred.kv is not None and own.kv is not None:
        figures.append(Figure("vLLM's available KV", pred.kv.available_bytes, own.kv.available_bytes))
        blocks = measured.trace.facts.get(F.VLLM_KV_BLOCKS)
        if isinstance(blocks, int):
            figures.append(Figure("KV blocks", pred.kv.blocks, blocks, bytes_bar=False))
    return Check(name, measured.flags.changes(base.flags), pred.verdict, figures)
