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
