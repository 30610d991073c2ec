"""The text (and JSON) rendering of ``memtrace fits --what-if / --suggest`` (``analysis.whatif.Answer``):
per card the outcome, vLLM's KV cache and each phase's predicted peak with what moved it; the flags that
boot, or the floor no flag goes under. Words only: every figure comes from the analysis."""

from __future__ import annotations

import dataclasses

from memtrace.analysis.capacity.whatif import (
    BOOTS,
    DIES,
    GRAPHS,
    GRAPHS_KEPT,
    KV,
    PRIOR,
    REFUSES,
    SCALED,
    UNKNOWN,
    Answer,
    Outcome,
    Suggestions,
)
from memtrace.analysis.memory.quantities import NON_TORCH, OTHERS
from memtrace.plots.fits_text import HEADLINE, short_by
from memtrace.plots.text import wrap
from memtrace.units import format_gib as _gib

WIDTH = 100
#: The phase table's columns, in words.
PHASE_COLUMNS = (
    "recorded: report's device-used peak of the phase (NVML, '-' where not sampled); needed: what the start-up "
    f"needed there as recorded (the segments PyTorch could not release, {NON_TORCH.label} memory, the KV cache); "
    "predicted: the same on this card with these flags"
)

#: The ``fits --what-if/--suggest --json`` document's format and version: 1 is the first one that says it, each
#: outcome's ``phase`` a phase path (``compile_or_warm_up/kv_cache_sizing``) or vLLM's KV check between two phases
#: ("KV sizing (after determine_available_memory)"), as the capacity model's ``fits --json`` says it (version 3)
JSON_FORMAT, JSON_VERSION = "memtrace-whatif", 1


def _flags_line(a: Answer) -> str:
    f = a.recorded
    util = f"{f.util:g}" + (" (vLLM's default)" if f.gpu_memory_utilization is None else "")
    kv = "extensible KV cache" if f.extensible else "profiled KV cache"
    eager = ", --enforce-eager" if f.enforce_eager else ""
    return (
        f"Recorded: vLLM {a.vllm_version or '?'}, --max-num-batched-tokens {f.max_num_batched_tokens} --max-num-seqs "
        f"{f.max_num_seqs} --max-model-len {f.max_model_len} --kv-cache-dtype {f.kv_cache_dtype}{eager}, {kv}, "
        f"util {util}, {f.graphs} CUDA graphs per mode"
    )


def _wrapped(indent: str, text: str) -> list[str]:
    parts = wrap(text, WIDTH - len(indent) - 2)
    return [(indent if i == 0 else indent + "  ") + p for i, p in enumerate(parts)]


def _card(o: Outcome, keep_others: bool) -> str:
    if o.others_bytes:
        whose = f"the recording's {OTHERS}" if keep_others else f"{OTHERS} (--others)"
        return f"On a {_gib(o.capacity_bytes)} card with {whose} holding {_gib(o.others_bytes)} of it:"
    left = (
        f"; the recording's {OTHERS} ({_gib(o.others_left_out_bytes)}) left out, --keep-others to keep them"
        if o.others_left_out_bytes
        else ""
    )
    return f"On a {_gib(o.capacity_bytes)} card (this process alone{left}):"


def _kv(o: Outcome) -> str:
    k = o.kv
    if k is None:
        return "no KV cache recorded"
    return (
        f"KV cache {_gib(k.kv_bytes)}, {k.blocks:,} blocks, {k.tokens:,} tokens = {k.concurrency:.2f} requests "
        f"of max-model-len (vLLM's available {k.available_bytes:,} B)"
    )


def _headline(o: Outcome) -> str:
    head = HEADLINE[o.verdict]
    if o.verdict == BOOTS:
        return f"{head}: {_kv(o)}"
    if o.verdict == DIES:
        return f"{head} in {o.phase} by {_gib(o.by_bytes)} ({o.why}){short_by(o)}"
    if o.verdict == UNKNOWN:
        return f"{head}: {o.why}"
    return f"{head} at {o.phase}: {o.why}{short_by(o)}"


def _moved(p) -> str:
    if p.source == PRIOR:
        return "from a prior (the model's config): never recorded"
    parts = []
    for k, (rec, new) in p.kinds.items():
        if k == KV:
            if rec != new:
                parts.append(f"KV {_gib(rec)} -> {_gib(new)}")
            continue
        if abs(rec - new) < 1 << 20:  # under 1 MiB: not worth a word
            continue
        site = p.sites.get(k) or []
        where = f" ({site[0][0]})" if site else ""
        parts.append(f"{k} {_gib(rec)} -> {_gib(new)}{where}")
    return "; ".join(parts) or "as recorded"


def render_outcome(o: Outcome, keep_others: bool, recorded: bool = True) -> list[str]:
    """One card: the headline, the KV cache's source, the phase table (``recorded`` False: nothing was recorded,
    each phase's predicted peak and where it comes from)."""
    lines = [_card(o, keep_others)]
    lines += _wrapped("  ", _headline(o))
    lines += _wrapped("  ", f"pre-KV peak {_gib(o.pre_kv_peak_bytes)} in {o.pre_kv_peak_phase or 'no phase'}")
    if o.kv is not None:
        lines += _wrapped("    ", f"KV cache from: {o.kv.how}")
    if o.carried:
        lines += _wrapped("  ", f"{o.carried}; the KV cache {_spread(o)}")
    if not recorded:
        lines.append(f"  {'phase':<44} {'predicted':>11}  from")
        lines += [f"  {p.phase:<44} {_gib(p.predicted_bytes):>11}  {p.source}" for p in o.phases]
        return lines
    lines += _wrapped("  ", PHASE_COLUMNS)
    lines.append(f"  {'phase':<44} {'recorded':>11} {'needed':>11} {'predicted':>11}  what moved")
    for p in o.phases:
        rec = _gib(p.recorded_bytes) if p.recorded_bytes is not None else "-"
        lines += _wrapped(
            "  ", f"{p.phase:<44} {rec:>11} {_gib(p.needed_bytes):>11} {_gib(p.predicted_bytes):>11}  {_moved(p)}"
        )
    return lines


def render_suggestions(s: Suggestions) -> list[str]:
    lines = [
        f"Flags that boot on a {_gib(s.capacity_bytes)} card (changes to the flags above, fewest first, "
        f"then clear of the priors' spread, then the most KV cache; {s.tried} tried):"
    ]
    if s.recorded.verdict == BOOTS:
        lines.append(f"  these flags already boot: {_kv(s.recorded)}")
    for i, x in enumerate(s.booting, 1):
        lines += _wrapped("  ", f"{i}. {' '.join(x.changes)}: {_gets(x.outcome)}")
    if not s.booting:
        lines += _wrapped("  ", no_flag_helps(s))
    return lines


def _gets(o: Outcome) -> str:
    if o.verdict == BOOTS and o.carried:
        return f"{_kv(o)}; from priors, {_spread(o)}"
    if o.verdict == BOOTS:
        return _kv(o)
    return f"gets past all the recording covers (pre-KV peak {_gib(o.pre_kv_peak_bytes)}); after it: unknown"


def _spread(o: Outcome) -> str:
    """The priors' spread on the KV cache, in words."""
    if o.spread_bytes is None:
        return "spread not measured (priors of one architecture)"
    return f"±{_gib(o.spread_bytes)}"


def no_flag_helps(s: Suggestions) -> str:
    """The honest negative: the floor no flag goes under."""
    others = s.recorded.others_bytes
    room = f", {_gib(s.capacity_bytes - others)} of it free of {OTHERS}" if others else ""
    f = s.floor_outcome
    if f is not None and s.floor_bytes <= s.capacity_bytes - others and f.verdict != BOOTS:
        how = f"dies in {f.phase} by {_gib(f.by_bytes)}" if f.verdict == DIES else f"vLLM refuses in {f.phase}"
        return (
            f"No flag tried helps ({s.tried} sets of up to four flag changes): with {' '.join(s.floor_flags)} the "
            f"pre-KV peak and one request's KV cache need {_gib(s.floor_bytes)}, under the card's "
            f"{_gib(s.capacity_bytes - others)}, yet {how}: {f.why}"
        )
    return (
        f"No flag helps: weights and workspaces alone need {_gib(s.floor_bytes)} (the pre-KV peak with "
        f"{' '.join(s.floor_flags)}, plus one request's KV cache at max-model-len), the card has {_gib(s.capacity_bytes)}{room}"
    )


def _verdict(o: Outcome) -> str:
    """An outcome in a few words (the per-card line)."""
    if o.verdict == BOOTS:
        return f"boots, KV cache {_kv_short(o)}"
    if o.verdict == DIES:
        return f"dies in {o.phase} by {_gib(o.by_bytes)}{short_by(o)}"
    if o.verdict == REFUSES:
        return f"vLLM refuses at {o.phase}{short_by(o)}"
    return f"unknown: {o.why.split(':', 1)[0]}"


def _kv_short(o: Outcome) -> str:
    k = o.kv
    return f"{_gib(k.kv_bytes)} = {k.concurrency:.2f} requests of max-model-len" if k is not None else "not sized"


def _change(s: Suggestions) -> str:
    """What ``--suggest`` answers on one card, in a few words: the first change, or the floor."""
    if not s.booting:
        if s.floor_outcome is not None and s.floor_bytes <= s.capacity_bytes - s.recorded.others_bytes:
            return f"no flag tried helps ({s.tried} sets of up to four flag changes)"
        return f"no flag helps: the most frugal flags need {_gib(s.floor_bytes)} with one request's KV cache"
    first = s.booting[0]
    flags = " ".join(first.changes)
    if first.outcome.verdict != BOOTS:
        return f"{flags} gets past all the recording covers (after it: unknown)"
    verb = "more KV cache with" if s.recorded.verdict == BOOTS else "boots with"
    return f"{verb} {flags} (KV cache {_kv_short(first.outcome)})"


def render_cards(a: Answer) -> list[str]:
    """One line per card asked: the verdict with these flags and, with ``--suggest``, the first change that boots
    there (or, where these flags boot, the one leaving the most KV cache), else that no flag helps."""
    by_card = {s.capacity_bytes: s for s in a.suggestions}
    lines = ["Per card (the details follow):"]
    for o in a.outcomes:
        s = by_card.get(o.capacity_bytes)
        text = f"{_gib(o.capacity_bytes):>10}: {_verdict(o)}" + (f"; {_change(s)}" if s is not None else "")
        lines += _wrapped("  ", text)
    return lines


def render_answer(a: Answer, run_path: str) -> str:
    """The text answer."""
    what = f" -- what if {' '.join(a.changes)}" if a.changes else " -- the recorded flags"
    lines = [f"memtrace fits: {run_path}{what}", *_wrapped("", _flags_line(a))]
    if a.calibrated_traces:
        lines.append(
            f"Model: {a.calibrated_traces} traces of this model; {a.fitted_lines} (phase, kind) scalings fitted "
            "where a flag differs between them, the rest by the one-trace rules (an estimate)"
        )
    else:
        lines.append("Model: one trace, a documented rule per kind of site (an estimate)")
    for k in SCALED:
        sc = a.scales.get(k)
        if sc is not None and (sc.factor != 1.0 or k in (GRAPHS, GRAPHS_KEPT) and a.flags.graphs != a.recorded.graphs):
            lines += _wrapped("  ", f"{k}: x {sc.factor:.3f}, {sc.rule}")
    lines += [x for n in a.notes for x in _wrapped("  ", f"note: {n}")]
    if len(a.outcomes) > 1:
        lines += render_cards(a)
    for o in a.outcomes:
        lines += render_outcome(o, a.keep_others)
    for s in a.suggestions:
        lines += render_suggestions(s)
    return "\n".join(lines) + "\n"


def answer_to_dict(a: Answer) -> dict:
    """A JSON-ready dict of ``a`` (exact integers)."""
    d = dataclasses.asdict(a)
    d["recorded"]["util"], d["flags"]["util"] = a.recorded.util, a.flags.util
    d["recorded"]["graphs"], d["flags"]["graphs"] = a.recorded.graphs, a.flags.graphs
    for o in d["outcomes"]:
        for p in o["phases"]:
            p["kinds"] = {k: {"recorded_bytes": v[0], "predicted_bytes": v[1]} for k, v in p["kinds"].items()}
            p["sites"] = {k: [{"site": s, "bytes": b} for s, b in v] for k, v in p["sites"].items()}
    for s in d["suggestions"]:
        for x in [s["recorded"], *(b["outcome"] for b in s["booting"]), s["floor_outcome"]]:
            if x is not None:
                x.pop("phases")
    return d


def render(run, out, *, answers: list[tuple], json_out: bool = False) -> None:
    """``answers``: (rank, ``Answer``) per rank with events, as ``analysis.whatif.answer`` built them."""
    import json

    multi = len(answers) > 1
    if json_out:
        docs = [{"rank": r.rank, **answer_to_dict(a)} for r, a in answers]
        doc = {"format": JSON_FORMAT, "version": JSON_VERSION, "run": run.path, "what_if": docs if multi else docs[0]}
        json.dump(doc, out, indent=2)
        out.write("\n")
        return
    for r, a in answers:
        out.write(render_answer(a, f"{run.path} ({r.label})" if multi else run.path))


def render_before_run(out, config: str, flags, weights, outcome: Outcome, booting: list, library,
                      json_out: bool = False) -> None:  # fmt: skip
    """``memtrace fits --config``: the answer with nothing recorded (``analysis.capacity.before_run``)."""
    import dataclasses
    import json

    from memtrace.analysis.capacity.priors import COMPONENTS

    if json_out:
        doc = {"config": config, "flags": dataclasses.asdict(flags), "weights": dataclasses.asdict(weights),
               "priors": {"vllm": library.vllm, "architectures": library.architectures,
                          "components": {k: {"what": w, "feature": f} for k, (w, f) in COMPONENTS.items()}},
               "outcome": dataclasses.asdict(outcome),
               "suggestions": [{"changes": b.changes, "outcome": dataclasses.asdict(b.outcome)} for b in booting]}  # fmt: skip
        json.dump(doc, out, indent=2)
        out.write("\n")
        return
    f = flags
    lines = [f"memtrace fits --config {config} -- before any run (nothing recorded: every figure but the weights "
             f"is a prior fitted on {len(library.observed)} real vLLM {library.vllm} start-ups of "
             f"{', '.join(library.architectures)})"]  # fmt: skip
    lines += _wrapped("", f"Flags: vLLM {library.vllm}'s defaults for `vllm serve` on this card and --what-if: "
                          f"--max-num-batched-tokens {f.max_num_batched_tokens} --max-num-seqs {f.max_num_seqs} "
                          f"--max-model-len {f.max_model_len} --kv-cache-dtype {f.kv_cache_dtype}"
                          f"{', --enforce-eager' if f.enforce_eager else ''}, "
                          f"{'extensible' if f.extensible else 'profiled'} KV cache, util {f.util:g}")  # fmt: skip
    lines += _wrapped("", f"Weights: {_gib(weights.bytes)} from {weights.source}")
    lines += render_outcome(outcome, False, recorded=False)
    if booting or outcome.verdict != BOOTS:
        lines.append(f"Flags that boot on a {_gib(outcome.capacity_bytes)} card (fewest changes first, then clear of "
                     "the priors' spread, then the most KV cache):")  # fmt: skip
        lines += [
            x
            for i, b in enumerate(booting, 1)
            for x in _wrapped("  ", f"{i}. {' '.join(b.changes)}: {_gets(b.outcome)}")
        ]
        if not booting:
            lines.append("  none of the changes of up to three flags tried")
    out.write("\n".join(lines) + "\n")


def boot_section(run, *, markdown: bool = True) -> list[str]:
    """The issue bundle's "What would make it boot" section (Markdown lines; [] where ``analysis.boot``'s
    ``recorded_card_answer`` has none): ``--suggest`` on the card the worst rank was recorded on, as it was
    (other processes kept), in the words of ``memtrace fits``."""
    from memtrace.analysis.capacity.boot import recorded_card_answer

    a = recorded_card_answer(run)
    if a is None:
        return []
    card = a.outcomes[0].capacity_bytes
    s, o = a.suggestions[0], a.outcomes[0]
    lines = ["## What would make it boot", ""]
    lines.append(f"On the recorded card ({_gib(card)}), with the recorded flags: {_headline(o)}.")
    if a.notes:
        lines += ["", *(f"_Note: {n}._" for n in a.notes)]
    lines += ["", f"Changes to the recorded flags that boot there (memtrace fits RUN --capacity {card}B --suggest --keep-others):", ""]  # fmt: skip
    if s.booting:
        lines += [f"{i}. `{' '.join(x.changes)}`: {_gets(x.outcome)}" for i, x in enumerate(s.booting, 1)]
    else:
        lines.append(f"- {no_flag_helps(s)}")
    estimate = "fitted" if a.calibrated_traces else "one trace: documented rules per kind of site, an estimate"
    lines = [*lines, "", f"_Model: {estimate} (docs/whatif.md)._", ""]
    if markdown:
        return lines
    plain = [x.removeprefix("## ").replace("`", "").strip("_") for x in lines]
    return [y for x in plain for y in (wrap(x, WIDTH) if x else [""])]
