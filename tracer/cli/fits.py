"""Would this start-up survive on a card of another size? If not, in which phase, and by how much.

The model keeps what does not depend on the card (weights, workspaces, profile_run's activations,
CUDA context and other non-PyTorch memory, unless --non-torch gives the other card's), counts only
the segments PyTorch could not release (a full card's allocator frees its cached segments before it
fails), sizes the KV cache as vLLM does
(util × capacity − non-KV memory) and moves the post-KV part of the recorded curve by the change
in KV bytes. A start-up dies where the curve goes over the physical capacity: in profiling
(before the KV cache, where --gpu-memory-utilization cannot help), at KV sizing (no memory left
for the cache blocks), or in warm-up / CUDA-graph capture (the post-KV transient).

  memtrace fits RUN --capacity 32GiB
  memtrace fits RUN --capacity 16GiB,24GiB,32GiB --util 0.92

Exit status: 0 when it fits on every capacity asked, 1 when it dies on one (or the recording ends
too early to tell), 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys

NAME = "fits"
ORDER = 45


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_path", metavar="RUN", help="a recorded start-up (run directory or .memtrace file)")
    p.add_argument(
        "--capacity",
        required=True,
        metavar="SIZE[,SIZE...]",
        help="card memory: 32GiB, 24GB, or several separated by commas for a table",
    )
    p.add_argument(
        "--util",
        default=None,
        metavar="FRACTION",
        help="--gpu-memory-utilization on that card (default: the recorded one, else 0.9)",
    )
    p.add_argument(
        "--non-torch",
        default=None,
        metavar="SIZE",
        help="non-PyTorch memory on that card (CUDA context, NCCL, libraries); default: as recorded (NVML)",
    )
    p.add_argument(
        "--rank",
        type=int,
        default=None,
        help="only this rank (default: every rank with allocator events, and the worst named)",
    )
    p.add_argument("--json", action="store_true", help="print the predictions as JSON")


def run(args: argparse.Namespace) -> int:
    from ..analysis.fits import fits, smallest_fitting
    from ..progress import task
    from ..units import parse_fraction, parse_size, parse_sizes
    from ._runs import load_with_progress, select

    capacities = parse_sizes(args.capacity)
    util = parse_fraction(args.util) if args.util is not None else None
    non_torch = parse_size(args.non_torch) if args.non_torch is not None else None
    run = load_with_progress(args.run_path)
    traces = [t for t in select(run, args.rank) if len(t.events)] or select(run, args.rank)[:1]
    answers = []  # (trace, results, smallest, assumption), one per rank
    for trace in traces:
        with task("Predicting", total=None):
            results = fits(trace, capacities, util, non_torch_bytes=non_torch)
            smallest = smallest_fitting(trace, util, non_torch_bytes=non_torch)
        answers.append((trace, results, smallest, _assumption(trace, non_torch)))
    multi = len(answers) > 1
    if args.json:
        out = {
            "run": args.run_path,
            "ranks": [
                {
                    "rank": trace.process.rank,
                    "pid": trace.process.pid,
                    "smallest_fitting_capacity_bytes": smallest,
                    "fits": [{**r.__dict__, "survives": r.survives} for r in results],
                }
                for trace, results, smallest, _ in answers
            ],
        }
        if not multi:  # one process: the flat shape
            out.update(out.pop("ranks")[0])
            out.pop("rank"), out.pop("pid")
        json.dump(out, sys.stdout, indent=2)
        print()
    else:
        for trace, results, smallest, assumption in answers:
            text = render(results, args.run_path, smallest, assumption)
            if multi:
                text = text.replace(
                    f"memtrace fits: {args.run_path}", f"memtrace fits: {args.run_path} ({trace.label})", 1
                )
            sys.stdout.write(text)
        if multi:
            worst = max(answers, key=lambda a: a[2] if a[2] is not None else float("inf"))
            need = f"needs about {_gib(worst[2])}" if worst[2] is not None else "fits on no card tried"
            sys.stdout.write(
                f"Worst rank: {worst[0].label} ({need}); every rank must fit for the start-up to survive\n"
            )
    return 0 if all(r.survives for _, results, _, _ in answers for r in results) else 1


def _assumption(trace, non_torch: int | None) -> str:
    """The non-PyTorch memory the prediction assumes, in words."""
    if non_torch is not None:
        return f"{_gib(non_torch)} (--non-torch)"
    from ..analysis.landmarks import landmarks

    recorded = landmarks(trace).before_kv_non_torch_bytes
    gpu = (trace.facts.get("env") or {}).get("gpu_name") or "the recorded GPU"
    return f"as recorded on {gpu}: {_gib(recorded)} at KV sizing" if recorded else "none recorded (no NVML)"


def _gib(n: int | None) -> str:
    return "—" if n is None else f"{n / 1024**3:.2f} GiB"


def _verdict(r) -> str:
    if r.outcome == "unknown":
        return "unknown: the recording ends before the KV cache (record a run that gets further)"
    if r.survives:
        return f"fits, {_gib(r.headroom_bytes)} to spare"
    if r.stage == "init":
        return f"vLLM refuses at init_device: free memory {_gib(r.overshoot_bytes)} short of util × capacity"
    if r.stage == "KV sizing" and "max_model_len" in r.phase:
        return f"vLLM refuses: KV cache {_gib(r.kv_cache_bytes)} < one max_model_len request ({_gib(r.overshoot_bytes)} short)"
    if r.stage == "KV sizing":
        return f"vLLM refuses: no memory for the KV cache ({_gib(r.overshoot_bytes)} short)"
    if r.stage == "pre-KV":
        return f"OOM in {r.phase} (before KV sizing; needs {_gib(r.overshoot_bytes)} more)"
    return f"OOM in {r.phase} (after the KV cache; {_gib(r.overshoot_bytes)} over)"


def render(results: list, run_path: str, smallest: int | None, non_torch: str = "") -> str:
    """The text answer: one paragraph for one capacity, a table for several."""
    lines = [f"memtrace fits: {run_path}"]
    if len(results) == 1:
        r = results[0]
        lines.append(
            f"On a {_gib(r.capacity_bytes)} card at --gpu-memory-utilization {r.util:g} "
            f"(vLLM may fill {_gib(r.target_bytes)}):"
        )
        if r.survives:
            lines.append(
                f"  SURVIVES: KV cache {_gib(r.kv_cache_bytes)}, {_gib(r.headroom_bytes)} to spare at the tightest moment"
            )
        elif r.stage == "pre-KV":
            lines.append(f"  DIES in {r.phase}, before the KV cache is sized:")
            lines.append(
                f"  before the KV cache it needs {_gib(r.pre_kv_peak_bytes)} (peak in {r.pre_kv_peak_phase}), "
                f"{_gib(r.overshoot_bytes)} more than the card; --gpu-memory-utilization cannot help"
            )
        elif r.stage == "init":
            lines.append(
                f"  REFUSED at init_device: vLLM needs {_gib(r.target_bytes)} free at start-up and would find "
                f"{_gib(r.overshoot_bytes)} less (CUDA context and other memory); lower --gpu-memory-utilization"
            )
        elif r.stage == "KV sizing" and "max_model_len" in r.phase:
            lines.append(
                f"  DIES at KV sizing: the {_gib(r.kv_cache_bytes)} KV cache cannot hold one request of max_model_len "
                f"tokens ({_gib(r.overshoot_bytes)} short); lower --max-model-len or raise --gpu-memory-utilization"
            )
        elif r.stage == "KV sizing":
            lines.append(
                f"  DIES at KV sizing: vLLM counts {_gib(r.non_kv_bytes)} that is not KV cache, "
                f'{_gib(r.overshoot_bytes)} more than it may fill ("No available memory for the cache blocks")'
            )
        else:
            lines.append(f"  DIES in {r.phase}, after the KV cache ({_gib(r.kv_cache_bytes)}) was allocated:")
            lines.append(
                f"  the post-KV peak would be {_gib(r.post_kv_peak_bytes)}, {_gib(r.overshoot_bytes)} over the card"
            )
        lines.append(
            f"  card-independent: {_gib(r.non_kv_bytes)} non-KV; pre-KV peak {_gib(r.pre_kv_peak_bytes)} in {r.pre_kv_peak_phase}"
        )
    else:
        head = f"  {'capacity':>10} {'util':>5} {'vLLM fills':>11} {'non-KV':>10} {'KV cache':>10} {'post-KV peak':>13}  outcome"
        lines.append(head)
        for r in results:
            kv = _gib(r.kv_cache_bytes) if r.kv_cache_bytes > 0 else "none"
            lines.append(
                f"  {_gib(r.capacity_bytes):>10} {r.util:>5g} {_gib(r.target_bytes):>11} {_gib(r.non_kv_bytes):>10} "
                f"{kv:>10} {_gib(r.post_kv_peak_bytes):>13}  {_verdict(r)}"
            )
        r = results[0]
        lines.append(f"  pre-KV peak (every card): {_gib(r.pre_kv_peak_bytes)} in {r.pre_kv_peak_phase}")
    if non_torch:
        lines.append(f"Non-PyTorch memory (CUDA context, libraries) assumed: {non_torch}; --non-torch SIZE to change")
    if smallest is not None:
        lines.append(f"Smallest card this start-up fits on at that utilization: about {_gib(smallest)}")
    return "\n".join(lines) + "\n"
