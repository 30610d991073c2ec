"""Will it boot on that card: the one answer ``memtrace fits``, the issue bundle and the view give (issue 28).

``fits`` asks the capacity model first (:mod:`.fits`; :mod:`.fits_extensible` for vLLM 0.34's extensible KV
cache): the recorded curve on another card. Where that model stops at the end of the recording (UNKNOWN: the
part that decides was never recorded, such as a KV cache vLLM refused to extend on a card another process
shared), the what-if model with the recorded flags (:mod:`.whatif`, a what-if of no change) carries the
start-up on from its recorded phases; its answer replaces "unknown", said to be a prediction, with where its
figures come from (``Fit.prediction``, ``Fit.prediction_how``). Where the what-if model cannot carry it either,
the answer stays UNKNOWN and ``Fit.missing`` says exactly what the trace lacks. The smallest card is searched
on the same answer, so the table, the JSON, the smallest card and the exit status never disagree.

The issue bundle and the view ask :func:`recorded_card_answer`: ``fits --suggest`` on the card the worst rank
was recorded on, as it was (other processes kept).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from functools import cached_property

from memtrace import facts as F
from memtrace.analysis.capacity.fits import (
    FITS,
    MIN_CAPACITY,
    NO_KV,
    OOM,
    REFUSED,
    UNKNOWN,
    Fit,
    fits,
    recorded,
    search_ceiling,
    smallest_card,
    smallest_fitting,
)
from memtrace.analysis.capacity.fits_extensible import as_fit, is_extensible
from memtrace.analysis.capacity.fits_extensible import smallest as smallest_extensible
from memtrace.analysis.capacity.whatif import (
    BOOTS,
    DIES,
    Answer,
    Outcome,
    WhatIf,
    apply_what_if,
    recorded_flags,
    recorded_others,
    sites_of,
)
from memtrace.analysis.capacity.whatif import UNKNOWN as STOPS
from memtrace.analysis.capacity.whatif import answer as what_if_answer
from memtrace.analysis.memory.phases import path_at

#: The model that answers past the recording, as every output names it (``{flags}``: the flags it is given).
WHAT_IF_MODEL = "the what-if model with {flags} (docs/whatif.md) carries it on from its recorded phases"


def rank_fits(rank, capacities: list[int], util: float | None = None, non_torch_bytes: int | None = None):
    """``fits`` of one analysed rank: one ``Fit`` per capacity, the smallest card it fits on (None: none up to 4x
    its peak, or a recording cut by its OOM), and where that card's answer goes past the recording ("" when not)."""
    rec = recorded(rank.trace, non_torch_bytes, rank=rank)
    if is_extensible(rank.trace) and rank.extensible is not None:  # vLLM 0.34: sized after warm-up

        def model(c: int) -> Fit:
            return as_fit(rank, c, util, rec)

        smallest = smallest_extensible(rank, util, rec)
    else:

        def model(c: int) -> Fit:
            return fits(rank.trace, [c], util, rec=rec)[0]

        smallest = smallest_fitting(rank.trace, util, rec=rec)
    past = PastTheRecording(rank, util, non_torch_bytes)

    @functools.cache  # the search asks again for cards it or --capacity already answered
    def answer_on(c: int) -> Fit:
        f = model(c)
        return past.answer(f) if f.outcome == UNKNOWN else f

    results = [answer_on(c) for c in capacities]
    if smallest is not None or rec.oom is not None or past.missing:  # a recording cut by its OOM promises none
        return results, smallest, ""
    smallest = smallest_card(lambda c: answer_on(c).survives, MIN_CAPACITY, search_ceiling(rec))
    return results, smallest, answer_on(smallest).prediction if smallest is not None else ""


class PastTheRecording:
    """The what-if of no change for one rank (built when first asked, then asked per card), or why there is none
    (``missing``: "" when there is one)."""

    def __init__(self, rank, util: float | None, non_torch_bytes: int | None):
        self.rank, self.trace, self.util = rank, rank.trace, util
        self.missing = ""
        if not F.is_vllm(self.trace.facts) or recorded_flags(self.trace) is None:
            self.missing = (
                "vLLM's config (max_num_batched_tokens, max_num_seqs, max_model_len) is not in the recording: the "
                "what-if model needs it to carry the start-up past the recording's end"
            )
        elif non_torch_bytes is not None:
            self.missing = (
                "the what-if model, which carries a start-up past its recording, keeps the recorded non-PyTorch "
                "memory: without --non-torch it answers"
            )
        flags = "the recorded flags" + (f" and --util {util:g}" if util is not None else "")
        self.model = WHAT_IF_MODEL.format(flags=flags)

    @cached_property
    def what_if(self) -> WhatIf:
        s = sites_of(self.rank)
        items = [f"gpu-memory-utilization={self.util}"] if self.util is not None else []
        return WhatIf(s, apply_what_if(s.flags, items))

    def answer(self, f: Fit) -> Fit:
        """``f`` (the capacity model's UNKNOWN) answered by the what-if of no change where it can, else with what
        is missing (said by the recorded OOM, when the recording ended in one)."""
        o = self.what_if.on(f.capacity_bytes) if not self.missing else None
        if o is not None and o.verdict != STOPS:
            return as_predicted(f, o, self.what_if, f"{self.ends()}; {self.model}")
        if self.rank.oom is not None:
            return f
        return dataclasses.replace(f, missing=self.missing or self._ends_before_sizing())

    def ends(self) -> str:
        """Where the recording ends, in words (the part the what-if model carries on from)."""
        t, oom = self.trace, self.rank.oom
        if oom is not None:
            return f"it ends at its CUDA OOM in {oom.phase_path}"
        if t.facts.get(F.VLLM_KV_BLOCKS) == 0:
            u = self.rank.unfinished
            at = f" at {u.phase_path}" if u is not None else ""
            others = recorded_others(t)
            beside = f", other processes holding {others:,} B" if others else ""
            return f"it ends where vLLM refused on its card (0 KV blocks{at}{beside}), before the KV cache was extended"
        return f"it ends {self._last_phase()}, before the KV cache was allocated"

    def _last_phase(self) -> str:
        """Where the recording's last moment lies: "in <phase path>", or "outside any phase"."""
        where = path_at(self.trace, self.rank.span[1])
        return f"in {where}" if where else "outside any phase"

    def _ends_before_sizing(self) -> str:
        return (
            f"the recording ends {self._last_phase()}, before vLLM sized the KV cache: "
            "vLLM's sizing inputs were never recorded, so neither the capacity model nor the what-if model can "
            "size it; record a run that gets further"
        )


def as_predicted(f: Fit, o: Outcome, w: WhatIf, prediction: str) -> Fit:
    """The capacity model's UNKNOWN ``f`` answered by the what-if's outcome ``o`` on the same card: what the
    recording covers as the capacity model measured it (the pre-KV peak), what lies past it (the KV cache, the
    outcome) as the what-if model predicted it; ``prediction``: where the recording ends and which model carries
    it on, ``prediction_how`` (from ``o``): where this card's figures come from."""
    cap, kv = o.capacity_bytes, o.kv
    post = [p.predicted_bytes for p in o.phases if p.after_kv]
    common = dict(
        util=w.flags.util,
        target_bytes=math.ceil(w.flags.util * cap),
        kv_sizing=F.KV_SIZED_EXTENSIBLE if w.flags.extensible else F.KV_SIZED_BY_PROFILING,
        kv_cache_bytes=kv.kv_bytes if kv is not None else f.kv_cache_bytes,
        kv_blocks=kv.blocks if kv is not None else None,
        kv_tokens=kv.tokens if kv is not None else None,
        prediction=prediction,
        prediction_how=f"the KV cache from {kv.how}" if o.verdict == BOOTS and kv is not None else o.why,
        missing="",
    )
    if o.verdict == BOOTS:
        top = max([f.pre_kv_peak_bytes, *post])
        return dataclasses.replace(f, **common, outcome=FITS, phase="", overshoot_bytes=0, headroom_bytes=cap - top,
                                   stage="", post_kv_peak_bytes=max(post) if post else None)  # fmt: skip
    if o.verdict == DIES:
        pre = o.pre_kv_peak_bytes > cap - o.others_bytes
        return dataclasses.replace(f, **common, outcome=OOM, phase=o.phase, overshoot_bytes=o.by_bytes, headroom_bytes=0,
                                   stage="pre-KV" if pre else "post-KV",
                                   post_kv_peak_bytes=None if pre else cap + o.by_bytes)  # fmt: skip
    outcome, stage = (REFUSED, "init") if o.phase == "init_device" else (NO_KV, "KV sizing")
    return dataclasses.replace(f, **common, outcome=outcome, phase=o.phase, overshoot_bytes=o.by_bytes,
                               headroom_bytes=0, stage=stage)  # fmt: skip


def recorded_card_answer(run) -> Answer | None:
    """``fits --suggest`` on the card the worst rank was recorded on, as it was (other processes kept): the issue
    bundle's and the view's "What would make it boot". None for a run that is not a vLLM start-up with its config
    and card, or that booted (a start-up vLLM refused after sizing 0 KV blocks did not boot)."""
    r = run.worst
    card = r.recorded_target.capacity_bytes
    if r.recorded_nothing or recorded_flags(r.trace) is None or not card:
        return None
    refused = r.trace.facts.get(F.VLLM_KV_BLOCKS) == 0  # vLLM sized 0 blocks: it refused
    if r.oom is None and r.verdict != "crossed" and not refused:
        return None
    return what_if_answer(r, [], [card], suggest_too=True, keep_others=True)
