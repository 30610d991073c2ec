"""The text rendering of ``memtrace fits`` (analysis.fits results): one paragraph for one capacity,
a table for several.

Every outcome the analysis can give (``analysis.capacity.fits``: FITS ... UNKNOWN) has its own words here, chosen by
``outcome`` alone, so the text always says what ``--json`` says; an outcome without words is a bug
(ValueError), never a wrong sentence.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from memtrace.analysis.capacity.fits import (
    ADDRESS_RANGE,
    DIED,
    FITS,
    MIN_CAPACITY,
    NO_KV,
    NO_KV_CACHE,
    ONE_REQUEST,
    OOM,
    REFUSED,
    SEARCH_STEP,
    UNKNOWN,
    VERDICT,
    Fit,
)
from memtrace.analysis.capacity.reconcile import PRE_KV_PEAK
from memtrace.analysis.capacity.whatif import BOOTS, DIES, REFUSES
from memtrace.analysis.capacity.whatif import UNKNOWN as STOPS
from memtrace.analysis.memory.quantities import (
    AT_ONE_MOMENT,
    NON_TORCH,
    ONE_MOMENT,
    PROFILED_WINDOW,
    PeakBound,
    is_profiled_window,
)
from memtrace.facts import KV_SIZED_EXTENSIBLE as EXTENSIBLE
from memtrace.plots import oom_text
from memtrace.plots.text import wrap
from memtrace.units import format_gib as _gib

#: The width of the one-capacity answer (the table is as wide as it needs).
WIDTH = 100
#: The ``fits --json`` document's format and version: 2 says each card's answer in one vocabulary (``verdict``; why:
#: ``stage`` and ``phase``), without version 1's unversioned ``outcome`` beside it; 3: ``kv_cache_bytes`` is the whole
#: blocks vLLM allocates (``kv_blocks``, ``kv_tokens``) on a profiled cache too, vLLM's available figure beside it
#: (``kv_available_bytes``), and vLLM's KV check is one place, ``phase`` "KV sizing (after
#: determine_available_memory)", with why in ``stage`` ("KV sizing", "KV sizing: one request", "KV sizing: address
#: range").
JSON_FORMAT, JSON_VERSION = "memtrace-fits", 3

#: What fits can answer for an input of one moment, and for one whose allocator state is missing.
MOMENT_ANSWER = (
    "fits answers for that moment alone: whether what was held then fits on the card; a higher peak at any "
    "other time, the KV cache sizing and the start-up's phases are not in it"
)
MISSING_ANSWER = "Its peak is a lower bound, so a card it fits on is the least it needs, not a promise"
#: What fits can answer for a torch.profiler trace (``quantities.PROFILED_WINDOW``).
WINDOW_ANSWER = (
    "fits answers for that window alone: whether what was held in it fits on the card. That is no verdict on the "
    "program: it may need more outside the window (its start-up), and vLLM sizes a KV cache by the card"
)
#: UNKNOWN of a recording that ends (not at an OOM) before the KV cache, where ``Fit.missing`` says nothing more.
ENDS_BEFORE_KV = "the recording ends before the KV cache was sized; record a run that gets further"

#: The first word of an answer, per verdict (``fits.VERDICT``: also what tests compare with --json): the words of
#: every output that says whether it boots (``whatif_text``, the issue bundle, the view).
HEADLINE = {BOOTS: "BOOTS", DIES: "DIES", REFUSES: "vLLM REFUSES", STOPS: "UNKNOWN"}


def headline(r: Fit, vllm: bool = True) -> str:
    """The first word of ``r``'s answer; a program that is not vLLM FITS (it has no start-up to boot)."""
    head = HEADLINE[VERDICT[r.outcome]]
    return "FITS" if head == HEADLINE[BOOTS] and not vllm else head


def _in(phase: str) -> str:
    """``in profile_run``, or ``outside any phase`` for a run that recorded none there (a place that says
    itself, such as "before the first phase", as it is)."""
    if phase.startswith("before "):
        return phase
    return f"in {phase}" if phase else "outside any phase"


def _oom_facts(r: Fit) -> str:
    """The recorded OOM in words: phase, the failed request, the free memory."""
    o = r.recorded_oom
    return f"the recorded run died of CUDA OOM {oom_text.where(o)}: {oom_text.details(o)}"


def _moment_verdict(r: Fit) -> str:
    """A table row's phrase for an input of one moment: what was held then fits the card or not, at that
    moment (it has no phases, no KV sizing, no transient)."""
    if r.outcome == FITS:
        return f"fits {AT_ONE_MOMENT}, {_gib(r.headroom_bytes)} to spare"
    if r.outcome == OOM:
        return f"OOM {AT_ONE_MOMENT}: what was held then is {_gib(r.overshoot_bytes)} more than the card"
    return _verdict(r, False)


def _verdict(r: Fit, vllm: bool = True) -> str:
    """One short phrase for a table row (``vllm``: False for a program that is not vLLM: no KV sizing); a
    prediction past the recording (``Fit.prediction``) says so, and a card that does not boot how much it lacks."""
    return _outcome_phrase(r, vllm) + (" (predicted)" if r.prediction else "") + short_by(r)


def short_by(r) -> str:
    """How much larger a card must be to boot (a ``Fit`` or a what-if ``Outcome``: ``short_bytes``): "" where it
    boots or no larger card is known to."""
    if not r.short_bytes:
        return ""
    return f"; {_gib(r.short_bytes)} short: boots on a {_gib(r.capacity_bytes + r.short_bytes)} card"


def fit_to_dict(r: Fit) -> dict[str, Any]:
    """A JSON-ready dict of ``r`` (exact integers; the recorded OOM nested) in one vocabulary: the verdict (why:
    ``stage``, ``phase``) and ``survives``, not the capacity model's own outcome beside it."""
    d = dataclasses.asdict(r)
    del d["outcome"]
    return {**d, "verdict": VERDICT[r.outcome], "survives": r.survives}


def _outcome_phrase(r: Fit, vllm: bool) -> str:
    """A table row's phrase: a vLLM start-up's in its verdict's word (:data:`HEADLINE`: boots, dies, vLLM refuses,
    unknown), a program's that is not vLLM in its own (fits, OOM)."""
    if r.outcome == OOM and not vllm:
        return f"OOM {_in(r.phase)} (needs {_gib(r.overshoot_bytes)} more)"
    if r.outcome == FITS and not vllm:
        return f"fits, {_gib(r.headroom_bytes)} to spare"
    if r.outcome == FITS and r.kv_sizing == EXTENSIBLE:
        return f"boots: {_blocks(r)}"
    if r.outcome == FITS:
        return f"boots, {_gib(r.headroom_bytes)} to spare"
    if r.outcome == REFUSED:
        return f"vLLM refuses at init_device: free memory {_gib(r.overshoot_bytes)} below util × capacity"
    if r.outcome == NO_KV and r.kv_sizing == EXTENSIBLE:
        return f"vLLM refuses {_in(r.phase)}: no room for one max_model_len request"
    if r.outcome == NO_KV and r.stage == ONE_REQUEST:
        return f"vLLM refuses: its KV cache would be short of one max_model_len request ({_gib(r.overshoot_bytes)} missing)"
    if r.outcome == NO_KV:
        least = "at least " if r.recorded_oom is not None else ""  # vLLM's figure on the part recorded
        return f"vLLM refuses: no memory for the KV cache ({least}{_gib(r.overshoot_bytes)} missing)"
    if r.outcome == OOM and r.stage == "pre-KV":
        return f"dies {_in(r.phase)} (before KV sizing; needs {_gib(r.overshoot_bytes)} more)"
    if r.outcome == OOM:
        return f"dies {_in(r.phase)} (after the KV cache; {_gib(r.overshoot_bytes)} over)"
    if r.outcome == DIED and r.overshoot_bytes > 0:
        return f"dies {_in(r.phase)}, as recorded (the failed request is {_gib(r.overshoot_bytes)} over)"
    if r.outcome == DIED:
        return f"dies {_in(r.phase)}, as recorded (no more room there than the recorded card)"
    if r.outcome == UNKNOWN and r.recorded_oom is not None:
        return f"unknown: fits up to the recorded OOM {_in(r.phase)}; nothing after it was recorded"
    if r.outcome == UNKNOWN:
        return f"unknown: {r.missing or ENDS_BEFORE_KV}"
    raise ValueError(f"no words for fits outcome {r.outcome!r}")


def _answer(r: Fit, moment: bool = False, window: bool = False, vllm: bool = True) -> list[str]:
    """The one-capacity answer: the headline line and its explanation (``moment``: the input is one moment;
    ``window``: a profiled window, ``quantities.PROFILED_WINDOW``; ``vllm``: False for a program that is not)."""
    head = headline(r, vllm)
    if r.outcome == FITS and r.stage == NO_KV_CACHE and window:
        return [
            f"{head} in the profiled window: what was held in it fits, {_gib(r.headroom_bytes)} to spare at its peak"
        ]
    if r.prediction and r.outcome != FITS:  # the what-if model's words follow (``Fit.prediction_how``)
        return [
            f"{head} {_in(r.phase)} ({_gib(r.overshoot_bytes)} {'over the card' if r.outcome == OOM else 'missing'})"
        ]
    if r.outcome == FITS and r.stage == NO_KV_CACHE and moment:
        return [f"{head} {AT_ONE_MOMENT}: what was held then fits, {_gib(r.headroom_bytes)} to spare"]
    if r.outcome == OOM and moment:
        return [
            f"{head} {AT_ONE_MOMENT}: what was held then, {_gib(r.pre_kv_peak_bytes)}, is "
            f"{_gib(r.overshoot_bytes)} more than the card"
        ]
    if r.outcome == FITS and r.stage == NO_KV_CACHE:
        return [f"{head}: its whole recording fits (no KV cache), {_gib(r.headroom_bytes)} to spare at its peak"]
    if r.outcome == FITS and r.kv_sizing == EXTENSIBLE:
        return [
            f"{head}: vLLM sizes the KV cache after warm-up to {_gib(r.kv_cache_bytes)} ({_blocks(r)}); before it "
            f"the start-up needs at most {_gib(r.pre_kv_peak_bytes)} ({_in(r.pre_kv_peak_phase)}), "
            f"{_gib(r.headroom_bytes)} under the card"
        ]
    if r.outcome == FITS:
        return [f"{head}: KV cache {_gib(r.kv_cache_bytes)}, {_gib(r.headroom_bytes)} to spare at the tightest moment"]
    return _refused_or_dies(r, head)


def _refused_or_dies(r: Fit, head: str) -> list[str]:
    """:func:`_answer` of a vLLM start-up that does not boot on the card (or of which that is unknown)."""
    if r.outcome == REFUSED:
        return [
            f"{head} at init_device: vLLM needs {_gib(r.target_bytes)} free at start-up and would find "
            f"{_gib(r.overshoot_bytes)} less (CUDA context and other memory); lower --gpu-memory-utilization"
        ]
    if r.outcome == NO_KV and r.stage == ONE_REQUEST:
        return [
            f"{head} at KV sizing: the KV cache vLLM may size cannot hold one request of max_model_len "
            f"tokens ({_gib(r.overshoot_bytes)} missing); lower --max-model-len or raise --gpu-memory-utilization"
        ]
    if r.outcome == NO_KV and r.stage == ADDRESS_RANGE:
        return [
            f"{head} at {r.phase}: the KV cache's address range (vLLM may fill {_gib(r.target_bytes)} - "
            f"non-KV {_gib(r.non_kv_bytes)}) cannot hold one request of max_model_len tokens (vLLM refuses); "
            "lower --max-model-len or use a larger card"
        ]
    if r.outcome == NO_KV and r.kv_sizing == EXTENSIBLE:
        return [
            f"{head} {_in(r.phase)}: after warm-up too little is free for the KV cache to hold one request of "
            "max_model_len tokens (vLLM refuses); lower --max-model-len or use a larger card"
        ]
    if r.outcome == NO_KV and r.recorded_oom is not None:  # vLLM's formula on the part recorded: a lower bound
        return [
            f"{head} at KV sizing: vLLM keeps at least {_gib(r.non_kv_bytes)} out of the KV cache, more than it may "
            f'fill ("No available memory for the cache blocks"): at least {_gib(r.overshoot_bytes)} short of one '
            "request's KV cache",
            f"{_oom_facts(r)}; what the rest of that phase needed (never recorded) only adds to vLLM's figure, so "
            "vLLM refuses here whatever it was (if that rest does not fit on this card, the start-up dies there first)",
        ]
    if r.outcome == NO_KV:
        return [
            f"{head} at KV sizing: vLLM counts {_gib(r.non_kv_bytes)} that is not KV cache, more than it may fill "
            f'("No available memory for the cache blocks"): {_gib(r.overshoot_bytes)} short of one request\'s KV cache'
        ]
    if r.outcome == OOM and r.stage == "pre-KV":
        return [
            f"{head} {_in(r.phase)}, before the KV cache is sized:",
            f"before the KV cache it needs {_gib(r.pre_kv_peak_bytes)} (peak {_in(r.pre_kv_peak_phase)}), "
            f"{_gib(r.overshoot_bytes)} more than the card; --gpu-memory-utilization cannot help",
        ]
    if r.outcome == OOM:
        return [
            f"{head} {_in(r.phase)}, after the KV cache ({_gib(r.kv_cache_bytes)}) was allocated:",
            f"the post-KV peak would be {_gib(r.post_kv_peak_bytes)}, {_gib(r.overshoot_bytes)} over the card",
        ]
    if r.outcome == DIED:
        why = (
            f"on this card that request would still be {_gib(r.overshoot_bytes)} over the card"
            if r.overshoot_bytes > 0
            else "this card leaves no more room there than the recorded one did"
        )
        return [f"{head} {_in(r.phase)}, where the recording died:", f"{_oom_facts(r)}; {why}"]
    if r.outcome == UNKNOWN and r.recorded_oom is not None:
        return [
            f"{head}: {_oom_facts(r)}.",
            f"On this card that request would fit ({_gib(r.headroom_bytes)} to spare), but what the start-up "
            "needed after it was never recorded; record a run with this card and utilization to know",
        ]
    if r.outcome == UNKNOWN:
        return [f"{head}: {r.missing or ENDS_BEFORE_KV}"]
    raise ValueError(f"no words for fits outcome {r.outcome!r}")


def _blocks(r: Fit) -> str:
    tokens = f", {r.kv_tokens:,} tokens" if r.kv_tokens is not None else ""
    return f"{r.kv_blocks:,} blocks{tokens}" if r.kv_blocks is not None else "blocks unknown"


def _wrapped(indent: str, text: str, width: int = WIDTH) -> str:
    """``text`` cut at spaces to ``width`` (never inside a figure), continued two spaces deeper."""
    parts = wrap(text, width - len(indent) - 2)
    return "\n".join((indent if i == 0 else indent + "  ") + p for i, p in enumerate(parts))


def _assumption(r: Fit) -> str:
    if r.non_torch_bytes is None:
        return f"Non-PyTorch memory (CUDA context, libraries) assumed: {r.non_torch_source}; --non-torch\u00a0SIZE to set it"
    split = ""
    if r.non_torch_cupti_bytes is not None:
        split = f" = {_gib(r.non_torch_cupti_bytes)} CUPTI saw allocated"
        if r.non_torch_at_start_bytes is not None and r.non_torch_grew_unseen_bytes is not None:
            split += (
                f" + {_gib(r.non_torch_at_start_bytes)} present when recording began (CUDA context: another card's"
                " differs)"
            )
            if r.non_torch_cupti_own_bytes:
                split += f" + {_gib(r.non_torch_cupti_own_bytes)} CUPTI's own (not there without CUPTI)"
            split += f" + {_gib(r.non_torch_grew_unseen_bytes)} grew unseen"
    return (
        f"Non-PyTorch memory (CUDA context, libraries) assumed: {_gib(r.non_torch_bytes)} ({r.non_torch_source})"
        f"{split}; --non-torch\u00a0SIZE to change"
    )


#: What a program that is not vLLM needs on any card (``whatif.need_curve``), in its own terms.
PROGRAM_NEEDS = f"the segments PyTorch cannot release, plus {NON_TORCH.label} memory"


def _program(results: list[Fit], least: str, moment: bool, window: bool = False) -> list[str]:
    """The answer for a program that is not vLLM (or not known to be: a profiled window): no utilization, no KV
    cache sizing, no "vLLM fills"; what it needs at most (for a window: what it held there), and each card's outcome."""
    r = results[0]
    bound = least or "at most "  # "at least" for a lower bound, else the most it needs
    needs = f"it needs {bound}{_gib(r.pre_kv_peak_bytes)} {_in(r.pre_kv_peak_phase)} ({PROGRAM_NEEDS})"
    if window:
        needs = f"it held {_gib(r.pre_kv_peak_bytes)} at the window's peak ({PROGRAM_NEEDS}); outside it is not known"
    if moment:  # no phase: it held that much at its one moment (the peak at any other time is not in it)
        needs = f"it held {_gib(r.pre_kv_peak_bytes)} {AT_ONE_MOMENT} ({PROGRAM_NEEDS}); any other moment is not in it"
    verdict = _moment_verdict if moment else lambda x: _verdict(x, False)
    if len(results) == 1:
        return [f"On a {_gib(r.capacity_bytes)} card:", *(_wrapped("  ", x) for x in _answer(r, moment, window, vllm=False)),
                _wrapped("  ", needs)]  # fmt: skip
    rows = [f"  {'capacity':>10}  outcome"] + [f"  {_gib(x.capacity_bytes):>10}  {verdict(x)}" for x in results]
    return [*rows, _wrapped("  ", needs[0].upper() + needs[1:])]


def _one_card(r: Fit, moment: bool, least: str) -> list[str]:
    """The answer of a vLLM start-up on one card: the verdict, how much it lacks, what does not depend on the card."""
    lines = [f"On a {_gib(r.capacity_bytes)} card at --gpu-memory-utilization {r.util:g} (vLLM may fill "
             f"{_gib(r.target_bytes)}):", *(_wrapped("  ", line) for line in _answer(r, moment))]  # fmt: skip
    if r.short_bytes:
        lines.append(_wrapped("  ", short_by(r).removeprefix("; ")))
    if r.prediction:
        lines.append(_wrapped("  ", f"Predicted past the recording: {r.prediction}: {r.prediction_how}"))
    if r.kv_sizing == EXTENSIBLE:
        fixed = (
            "card-independent: what the start-up needs before the KV cache, vLLM's reserves after warm-up "
            "(the transient peak, PyTorch's reserve growth, the margin); the KV cache takes what is left"
        )
    elif r.non_kv_source == PRE_KV_PEAK:
        fixed = f"card-independent: peak {least}{_gib(r.pre_kv_peak_bytes)} {_in(r.pre_kv_peak_phase)} (no KV sizing recorded)"
    else:
        fixed = (
            f"card-independent: vLLM keeps {_gib(r.non_kv_bytes)} out of the KV cache ({r.non_kv_source}); "
            f"pre-KV peak {_gib(r.pre_kv_peak_bytes)} {_in(r.pre_kv_peak_phase)}"
        )
    lines.append(_wrapped("  ", fixed))
    return lines


def _table(results: list[Fit], least: str) -> list[str]:
    """The answers of a vLLM start-up on several cards, a row each."""
    r = results[0]
    lines = [
        f"  {'capacity':>10} {'util':>5} {'vLLM fills':>11} {'non-KV':>10} {'KV cache':>10} {'post-KV peak':>13}  outcome"
    ]
    for x in results:
        kv = _gib(x.kv_cache_bytes) if x.kv_cache_bytes > 0 else "none"
        lines.append(
            f"  {_gib(x.capacity_bytes):>10} {x.util:>5g} {_gib(x.target_bytes):>11} {_gib(x.non_kv_bytes):>10} "
            f"{kv:>10} {_gib(x.post_kv_peak_bytes):>13}  {_verdict(x)}"
        )
    lines.append(f"  pre-KV peak (every card): {least}{_gib(r.pre_kv_peak_bytes)} {_in(r.pre_kv_peak_phase)}")
    predicted = next((x for x in results if x.prediction), None)
    if predicted is not None:
        lines.append(_wrapped("  ", f"(predicted) past the recording: {predicted.prediction}; one card with "
                                    "--capacity for where its figures come from"))  # fmt: skip
    lines.append(f"  non-KV: what vLLM keeps out of the KV cache ({r.non_kv_source})")
    if r.recorded_oom is not None:
        lines.append(f"  {_oom_facts(r)}")
    return lines


def render_fits(
    results: list[Fit],
    run_path: str,
    smallest: int | None,
    bound: PeakBound | None = None,
    *,
    vllm: bool = True,
    smallest_prediction: str = "",
    window: bool = False,
) -> str:
    """The text answer: one paragraph for one capacity, a table for several. ``bound``: how well the input's
    peak is known (``quantities.peak_bound``); one moment is said before the answer, which is for it alone.
    ``vllm``: the trace is a vLLM start-up (``AnalysedRank.vllm``); a program that is not is answered in its own
    terms (no utilization, no KV cache). ``window``: the input is a torch.profiler trace
    (``quantities.PROFILED_WINDOW``), answered for that window alone."""
    lines = [f"memtrace fits: {run_path}"]
    moment = bound is not None and bound.why == ONE_MOMENT
    least = bound.words if bound is not None else ""
    if window:
        lines.append(_wrapped("", f"The input is {PROFILED_WINDOW}. {WINDOW_ANSWER}"))
    elif bound is not None and bound.lower_bound:
        lines.append(_wrapped("", f"The input is {bound.why}. {MOMENT_ANSWER if moment else MISSING_ANSWER}"))
    r = results[0]
    if not vllm:
        lines += _program(results, least, moment, window)
    elif len(results) == 1:
        lines += _one_card(r, moment, least)
    else:
        lines += _table(results, least)
    lines.append(_wrapped("", _assumption(r)))
    if r.others_left_out_bytes:
        lines.append(
            _wrapped(
                "",
                f"Other processes held {_gib(r.others_left_out_bytes)} on the recorded card: left out, each card "
                "above holds this process alone (--keep-others to keep them)",
            )
        )
    what = "that moment" if moment else "that window" if window else ("this start-up" if vllm else "this program")
    at_util = " at that utilization" if vllm else ""
    if smallest is not None and smallest - MIN_CAPACITY <= SEARCH_STEP:  # it fits on the least card tried
        lines.append(f"Smallest card {what} fits on: {_gib(MIN_CAPACITY)} or less (fits tries no smaller card)")
    elif smallest is not None:
        lines.append(
            f"Smallest card {what} fits on{at_util}: about {_gib(smallest)}" + (" (at least)" if moment else "")
        )
        if smallest_prediction:
            said = smallest_prediction in {x.prediction for x in results}
            lines.append(
                _wrapped("  ", f"(predicted past the recording{', as above' if said else ': ' + smallest_prediction})")
            )
    elif r.recorded_oom is not None:
        lines.append("Smallest card: unknown; the recording ends at its OOM, so no card can be promised from it")
    return "\n".join(lines) + "\n"


def render(run, out, *, capacities: list[int], util: float | None = None, non_torch: int | None = None,
           json_out: bool = False) -> None:  # fmt: skip
    """``memtrace fits`` of an analysed run: every rank with allocator events, the worst rank named (the
    run's: ``AnalysedRun.worst``), as text or JSON on the stream ``out``. NothingToJudge when no rank
    recorded an event."""
    import json

    answers = [r.fits(capacities, util, non_torch) for r in run.require_events("predict")]
    multi = len(answers) > 1
    worst = run.worst
    if json_out:
        doc = {
            "format": JSON_FORMAT,
            "version": JSON_VERSION,
            "run": run.path,
            "worst": worst.label if multi else None,
            "time_origin": run.origin.sentence,
            "ranks": [
                {"rank": a.rank.rank, "pid": a.rank.trace.process.pid, "verdict": a.rank.verdict,
                 "peak_bound": dataclasses.asdict(a.rank.peak_bound),
                 "profiled_window": is_profiled_window(a.rank.trace.facts),
                 "smallest_fitting_capacity_bytes": a.smallest, "smallest_fitting_prediction": a.smallest_prediction,
                 "fits": [fit_to_dict(r) for r in a.results]}
                for a in answers
            ],
        }  # fmt: skip
        if not multi:  # one process: the flat shape
            doc.update(doc.pop("ranks")[0])
            for key in ("rank", "pid", "worst", "verdict"):
                doc.pop(key)
        json.dump(doc, out, indent=2)
        out.write("\n")
        return
    for a in answers:
        path = f"{run.path} ({a.rank.label})" if multi else run.path
        out.write(
            render_fits(a.results, path, a.smallest, a.rank.peak_bound, vllm=a.rank.vllm,
                        smallest_prediction=a.smallest_prediction,
                        window=is_profiled_window(a.rank.trace.facts))
        )  # fmt: skip
    if multi:
        need = next((a.smallest for a in answers if a.rank is worst), None)
        why = f"{worst.verdict}" + (f"; needs about {_gib(need)}" if need is not None else "")
        out.write(f"Worst rank: {worst.label} ({why}); every rank must fit for the start-up to survive\n")
