"""Issue 28's held-out predictions: every shipped vLLM 0.34.0 start-up of the 8-layer Qwen3-MoE predicted from
OTHER runs, with ``fits_check`` (tests/fits_check.py) (shared by tests/unit/test_whatif_heldout.py and
tests/bench/whatif_heldout.py, which prints the table of docs/whatif.md).

Two ways: the one-trace rules (a base run alone, its flags moved to the held-out run's), and a calibration from
two runs that differ in flags, predicting a third. Each held-out run is predicted on its own card as it was
(the small card's holder kept) with its own flags.
"""

from __future__ import annotations

import subprocess
import tempfile
from functools import cache
from pathlib import Path

import fits_check as FC
from memtrace.analysis.analysed.run import analyse
from memtrace.analysis.capacity import whatif as W
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
    # the second lease (2026-12-05): the rescue --suggest named, a second rescue, the death, two eager grid points
    ("small-rescue-u0835", "g08", ()),
    ("small-rescue-u0835", "small-r2048", ()),
    ("small-rescue-p2048", "g07", ()),
    ("small-rescue-p2048", "g08", ()),
    ("small-rescue-p2048", "moe-noext", ("g07", "g08")),
    ("small-die-p16384", "g07", ()),
    ("small-die-p16384", "small-d16384", ()),
    ("g8192-s64-eager", "moe-ext", ()),
    ("g8192-s64-eager", "g07", ("g08",)),
    ("g4096-s8-eager", "moe-ext", ()),
    ("g4096-s8-eager", "g07", ("g08",)),
    ("g4096-s8-eager", "g08", ("g8192-s64-eager",)),
    ("g08", "g4096-s8-eager", ("g8192-s64-eager",)),
)
#: The figures the model misses the issue's bar on (2 % or 256 MiB; KV blocks 2 %), and the bound each stays within
#: (bytes, or a fraction for KV blocks): (held-out run, base run, figure) -> bound.
#: - g07's capture_model (51 graphs up to 512 tokens) from runs that captured 5 graphs up to 16: what capture
#:   allocates and frees grows faster than the graph count (-339 MiB).
#: - small-rescue-p2048's KV cache is 0.33 GiB: 2 % of it is 7 MiB; the available bytes are within 14-22 MiB.
MISSES = {
    ("g07", "moe-ext", "peak compile_or_warm_up/capture_model"): 400 << 20,
    ("g07", "g03", "peak compile_or_warm_up/capture_model"): 400 << 20,
    ("small-rescue-p2048", "g07", "KV blocks"): 0.03,
    ("small-rescue-p2048", "g08", "KV blocks"): 0.07,
}
#: Outcomes the model gets wrong, with what it said: small-rescue-p2048 (256 seqs) from g08 (8 seqs) alone: at 256
#: requests the sampler takes FlashInfer's top-k/top-p kernels (three 148 MiB buffers) where at 8 it took Triton's
#: (one 4.6 MiB buffer), which one trace cannot know; calibrated with a 256-seq run it boots, as it did.
WRONG_OUTCOMES = {("small-rescue-p2048", "g08"): "dies in compile_or_warm_up by 0.01 GiB"}


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
# memtrace.analysis.capacity.fits_check, which nothing in the package called (issue 33) -----------------------------


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


# -- the next lease's start-ups (docs/whatif.md, "What the next lease records"): parsed by the script's own
# grid_runs, predicted now, so the lease that records them compares with what was written down before -----

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "gpu" / "vllm034" / "startups.sh"
CARD_BYTES = 150_109_880_320  # the H200's total (cudaMemGetInfo)
#: the bases each new start-up is predicted from: one trace, and calibrations (the base first)
SMALL_BASES = (("g08", ()), ("g07", ()), ("moe-noext", ("g07", "g08")))
GRID_BASES = (("moe-ext", ()), ("g07", ("g08",)), ("g03", ("g07", "g08")))


def _script_part(start: str, end: str) -> str:
    text = SCRIPT.read_text()
    i = text.index(start)
    return text[i : text.index(end, i)]


def recipe_runs(commands: str) -> list[tuple[str, str, list[str], int | None]]:
    """(folder, model, flags, SMALL_FREE or None) of every start-up ``commands`` (the docs' block) has
    ``tests/gpu/vllm034/startups.sh`` record, in its order: the script's own ``grid_runs`` and small/grid order
    run in bash with ``traced`` printing what it would start."""
    stub = "\n".join(
        [
            "left() { echo 9999; }",
            "log() { :; }",
            'want() { [[ ",$STEPS," == *",$1,"* ]]; }',
            'traced() { printf \'%s\\t%s\\t%s\' "$1" "${2#/tmp/model-}" "${SMALL_FREE_NOW:-}"; shift 2; '
            "printf '\\t%s' \"$@\"; printf '\\n'; }",
            'small_runs() { SMALL_FREE_NOW=${SMALL_FREE:-?}; grid_runs "${SMALL:-}" small-; SMALL_FREE_NOW=; }',
            _script_part("grid_runs() {", "\npre_kv_peak()"),
            _script_part('if [ -n "${SMALL_FROM:-}" ]; then', "\n# ---- cost"),
        ]
    )
    with tempfile.TemporaryDirectory() as d:
        stub_path = Path(d) / "startups-parse.sh"
        stub_path.write_text(stub)
        script = commands.replace("bash tests/gpu/vllm034/startups.sh", f"bash {stub_path}")
        out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    runs = []
    for line in out.splitlines():
        name, model, free, *flags = line.split("\t")
        runs.append((name, model, flags, int(free) if free else None))
    return runs


def common_flags() -> list[str]:
    """The flags every start-up of the script gets first (its ``COMMON`` array)."""
    part = _script_part("COMMON=(", "\nNEXT_PORT=")
    out = subprocess.run(["bash", "-c", part + '\nprintf "%s\\n" "${COMMON[@]}"'], capture_output=True, text=True)
    return out.stdout.split()


def cli_flags(base: W.Flags, argv: list[str]) -> W.Flags:
    """``base`` with vLLM command-line flags applied (the what-if's words for them; a flag the model does not
    know raises UsageError)."""
    items, i = [], 0
    while i < len(argv):
        name = argv[i].removeprefix("--")
        takes_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
        items.append(f"{name}={argv[i + 1]}" if takes_value else name)
        i += 2 if takes_value else 1
    return W.apply_what_if(base, items)


def script_flags() -> W.Flags:
    """The memory flags every start-up of the script runs with (its ``COMMON``, vLLM's defaults otherwise), as
    the what-if reads them: moe-ext's recorded flags with COMMON's applied."""
    common, keep = common_flags(), ("--max-model-len", "--max-num-batched-tokens", "--max-num-seqs", "--kv-cache-dtype")
    return cli_flags(sites("moe-ext").flags, [x for j, a in enumerate(common) if a in keep for x in (a, common[j + 1])])


def recipe_predictions(commands: str) -> list[str]:
    """One Markdown row per start-up of ``commands``: its folder, card and flags, and the outcome predicted now
    from each base (small card: SMALL_BASES, whole card: GRID_BASES), with vLLM's KV figures where it boots."""
    base = script_flags()
    rows = []
    for name, _model, argv, free in recipe_runs(commands):
        flags = cli_flags(base, argv)
        others = CARD_BYTES - free if free else 0
        cells = []
        for b, more in SMALL_BASES if free else GRID_BASES:
            cal = W.calibrate([sites(b), *(sites(m) for m in more)]) if more else None
            o = W.WhatIf(sites(b), flags, cal).on(CARD_BYTES, others_bytes=others)
            kv = f": {o.kv.blocks:,} blocks, {o.kv.available_bytes:,} B" if o.verdict == W.BOOTS else ""
            cells.append(f"{FC.outcome_words(o)}{kv}")
        card = f"{free:,} B free" if free else "whole H200"
        rows.append(f"| `{name}` | {card} | {' '.join(flags.changes(base)) or '-'} | " + " | ".join(cells) + " |")
    return rows
