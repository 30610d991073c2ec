"""The capacity model (``analysis.capacity.fits``) asked of one trace alone, as the tests ask it."""

from __future__ import annotations

import dataclasses

from memtrace.analysis.analysed.run import analyse
from memtrace.analysis.capacity import fits as C


def fit(trace, capacity_bytes: int, util: float | None = None, *, non_torch_bytes: int | None = None) -> C.Fit:
    """``fits.fit`` on ``trace`` analysed alone with its profiled model (the extensible one: ``fits.fit_extensible``,
    which ``boot.Boot`` asks for a start-up vLLM 0.34 sized after warm-up)."""
    rank = analyse([trace]).worst.boot_rank
    rec = dataclasses.replace(C.recorded(rank, non_torch_bytes), extensible=None)
    return C.fit(rank.trace, capacity_bytes, util, rec=rec)
