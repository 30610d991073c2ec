"""Issue 28's held-out predictions: every shipped vLLM 0.34.0 start-up of the 8-layer Qwen3-MoE predicted from
OTHER runs, with ``analysis.fits_check`` (shared by tests/unit/test_whatif_heldout.py and
tests/bench/whatif_heldout.py, which prints the table of docs/whatif.md).

Two ways: the one-trace rules (a base run alone, its flags moved to the held-out run's), and a calibration from
two runs that differ in flags, predicting a third. Each held-out run is predicted on its own card as it was
(the small card's holder kept) with its own flags.
"""

from __future__ import annotations

from functools import cache

from memtrace.analysis import fits_check as FC
from memtrace.analysis import whatif as W
from memtrace.analysis.run import analyse
from memtrace.store import load_run
from memtrace.units import format_gib
from vllm034_data import VLLM034, Recorded

GRID = Recorded("vllm-h200-034-grid")
#: (held-out run, base run, calibration runs besides the base; () = the one-trace rules)
CASES = (
    ("g03", "moe-ext", ()),
    ("g07", "moe-ext", ()),
    ("g08", "moe-ext", ()),
    ("small-d16384", "moe-ext", ()),
    ("small-r2048", "moe-ext", ()),
    ("small-d16384", "g07", ()),
    ("small-r2048", "g08", ()),
    ("g03", "g07", ("g08",)),
    ("moe-ext", "g07", ("g08",)),
    ("g08", "g03", ("g07",)),
    ("g07", "g03", ("g08",)),
    ("small-d16384", "g07", ("g08",)),
    ("small-r2048", "g03", ("g07",)),
)
#: The figures the model misses the issue's bar on (2 % or 256 MiB), and the bound they stay within: the
#: warm-up sub-phases' peaks when calibrated from two runs that differ in tokens, seqs and graphs at once.
MISS_BOUND_BYTES = 400 << 20
MISSES = {
    ("g03", "peak compile_or_warm_up/warmup_kernels"),
    ("g03", "peak compile_or_warm_up/capture_model"),
    ("moe-ext", "peak compile_or_warm_up/warmup_kernels"),
    ("moe-ext", "peak compile_or_warm_up/capture_model"),
    ("g07", "peak compile_or_warm_up/warmup_kernels"),
}


@cache
def sites(step: str) -> W.Sites:
    src = VLLM034 if step in ("moe-ext", "moe-noext", "small-ext") else GRID
    return W.sites_of(analyse(load_run(src.run_dir(step)).traces).ranks[0])


def name_of(held_out: str, base: str, more: tuple[str, ...]) -> str:
    return f"{held_out} <- {'+'.join((base, *more))}" if more else f"{held_out} <- {base} (one trace)"


def check(held_out: str, base: str, more: tuple[str, ...]) -> FC.Check:
    cal = W.calibrate([sites(base), *(sites(m) for m in more)]) if more else None
    return FC.check(sites(base), cal, sites(held_out), name_of(held_out, base, more))


# -- the held-out tables (tests/bench/whatif_heldout.py prints them for docs/whatif.md); moved out of
# memtrace.analysis.fits_check, which nothing in the package called (issue 33) -----------------------------


def markdown_table(checks: list[FC.Check]) -> list[str]:
    """One row per held-out run and figure: predicted, measured, error, within the bar."""
    out = ["| run | changes from the base | figure | predicted | measured | error | within 2 % / 256 MiB |"]
    out.append("| --- | --- | --- | --- | --- | --- | --- |")
    for c in checks:
        out.append(
            f"| {c.name} | {' '.join(c.changes) or '-'} | outcome | {c.predicted} | {c.happened} | "
            f"| {'yes' if c.outcome_ok else '**no**'} |"
        )
        for f in c.figures:
            if f.bytes_bar:
                p, m, e = format_gib(f.predicted), format_gib(f.measured), f"{f.error / (1 << 20):+,.0f} MiB"
            else:
                p, m, e = f"{f.predicted:,}", f"{f.measured:,}", f"{f.error:+,}"
            rel = f" ({f.error / f.measured:+.2%})" if f.measured else ""
            out.append(
                f"| {c.name} | {' '.join(c.changes) or '-'} | {f.name} | {p} | {'>= ' if f.lower_bound else ''}{m} | "
                f"{e}{rel} | {'yes' if f.ok else '**no**'} |"
            )
    return out


def summary_table(checks: list[FC.Check]) -> list[str]:
    """One row per held-out run: the outcome, the pre-KV and profile_run peaks, the KV blocks, the worst figure."""

    def cell(c: FC.Check, name: str) -> str:
        f = next((f for f in c.figures if f.name == name), None)
        if f is None:
            return "-"
        if not f.bytes_bar:
            return f"{f.predicted:,} / {f.measured:,} ({f.error:+,})"
        ge = ">= " if f.lower_bound else ""
        return f"{format_gib(f.predicted)} / {ge}{format_gib(f.measured)} ({f.error / (1 << 20):+,.0f} MiB)"

    out = [
        "| held-out run <- from | outcome predicted / happened | pre-KV peak pred / meas | profile_run peak pred / meas "
        "| KV blocks pred / vLLM | figures within the bar | worst figure |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in checks:
        worst = max(c.figures, key=lambda f: abs(f.error) / max(f.bar, 1))
        mark = "" if c.outcome_ok else " **(wrong)**"
        out.append(
            f"| {c.name} | {c.predicted} / {c.happened}{mark} | {cell(c, 'pre-KV peak')} "
            f"| {cell(c, 'peak determine_available_memory/profile_run')} | {cell(c, 'KV blocks')} "
            f"| {sum(f.ok for f in c.figures)} of {len(c.figures)} | {worst.name} {worst.error / (1 << 20):+,.0f} MiB |"
        )
    return out
