"""The text and JSON renderings of ``memtrace diff`` (analysis.diff's TraceDiff list): the headline
first (available KV, memory before KV sizing), then what went over, per phase, per category, per site."""

from __future__ import annotations

from typing import Any

from memtrace.analysis.gate.diff import KV_CACHE, VIA_VMM, compared, nested_order
from memtrace.analysis.memory import quantities as Q
from memtrace.analysis.memory.quantities import ONE_MOMENT
from memtrace.plots import oom_text
from memtrace.plots.text import wrap
from memtrace.units import GiB, format_bytes
from memtrace.units import format_gib as _gib

#: Fingerprint differences listed one per line; the rest are named on one line.
SHOW_MISMATCHES = 8


def _delta(n: int | None) -> str:
    if n is None:
        return "—"
    if n == 0:
        return "0"
    return ("+" if n > 0 else "-") + _size(abs(n))


def _size(n: int) -> str:
    return _gib(n) if n >= GiB else format_bytes(n)


def _pct(base: int | None, delta: int | None) -> str:
    if base in (None, 0) or delta is None:
        return ""
    return f"({delta / base * 100:+.1f}%)"


def _one_frame(f) -> str:
    short = "/".join(f.filename.split("/")[-2:])
    return f"{f.name} ({short}:{f.line})"


def _frame_label(f) -> str:
    if f is None:
        return "(no stack recorded)"
    short = "/".join(f.filename.split("/")[-2:])
    return f"{f.name} ({short}:{f.line})"


def render_diff(diffs: list, base_path: str, new_path: str, *, title: str = "memtrace diff") -> str:
    """The text report of a list of TraceDiffs."""
    out: list[str] = [f"{title}: {base_path} → {new_path}"]
    for d in diffs:
        out += _render_one(d, multi=len(diffs) > 1)
    failed = [d for d in diffs if d.failed]
    out.append("")
    if failed:
        if any(d.new_empty for d in failed):
            out.append("FAIL: the new run recorded no PyTorch memory, so nothing can pass the gate (exit 1)")
        n = sum(len(d.regressions) + (d.new_oom is not None) for d in failed)
        if n:
            out.append(f"FAIL: {n} figure(s) grew more than {diffs[0].threshold} (exit 1)")
    else:
        thr = diffs[0].threshold if diffs else "the threshold"
        out.append(f"OK: nothing grew more than {thr}")
    if any(d.setup_changes for d in diffs):
        out.append("(the runs are not comparable: see the WARNING above)")
    return "\n".join(out) + "\n"


def _render_one(d, multi: bool) -> list[str]:
    out = [""]
    if multi:
        out.append(f"== {d.label} ==")
    res = Q.RESERVED.label
    level = f"{res} + {Q.NON_TORCH.label} memory" if d.device_level else f"{res} only (no NVML in both)"
    if d.ranked == Q.ALLOCATED.key:  # the CPU's traces: nothing reserved, no NVML
        level = f"{Q.ALLOCATED.label} ({Q.MEMORY_OF_ROLE['host']}: nothing reserved, no NVML)"
    if VIA_VMM in d.kv_via:
        level = level.replace(res, f"{res} + the {Q.VMM.label}", 1)
    if d.setup_changes:
        out.append("WARNING: the two runs are not comparable; they differ in:")
        out += [f"  {name}: {_field(name, b)} → {_field(name, n)}" for name, b, n in d.setup_changes[:SHOW_MISMATCHES]]
        rest = [name for name, _, _ in d.setup_changes[SHOW_MISMATCHES:]]
        if rest:
            out.append(f"  and {len(rest)} more: {', '.join(rest)}")
        out.append("")
    if d.version_changes:
        shown = ", ".join(f"{name} {b} → {n}" for name, b, n in d.version_changes)
        out += [f"Versions compared: {shown}", ""]
    if d.default_changes:
        out.append("What the new versions changed by themselves (left to vLLM in the new run):")
        out += [f"  {name}: {b} → {n}" for name, b, n in d.default_changes]
        out.append("")
    if d.kv_via[0] and d.kv_via[1] and d.kv_via[0] != d.kv_via[1]:
        kv = {c.label: c for c in d.headline}.get(KV_CACHE)
        size = f" ({_gib(kv.base)} → {_gib(kv.new)})" if kv is not None and kv.base and kv.new else ""
        out += [f"The KV cache moved: allocated through {d.kv_via[0]} → {d.kv_via[1]}{size}", ""]
    if d.one_moment:
        out += [*_moment_lines(d.one_moment), ""]
    if d.environment_unknown:
        out += ["note: a run recorded no environment (GPU, versions, model, flags): comparability not checked", ""]
    out.append(f"Headline — {level}:")
    for c in d.headline:
        if c.base is None and c.new is None:
            continue
        mark = "  << over " + d.threshold if c.over else ""
        where = f"  [{c.phase}]" if c.phase else ""
        mark += f"  ({c.note})" if c.note else ""
        out.append(
            f"  {c.label:<28} {_gib(c.base):>11} → {_gib(c.new):>11}   {_delta(c.delta):>12} {_pct(c.base, c.delta)}{where}{mark}"
        )
    if d.new_oom is not None:
        out.append(f"  {oom_line(d.new_oom)}; the base run did not")
    if d.new_empty:
        out.append("  the new run recorded no PyTorch memory (it stopped before allocating, or recorded nothing)")
    regs = d.regressions
    if regs:
        out.append("")
        out.append(f"Over the threshold ({d.threshold}):")
        for c in regs:
            kind = "phase " if c in [p.peak for p in d.phases] else "hooked " if c in d.hook_totals else ""
            label = _hook_label(c.label) if kind == "hooked " else c.label
            out.append(
                f"  {kind}{label}: {_gib(c.base)} → {_gib(c.new)} ({_delta(c.delta)}, allowed {_delta(c.limit)})"
            )
    out += _render_phases(d, level)
    if d.categories:
        rows = [c for c in d.categories if c.delta]
        out.append("")
        out.append("By category, at the peak each run held (allocated, and the KV cache outside PyTorch):")
        if not rows:
            out.append("  no change")
        for c in rows:
            out.append(f"  {c.label:<24} {_gib(c.base):>11} → {_gib(c.new):>11}   {_delta(c.delta):>12}")
    if d.categories is not None or d.sites or d.sites_missing:  # history check has figures, not traces
        out += _render_sites(d)
    out += _render_hooks(d)
    return out


_NO_STACKS = {
    "base": "the base run recorded no Python stacks",
    "new": "the new run recorded no Python stacks",
    "both": "neither run recorded Python stacks",
}


def _moment_lines(sides: str) -> list[str]:
    """What a diff with an input of one moment (``TraceDiff.one_moment``) compares, before any figure."""
    which = {"both": "Both inputs are", "base": "The base input is", "new": "The new input is"}[sides]
    what = (
        "two states, each run's at the moment its snapshot was taken"
        if sides == "both"
        else "that moment's state with the other run's peak"
    )
    its = "Their" if sides == "both" else "Its"
    text = f'{which} {ONE_MOMENT}. {its} "peak" figures below are that moment\'s (the peak was at least that), so this diff compares {what}, not two peaks'
    return wrap(text, 98)


def _render_sites(d) -> list[str]:
    out = ["", "By allocating stack (matched by function and file, not line), at each run's peak:"]
    if d.sites_missing:
        out.append(f"  not compared: {_NO_STACKS[d.sites_missing]} (MEMTRACE_STACKS=python records them)")
        return out
    if not d.sites:
        out.append("  no change")
    for s in d.sites:
        tag = "new " if s.is_new else "gone" if s.vanished else ("grew" if s.delta > 0 else "less")
        out.append(
            f"  {tag} {_delta(s.delta):>12}  {_gib(s.base_bytes):>11} → {_gib(s.new_bytes):>11}  {_frame_label(s.shown)}"
            + (f"  via {_one_frame(s.apart)}" if s.apart is not None else "")
        )
    return out


def _render_hooks(d) -> list[str]:
    from memtrace.analysis.holders.flame import hook_short_name

    out: list[str] = []
    hooks = [h for h in d.hooks if h.base_bytes_per_call != h.new_bytes_per_call]
    if d.hooks:
        out.append("")
        out.append("FlashInfer workspace (hooked calls): calls, bytes per call")
        for h in d.hooks:
            same = "" if h in hooks else "  (unchanged)"
            short = hook_short_name(h.name)
            out.append(
                f"  {short}: {h.base_calls} → {h.new_calls} calls; {_per_call(h.base_bytes_per_call)} → "
                f"{_per_call(h.new_bytes_per_call)} per call; total {_delta(h.new_total - h.base_total)}{same}"
            )
        for c in d.hook_totals:
            mark = "  << over " + d.threshold if c.over else ""
            name = _hook_label(c.label)
            out.append(f"  total {name}: {_gib(c.base)} → {_gib(c.new)} ({_delta(c.delta)}){mark}")
        depth = dict(nested_order({c.label for c in d.nested_hooks}, d.nested_in))
        for c in d.nested_hooks:  # each is part of its caller's bytes, never added to its siblings' callers
            caller = d.nested_in.get(c.label)
            where = f"inside {_hook_label(caller)}" if caller else "inside"
            pad = "  " * (1 + depth.get(c.label, 1))
            out.append(f"{pad}{where}: {_hook_label(c.label)}: {_gib(c.base)} → {_gib(c.new)} ({_delta(c.delta or 0)})")
    return out


def _hook_label(name: str) -> str:
    from memtrace.analysis.gate.diff import ALL_HOOKS
    from memtrace.analysis.holders.flame import hook_short_name

    return name if name == ALL_HOOKS else hook_short_name(name)


def _field(name: str, value: str) -> str:
    """A fingerprint field as shown: byte counts in GiB, everything else as recorded."""
    return _gib(int(value)) if name.endswith("_bytes") and value.isdigit() else value


def oom_line(oom) -> str:
    """``the new run died of CUDA OOM in PHASE: requested X, device free Y`` (analysis.oom.Oom)."""
    return f"the new run died of CUDA OOM {oom_text.where(oom)}: {oom_text.details(oom)}"


def _per_call(sizes: tuple[int, ...]) -> str:
    if not sizes:
        return "—"
    distinct = sorted(set(sizes))
    if len(distinct) == 1:
        return _size(distinct[0])
    return f"{_size(min(sizes))}..{_size(max(sizes))}"


def _render_phases(d, level: str) -> list[str]:
    """The per-phase table; ``level``: what its peaks add up (the headline's words: the same curve)."""
    less = ", less the KV cache: it moved, and the runs make it in other phases" if d.phases_less_kv else ""
    out = ["", f"Per phase (peak of {level}{less}):"]
    if not d.phases and not d.base_only_phases and not d.new_only_phases:
        return out + ["  neither run recorded phases: the global peaks above are what is gated"]
    width = max([len("  " * p.depth + p.path.rsplit("/", 1)[-1]) for p in d.phases] + [5])
    out.append(f"  {'phase':<{width}} {'base':>11} {'new':>11} {'Δ peak':>12} {'Δ inside':>12}")
    for p in d.phases:
        name = "  " * p.depth + p.path.rsplit("/", 1)[-1]
        mark = "  << over" if p.peak.over else ""
        inside = p.inside_delta
        here = ""
        if inside and abs(inside) >= 2 * 1024**2:
            here = "  (grew inside)" if inside > 0 else "  (less inside)"
        out.append(
            f"  {name:<{width}} {_gib(p.peak.base):>11} {_gib(p.peak.new):>11} {_delta(p.peak.delta):>12} {_delta(inside):>12}{mark}{here}"
        )
    for path in d.base_only_phases:
        out.append(f"  {path}: only in the base run")
    for path in d.new_only_phases:
        out.append(f"  {path}: only in the new run")
    return out


def _oom_json(oom) -> dict[str, Any] | None:
    if oom is None:
        return None
    return {"phase": oom.phase_path, "time_us": oom.time_us, "requested_bytes": oom.requested_bytes,
            "free_bytes": oom.free_bytes, "total_bytes": oom.total_bytes, "source": oom.source}  # fmt: skip


def diff_to_json(diffs: list, base_path: str, new_path: str) -> dict[str, Any]:
    """A JSON-compatible dict of the comparison (bytes as integers)."""

    def change(c) -> dict[str, Any]:
        return {"label": c.label, "base_bytes": c.base, "new_bytes": c.new, "delta_bytes": c.delta,
                "limit_bytes": c.limit, "over": c.over, "phase": c.phase, "note": c.note}  # fmt: skip

    return {
        "base": base_path,
        "new": new_path,
        "failed": any(d.failed for d in diffs),
        "comparable": all(d.comparable for d in diffs),
        "traces": [
            {
                "label": d.label,
                "device_level": d.device_level,
                "threshold": d.threshold,
                "failed": d.failed,
                "comparable": d.comparable,
                "mismatches": [{"field": k, "base": b, "new": n} for k, b, n in d.mismatches],
                "environment_unknown": d.environment_unknown,
                "one_moment": d.one_moment,
                "new_oom": _oom_json(d.new_oom),
                "new_empty": d.new_empty,
                "headline": [change(c) for c in d.headline],
                "regressions": [change(c) for c in d.regressions],
                "phases": [
                    {
                        **change(p.peak),
                        "path": p.path,
                        "inside_base_bytes": p.inside_base,
                        "inside_new_bytes": p.inside_new,
                    }  # fmt: skip
                    for p in d.phases
                ],
                "hook_totals": [change(c) for c in d.hook_totals],
                "nested_hooks": [change(c) for c in d.nested_hooks],
                "base_only_phases": d.base_only_phases,
                "new_only_phases": d.new_only_phases,
                "categories": [change(c) for c in d.categories] if d.categories is not None else None,
                "sites": [
                    {
                        "frames": [[f.filename, f.line, f.name] for f in s.frames],
                        "base_bytes": s.base_bytes,
                        "new_bytes": s.new_bytes,
                        "delta_bytes": s.delta,
                        "new": s.is_new,
                        "vanished": s.vanished,
                        "apart": [s.apart.filename, s.apart.line, s.apart.name] if s.apart else None,
                    }  # fmt: skip
                    for s in d.sites
                ],
                "sites_without_stacks": d.sites_missing or None,
                "hooks": [
                    {
                        "name": h.name,
                        "base_calls": h.base_calls,
                        "new_calls": h.new_calls,
                        "base_bytes_per_call": list(h.base_bytes_per_call),
                        "new_bytes_per_call": list(h.new_bytes_per_call),
                    }  # fmt: skip
                    for h in d.hooks
                ],
            }
            for d in diffs
        ],
    }


def render(run, out, *, base, threshold, json_out: bool = False) -> None:
    """``memtrace diff BASE NEW``: ``run`` is the new analysed run, ``base`` the reference one; the
    comparison is ``analysis.diff.diff_runs`` (NothingToJudge when either side recorded nothing)."""
    import json

    diffs = compared(base, run, threshold)
    if json_out:
        json.dump(diff_to_json(diffs, base.path, run.path), out, indent=2)
        out.write("\n")
    else:
        out.write(render_diff(diffs, base.path, run.path))
