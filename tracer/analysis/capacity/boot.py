"""Will it boot on that card: the one answer ``memtrace fits`` (plain, ``--what-if``, ``--suggest``, ``--json``), the
issue bundle and the view give (issues 28, 40; docs/whatif.md, "Plain fits").

:class:`Boot` answers for one rank with the recorded flags, card by card, once: the capacity model first
(:mod:`.fits`), and where it stops at the end of the recording (UNKNOWN), or on a card other processes share, the
what-if of no change (:mod:`.whatif`) carries the start-up on from its recorded phases, said to be a prediction
(``Fit.prediction``, ``Fit.prediction_how``); where neither can, ``Fit.missing`` says what the trace lacks. The
smallest card is searched once on that answer (:func:`smallest_card`) and "short by" is that card less the one
asked. The two models are one where both answer (the same verdict, place and bytes on every shipped start-up:
``tests/unit/test_one_boot_verdict.py``), so :func:`answer` gives the what-if's outcome for the recorded flags with
that "short by", and the table, the JSON, ``--suggest``, the exit status, the issue bundle and the view
(:func:`recorded_card_answer`) say one thing.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from functools import cached_property

from memtrace import facts as F
from memtrace import vllm_phase_names as PN
from memtrace.analysis.capacity import fits, whatif
from memtrace.analysis.memory.phases import path_at

#: The model that answers past the recording, as every output names it (``{flags}``: the flags it is given).
WHAT_IF_MODEL = "the what-if model with {flags} (docs/whatif.md) carries it on from its recorded phases"


def smallest_card(survives, lo: int, hi: int) -> int | None:
    """The smallest capacity in (``lo``, ``hi``] (to ``SEARCH_STEP``) where ``survives(capacity)`` holds, by
    bisection (an answer that survives on a card survives on every larger one); None when it fails at ``hi``."""
    if not survives(hi):
        return None
    while hi - lo > fits.SEARCH_STEP:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if survives(mid) else (mid, hi)
    return hi


def search_ceiling(rank, others_bytes: int = 0) -> int:
    """The largest card the one smallest-card search tries: four times the recorded peak, or the recorded card when
    larger (at least ``MIN_CAPACITY``), plus what other processes hold on it."""
    return (
        max(rank.landmarks.peak.bytes * 4, rank.recorded_target.capacity_bytes or 0, fits.MIN_CAPACITY) + others_bytes
    )


def short_of(boots: bool, card: int, smallest: int | None) -> int | None:
    """How much larger than ``card`` a card must be to boot: 0 where it boots; None where no larger card is known to
    boot it (none found, or the answers are not monotone above it)."""
    return 0 if boots else (smallest - card if smallest is not None and smallest > card else None)


class Boot:
    """Will one rank boot with the recorded flags on a card it holds alone, or beside other processes holding
    ``others_bytes`` (a shared card: the what-if of no change answers, said to be a prediction): :meth:`fit` per card
    (computed once), :attr:`smallest` card, and "short by" (``Fit.short_bytes``). Past the recording the what-if of
    no change answers (:attr:`what_if`), or ``missing`` says why none can ("" when one can)."""

    def __init__(self, rank, util: float | None = None, non_torch_bytes: int | None = None, others_bytes: int = 0):
        self.rank, self.trace, self.util, self.others = rank, rank.trace, util, others_bytes
        self.rec = fits.recorded(rank, non_torch_bytes)
        self._fits: dict[int, fits.Fit] = {}
        self.missing = ""
        if not F.is_vllm(self.trace.facts) or whatif.recorded_flags(self.trace) is None:
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

    def _answer(self, card: int) -> fits.Fit:
        if card not in self._fits:
            f = fits.fit(self.trace, card, self.util, rec=self.rec)
            self._fits[card] = self._past(f) if self.others or f.outcome == fits.UNKNOWN else f
        return self._fits[card]

    @cached_property
    def smallest(self) -> int | None:
        """The smallest card (to ``SEARCH_STEP``) it boots on; None above :func:`search_ceiling`, and for a start-up
        its recording's OOM cut (it boots on no card: the capacity model promises none)."""
        return smallest_card(
            lambda c: self._answer(c).survives, fits.MIN_CAPACITY, search_ceiling(self.rank, self.others)
        )

    def fit(self, card: int) -> fits.Fit:
        """The answer on ``card``, with how much larger a card must be to boot."""
        f = self._answer(card)
        return dataclasses.replace(f, short_bytes=short_of(f.survives, card, self.smallest))

    @property
    def smallest_prediction(self) -> str:
        """Where the smallest card's answer goes past the recording ("" when it does not, or there is none)."""
        return self._answer(self.smallest).prediction if self.smallest is not None else ""

    def outcome(self, card: int, w: whatif.WhatIf, **shared) -> whatif.Outcome:
        """The what-if of no change (``w``; ``shared``: its card's other processes) on ``card`` with "short by" from
        the one smallest-card search. Where the capacity model answers, the what-if gives its verdict, place and bytes
        (one model: ``test_one_boot_verdict``); past the recording :meth:`fit` is the what-if's own answer."""
        return dataclasses.replace(w.on(card, **shared), short_bytes=self.fit(card).short_bytes)

    @cached_property
    def what_if(self) -> whatif.WhatIf:
        """The what-if of no change (``--util``, when given, its one change)."""
        s = whatif.sites_of(self.rank)
        items = [f"gpu-memory-utilization={self.util}"] if self.util is not None else []
        return whatif.WhatIf(s, whatif.apply_what_if(s.flags, items))

    def _past(self, f: fits.Fit) -> fits.Fit:
        """``f`` (the capacity model, the card held alone) answered by the what-if of no change: where ``f`` is
        UNKNOWN, past the recording; on a card other processes share, always (the capacity model keeps the card to
        this process). Where it cannot, ``f`` with what is missing (said by the recorded OOM, when the recording
        ended in one; UNKNOWN on a shared card)."""
        others = self.others
        o = self.what_if.on(f.capacity_bytes, others_bytes=others) if not self.missing else None
        where = f"the card is shared: other processes hold {others:,} B of it" if others else self.ends()
        if o is not None and o.verdict != whatif.UNKNOWN:
            left_out = 0 if others else f.others_left_out_bytes
            return dataclasses.replace(as_predicted(f, o, self.what_if, f"{where}; {self.model}"),
                                       others_left_out_bytes=left_out)  # fmt: skip
        if others:
            return dataclasses.replace(f, outcome=fits.UNKNOWN, phase="", stage="beyond the recording",
                                       kv_cache_bytes=0, kv_blocks=None, kv_tokens=None, kv_available_bytes=None,
                                       prediction=f"{where}; {self.model}",
                                       missing=o.why if o is not None else self.missing)  # fmt: skip
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
            others = whatif.recorded_others(t)
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


def as_predicted(f: fits.Fit, o: whatif.Outcome, w: whatif.WhatIf, prediction: str) -> fits.Fit:
    """The capacity model's UNKNOWN ``f`` answered by the what-if's outcome ``o`` on the same card: what the
    recording covers as the capacity model measured it (the pre-KV peak), what lies past it (the KV cache, the
    outcome) as the what-if model predicted it; ``prediction``: where the recording ends and which model carries
    it on, ``prediction_how`` (from ``o``): where this card's figures come from."""
    cap, kv = o.capacity_bytes, o.kv if o.verdict == whatif.BOOTS else None
    post = [p.predicted_bytes for p in o.phases if p.after_kv]
    common = dict(util=w.flags.util, target_bytes=math.ceil(w.flags.util * cap), prediction=prediction, missing="",
                  kv_sizing=F.KV_SIZED_EXTENSIBLE if w.flags.extensible else F.KV_SIZED_BY_PROFILING,
                  kv_cache_bytes=kv.kv_bytes if kv is not None else 0, kv_blocks=kv.blocks if kv is not None else None,
                  kv_tokens=kv.tokens if kv is not None else None,
                  kv_available_bytes=kv.available_bytes if kv is not None else None,
                  prediction_how=f"the KV cache from {kv.how}" if kv is not None else o.why)  # fmt: skip
    if o.verdict == whatif.BOOTS:
        top = max([f.pre_kv_peak_bytes, *post])
        return dataclasses.replace(f, **common, outcome=fits.FITS, phase="", overshoot_bytes=0,
                                   headroom_bytes=cap - top, stage="",
                                   post_kv_peak_bytes=max(post) if post else None)  # fmt: skip
    if o.verdict == whatif.DIES:
        pre = o.pre_kv_peak_bytes > cap - o.others_bytes
        return dataclasses.replace(f, **common, outcome=fits.OOM, phase=o.phase, overshoot_bytes=o.by_bytes,
                                   headroom_bytes=0, stage="pre-KV" if pre else "post-KV",
                                   post_kv_peak_bytes=None if pre else cap + o.by_bytes)  # fmt: skip
    outcome, stage = (fits.REFUSED, "init") if o.phase == PN.INIT_DEVICE else (fits.NO_KV, _kv_refusal(o, w))
    return dataclasses.replace(f, **common, outcome=outcome, phase=o.phase, overshoot_bytes=o.by_bytes,
                               headroom_bytes=0, stage=stage)  # fmt: skip


def _kv_refusal(o: whatif.Outcome, w: whatif.WhatIf) -> str:
    """Why vLLM's KV check refuses in the what-if's outcome ``o``, as ``Fit.stage`` says it."""
    if o.phase != PN.KV_SIZING_CHECK:
        return "KV sizing"  # after the extensible cache's warm-up
    if w.flags.extensible:
        return fits.ADDRESS_RANGE
    return fits.ONE_REQUEST if o.kv is not None and o.kv.available_bytes > 0 else "KV sizing"


def answer(rank, what_if: list[str], capacities: list[int], *, suggest_too: bool = False, keep_others: bool = False,
           others_bytes: int | None = None, calibration_ranks: tuple = (), library=None) -> whatif.Answer:  # fmt: skip
    """The what-if of ``rank`` under ``what_if`` on each card (``calibration_ranks``: more traces of the same
    model, to fit each site's scaling), and with ``suggest_too`` the flags that boot on each card. The recorded
    flags (another utilization included) on a card this process holds alone answer as plain ``fits`` (with
    ``--util``) does (:meth:`Boot.outcome`)."""
    sites = whatif.sites_of(rank)
    cal = whatif.calibrate([sites, *(whatif.sites_of(r) for r in calibration_ranks)]) if calibration_ranks else None
    flags = whatif.apply_what_if(sites.flags, what_if)
    w = whatif.WhatIf(sites, flags, cal, library)
    card = dict(keep_others=keep_others, others_bytes=others_bytes)
    others = others_bytes if others_bytes is not None else whatif.recorded_others(rank.trace) if keep_others else 0
    util = flags.gpu_memory_utilization if flags.gpu_memory_utilization != sites.flags.gpu_memory_utilization else None
    plain = dataclasses.replace(flags, gpu_memory_utilization=sites.flags.gpu_memory_utilization) == sites.flags
    b = rank.boot(util, others_bytes=others) if plain and cal is None else None  # plain fits (--util: the utilization)
    on = functools.partial(b.outcome, w=w, **card) if b is not None else _searched(w, rank, card, others)
    outcomes = [on(c) for c in capacities]
    pairs = zip(capacities, outcomes, strict=True) if suggest_too else ()
    found = [whatif.suggest(sites, c, **card, cal=cal, base=flags, recorded=o, library=library) for c, o in pairs]
    fitted = (cal.traces, len(cal.lines)) if cal is not None else (0, 0)
    return whatif.Answer(sites.flags, flags, flags.changes(sites.flags), w.scales, *fitted, w.notes, outcomes, found,
                         keep_others, str(rank.trace.facts.get(F.VLLM_VERSION) or ""))  # fmt: skip


def _searched(w: whatif.WhatIf, rank, card: dict, others: int):
    """``w.on`` per card with "short by" from the one smallest-card search on ``w``'s verdict alone (no phase
    table), searched once, when a card asked does not boot."""
    least: list[int | None] = []

    def boots(c: int) -> bool:
        return w.on(c, **card, table=False).verdict == whatif.BOOTS

    def on(c: int) -> whatif.Outcome:
        o = w.on(c, **card)
        if o.verdict != whatif.BOOTS and not least:
            least.append(smallest_card(boots, fits.MIN_CAPACITY, search_ceiling(rank, others)))
        return dataclasses.replace(o, short_bytes=short_of(o.verdict == whatif.BOOTS, c, least[0] if least else None))

    return on


def recorded_card_answer(run) -> whatif.Answer | None:
    """``fits --suggest`` on the card the worst rank was recorded on, as it was (other processes kept): the issue
    bundle's and the view's "What would make it boot". None for a run that is not a vLLM start-up with its config
    and card, or that booted (a start-up vLLM refused after sizing 0 KV blocks did not boot)."""
    r = run.worst
    card = r.recorded_target.capacity_bytes
    if r.recorded_nothing or whatif.recorded_flags(r.trace) is None or not card:
        return None
    refused = r.trace.facts.get(F.VLLM_KV_BLOCKS) == 0  # vLLM sized 0 blocks: it refused
    if r.oom is None and r.verdict != "crossed" and not refused:
        return None
    return answer(r, [], [card], suggest_too=True, keep_others=True)
