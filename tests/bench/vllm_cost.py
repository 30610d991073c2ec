"""The plugin's cost on vLLM's start-up, measured the same way every release: one command per step.

    python tests/bench/vllm_cost.py figure RUN_DIR             # one run's self-reported cost (tsv fields)
    python tests/bench/vllm_cost.py analyse runs.tsv [...]     # the pairs, analysed

``figure`` prints what the trace in RUN_DIR says memtrace cost (``memtrace.analysis.analysed.self_cost``), as
tab-separated fields ``self_ms self_pct history_ms self_sources`` (``-`` when not recorded):
``tests/gpu/vllm034/startups.sh``'s ``cost`` step writes them into its ``runs.tsv`` beside vLLM's own
"init engine" figure.

``analyse`` reads one or more ``runs.tsv`` files of that step (columns ``run``, ``plugin`` on/off,
``init_engine_s``, and for runs with the plugin ``self_ms``), pairs the runs of each round (``roundN-on``
with ``roundN-off``), leaves out rounds named with ``--skip`` (the cold first round), and prints: the
medians with and without, the per-pair ratios (median, geometric mean, range, how many on-runs were
slower), a bootstrap 95 % interval of the geometric mean ratio (10,000 resamples of the pairs, seed 0),
the Wilcoxon signed-rank test of the differences (exact two-sided p for up to 20 pairs), the median
difference in ms with its bootstrap 95 % interval (the same resamples), and the self-reported cost (median, as a share of the median init engine) next to the
pairs' interval: whether the two agree within the pairs' uncertainty.

Pure Python + numpy; runs wherever the tsv files are (no GPU, no vLLM).
"""

from __future__ import annotations

import argparse
import csv
import itertools
import math
import re
import sys
from pathlib import Path

import numpy as np

BOOTSTRAP = 10_000


def figure(run_dir: str) -> str:
    """The tsv fields of one traced run's self-reported cost."""
    from memtrace.analysis.analysed.self_cost import self_cost
    from memtrace.plots import cost_text
    from memtrace.store import load_run

    try:
        run = load_run(run_dir)
    except Exception as exc:  # noqa: BLE001 - a run without a trace is a "-" row, said why on stderr
        print(f"vllm_cost: {run_dir}: {exc}", file=sys.stderr)
        return "\t".join("-" * 4)
    costs = [self_cost(t) for t in run.traces]
    cost = max(costs, key=lambda c: c.total_ns) if costs else None
    if cost is None or not cost.recorded:
        return "\t".join("-" * 4)
    share = cost.share_of_init_engine
    history = "-" if cost.history_ns is None else f"{cost.history_ns / 1e6:.1f}"
    sources = cost_text.sources(cost, top=20).removeprefix("by source (calls): ")
    return "\t".join([f"{cost.total_ns / 1e6:.1f}", "-" if share is None else f"{share * 100:.3f}", history, sources])


def _rows(paths: list[str]) -> list[dict[str, str]]:
    rows = []
    for p in paths:
        with open(p, newline="") as f:
            rows += list(csv.DictReader(f, delimiter="\t"))
    return rows


def pairs(rows: list[dict[str, str]], skip: set[str]) -> list[tuple[str, float, float, float | None]]:
    """(round, on_s, off_s, self_ms) for every round with both runs' init engine."""
    by_round: dict[str, dict[str, dict[str, str]]] = {}
    for r in rows:
        m = re.match(r"(.+)-(on|off)$", r["run"])
        if m and m.group(1) not in skip:
            by_round.setdefault(m.group(1), {})[m.group(2)] = r
    out = []
    for name, runs in by_round.items():
        try:
            on, off = float(runs["on"]["init_engine_s"]), float(runs["off"]["init_engine_s"])
        except (KeyError, ValueError):
            continue
        self_ms = runs["on"].get("self_ms")
        out.append((name, on, off, float(self_ms) if self_ms not in (None, "", "-") else None))
    return out


def wilcoxon_p(diffs: list[float]) -> float:
    """Two-sided p of the Wilcoxon signed-rank test (exact for n <= 20, else the normal approximation)."""
    d = [x for x in diffs if x != 0]
    n = len(d)
    if n == 0:
        return 1.0
    order = sorted(range(n), key=lambda i: abs(d[i]))
    ranks = [0.0] * n
    i = 0
    while i < n:  # average ranks over ties
        j = i
        while j + 1 < n and abs(d[order[j + 1]]) == abs(d[order[i]]):
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    w = sum(r for r, x in zip(ranks, d, strict=True) if x > 0)
    mean = n * (n + 1) / 4
    if n <= 20:
        count = total = 0
        for signs in itertools.product((0, 1), repeat=n):
            total += 1
            s = sum(r for r, on in zip(ranks, signs, strict=True) if on)
            if abs(s - mean) >= abs(w - mean) - 1e-9:
                count += 1
        return count / total
    sd = math.sqrt(n * (n + 1) * (2 * n + 1) / 24)
    z = (abs(w - mean) - 0.5) / sd
    return math.erfc(z / math.sqrt(2))


def analyse(found: list[tuple[str, float, float, float | None]]) -> list[str]:
    """The report's lines."""
    if len(found) < 2:
        return [f"{len(found)} complete pair(s): at least 2 are needed"]
    on = np.array([p[1] for p in found])
    off = np.array([p[2] for p in found])
    ratio = on / off
    geo = float(np.exp(np.log(ratio).mean()))
    rng = np.random.default_rng(0)
    idx = rng.integers(0, len(ratio), size=(BOOTSTRAP, len(ratio)))
    boot = np.exp(np.log(ratio)[idx].mean(axis=1))
    lo, hi = (float(x) for x in np.percentile(boot, [2.5, 97.5]))
    diff_ms = (on - off) * 1000
    boot_diff = np.median(diff_ms[idx], axis=1)
    dlo, dhi = (float(x) for x in np.percentile(boot_diff, [2.5, 97.5]))
    lines = [
        f"pairs: {len(found)} ({', '.join(p[0] for p in found)})",
        f"init engine median: {np.median(on):.2f} s with the plugin, {np.median(off):.2f} s without "
        f"(without: {off.min():.2f}-{off.max():.2f} s)",
        f"per-pair ratio on/off: median {np.median(ratio):.3f}, geometric mean {geo:.3f}, "
        f"95 % bootstrap interval {lo:.3f}-{hi:.3f}, range {ratio.min():.3f}-{ratio.max():.3f}; "
        f"on slower in {int((ratio > 1).sum())} of {len(ratio)}",
        f"median difference on-off: {np.median(diff_ms):+.0f} ms, 95 % bootstrap interval {dlo:+.0f} to {dhi:+.0f} ms; "
        f"Wilcoxon signed-rank p = {wilcoxon_p(list(diff_ms)):.3f}",
    ]
    selfs = [p[3] for p in found if p[3] is not None]
    if selfs:
        med_self = float(np.median(selfs))
        share = med_self / (float(np.median(on)) * 1000)
        agree = lo - 1 <= share <= hi - 1
        lines.append(
            f"self-reported: median {med_self:.1f} ms ({share * 100:.2f} % of the median init engine with the "
            f"plugin), range {min(selfs):.1f}-{max(selfs):.1f} ms over {len(selfs)} runs; the pairs' interval "
            f"{(lo - 1) * 100:+.1f} % to {(hi - 1) * 100:+.1f} % {'contains' if agree else 'does not contain'} it"
        )
        inside = dlo <= med_self <= dhi
        lines.append(
            f"self-reported median {med_self:.1f} ms beside the pairs' median difference {np.median(diff_ms):+.0f} ms "
            f"({dlo:+.0f} to {dhi:+.0f} ms): {'inside' if inside else 'outside'} the interval"
        )
    else:
        lines.append("self-reported: not in these files (runs recorded before memtrace timed itself)")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    f = sub.add_parser("figure", help="one traced run's self-reported cost, as tsv fields")
    f.add_argument("run_dir")
    a = sub.add_parser("analyse", help="the alternating pairs of one or more runs.tsv files")
    a.add_argument("tsv", nargs="+")
    a.add_argument("--skip", default="round1", help="comma-separated rounds to leave out (default: round1, cold)")
    args = parser.parse_args(argv)
    if args.command == "figure":
        print(figure(args.run_dir))
        return 0
    missing = [p for p in args.tsv if not Path(p).is_file()]
    if missing:
        print(f"vllm_cost: no such file: {missing[0]}", file=sys.stderr)
        return 2
    skip = {s for s in args.skip.split(",") if s}
    for line in analyse(pairs(_rows(args.tsv), skip)):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
