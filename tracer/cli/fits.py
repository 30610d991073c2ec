"""Would this start-up survive on a card of another size? If not, in which phase, and by how much.

The model keeps what does not depend on the card (weights, workspaces, profile_run's activations,
CUDA context and other non-PyTorch memory, unless --non-torch gives the other card's), counts only
the segments PyTorch could not release (a full card's allocator frees its cached segments before it
fails), sizes the KV cache as vLLM does
(util × capacity − non-KV memory) and moves the post-KV part of the recorded curve by the change
in KV bytes. A start-up dies where the curve goes over the physical capacity: in profiling
(before the KV cache, where --gpu-memory-utilization cannot help), at KV sizing (no memory left
for the cache blocks), or in warm-up / CUDA-graph capture (the post-KV transient).

A recording that ended in a CUDA OOM covers the start-up only up to that failed request: on its own
card (or one with no more room) the answer is that it dies there (the phase, the request, the free
memory); on a larger card, "vLLM refuses" when util x card is below what vLLM already keeps out of the
KV cache, else "unknown" when the request would fit (what came after it was never recorded). Such a
recording never answers "fits". Where a vLLM recording ends before the part that decides (vLLM refused
to extend its KV cache on a card another process shared), the what-if model with the recorded flags
carries it on: the answer says it is a prediction and where its figures come from (docs/whatif.md).

  memtrace fits RUN --capacity 32GiB
  memtrace fits RUN --capacity 16GiB,24GiB,32GiB --util 0.92

With other flags (analysis.whatif; docs/whatif.md): each allocation is assigned to a site and scaled by
its rule (activations and workspaces x max-num-batched-tokens, the sampler x max-num-seqs, CUDA graphs x
the graphs captured), vLLM's KV sizing is redone, and per card the answer is boots / dies in PHASE by N /
vLLM refuses, each figure with where it came from. More traces of the same model (RUN_B ...) fit each
site's scaling. The card holds this process alone unless --keep-others.

  memtrace fits RUN --capacity 16GiB,32GiB --what-if max-num-batched-tokens=2048 --what-if max-num-seqs=4
  memtrace fits RUN --capacity 16GiB --what-if enforce-eager --what-if kv-cache-dtype=fp8
  memtrace fits RUN --capacity 32GiB --suggest
  memtrace fits RUN_A RUN_B --capacity 24GiB --what-if max-num-batched-tokens=4096

Exit status: 0 when it fits on every capacity asked, 1 when it dies on one (or the recording ends
too early to tell), 2 on bad input (a capacity below 1GiB included).
"""

from __future__ import annotations

import argparse
import sys

NAME = "fits"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from memtrace.cli._runs import add_input, add_rank

    add_input(p, help="run directory, .memtrace file or snapshot pickle (none with --config: before any run)",
              optional=True)  # fmt: skip
    p.add_argument(
        "more_runs", nargs="*", metavar="RUN_B", help="more traces of the same model (--what-if fits on them)"
    )
    p.add_argument(
        "--capacity",
        required=True,
        metavar="SIZE[,SIZE...]",
        help="card memory: 32GiB, 24GB, or several separated by commas for a table (at least 1GiB)",
    )
    p.add_argument(
        "--util",
        default=None,
        metavar="FRACTION",
        help="--gpu-memory-utilization on that card (default: the recorded one, else vLLM's default for its release)",
    )
    p.add_argument(
        "--non-torch",
        default=None,
        metavar="SIZE",
        help="non-PyTorch memory on that card (CUDA context, NCCL, libraries); default: as recorded (NVML)",
    )
    add_rank(p, "only this rank (default: every rank with allocator events, and the worst named)")
    p.add_argument(
        "--what-if",
        action="append",
        default=[],
        metavar="FLAG[=VALUE]",
        help="a vLLM flag changed: max-num-batched-tokens=N, max-num-seqs=N, max-model-len=N, enforce-eager (or "
        "no-enforce-eager), kv-cache-dtype=fp8|auto|bfloat16|float16, gpu-memory-utilization=F, "
        "extensible-kv-cache=on|off (repeatable)",
    )
    p.add_argument("--suggest", action="store_true", help="the changes to the recorded flags that boot on each card")
    p.add_argument(
        "--keep-others",
        action="store_true",
        help="keep the recording's other processes' memory on the card (default: the card holds this process alone)",
    )
    p.add_argument(
        "--others",
        default=None,
        metavar="SIZE",
        help="memory other processes hold on that card (a shared GPU), with --what-if/--suggest",
    )
    p.add_argument(
        "--config",
        default=None,
        metavar="CONFIG_JSON",
        help="the model's config.json: alone, the answer before any run (weights from the safetensors beside it, "
        "else from the config; the rest from priors over real start-ups); with RUN, its shape carries a recording "
        "cut by its OOM past its end (recordings since memtrace records the shape need none)",
    )
    p.add_argument(
        "--priors",
        default=None,
        metavar="PRIORS_JSON",
        help="the priors that carry a start-up past its recording (default: the shipped ones, fitted on real vLLM "
        "0.34 start-ups; refit with tests/bench/fit_priors.py)",
    )
    p.add_argument("--json", action="store_true", help="print the predictions as JSON")


def check_capacity(capacity_bytes: int) -> int:
    """``capacity_bytes`` when it is a card's memory; UsageError for 0, 1 MiB and the like."""
    from memtrace.analysis.capacity.fits import MIN_CAPACITY
    from memtrace.errors import UsageError

    if capacity_bytes < MIN_CAPACITY:
        raise UsageError(
            f"--capacity {capacity_bytes:,} B is not a GPU's memory; give the card's memory, at least 1GiB "
            "(e.g. 24GiB, 80GB)"
        )
    return capacity_bytes


def check_non_torch(non_torch_bytes: int | None, capacities: list[int]) -> int | None:
    """``non_torch_bytes`` (``--non-torch``) when it leaves room on every card asked about; UsageError when
    it fills one (a CUDA context, NCCL and libraries never take the whole card)."""
    from memtrace.errors import UsageError
    from memtrace.units import format_gib

    if non_torch_bytes is None:
        return None
    full = [c for c in capacities if non_torch_bytes >= c]
    if full:
        raise UsageError(
            f"--non-torch {format_gib(non_torch_bytes)} is not less than the {format_gib(min(full))} card; "
            "give the non-PyTorch memory (CUDA context, NCCL, libraries) on that card, e.g. 0.6GiB"
        )
    return non_torch_bytes


def run(args: argparse.Namespace) -> int:
    from memtrace.cli._runs import analysed
    from memtrace.plots.render import render
    from memtrace.progress import task
    from memtrace.units import parse_fraction, parse_size, parse_sizes

    capacities = [check_capacity(c) for c in parse_sizes(args.capacity, at_least="1GiB, a card's memory")]
    util = parse_fraction(args.util) if args.util is not None else None
    non_torch = check_non_torch(parse_size(args.non_torch) if args.non_torch is not None else None, capacities)
    if args.run_path is None:
        return _before_run(args, capacities)
    run_ = _on_cards(analysed(args))
    if args.config is not None:
        _give_shape(run_, args.config)
    if args.what_if or args.suggest or args.more_runs or args.keep_others or args.others is not None or args.priors:
        return _what_if(args, run_, capacities)
    with task("Predicting", total=None):
        ranks = run_.require_events("predict")
        survives = all(r.fits(capacities, util, non_torch).survives for r in ranks)
    render(run_, sys.stdout, "fits", capacities=capacities, util=util, non_torch=non_torch, json_out=args.json)
    return 0 if survives else 1


def _before_run(args: argparse.Namespace, capacities: list[int]) -> int:
    """--config without RUN: the start-up from the model's config and the priors, per card; exit 0 if it boots."""
    from memtrace.analysis.capacity import before_run as B
    from memtrace.analysis.capacity.priors import load_library
    from memtrace.analysis.capacity.shape import read_config
    from memtrace.analysis.capacity.whatif import BOOTS
    from memtrace.errors import UsageError
    from memtrace.plots.whatif_text import render_before_run
    from memtrace.units import parse_size

    if args.config is None:
        raise UsageError("give a RUN to predict from, or --config config.json to predict before any run")
    if args.more_runs or args.keep_others or args.util is not None or args.non_torch is not None:
        raise UsageError("before any run, give the flags as --what-if (gpu-memory-utilization=F too) and other "
                         "processes' memory as --others SIZE")  # fmt: skip
    shape = read_config(args.config)
    library = load_library(args.priors)
    others = parse_size(args.others) if args.others is not None else 0
    weights = B.weights_of(args.config)
    boots = True
    for capacity in capacities:
        flags = B.config_flags(shape, capacity, args.what_if)
        o = B.predict(shape, flags, capacity, weights, library, others)
        found = B.suggest(shape, flags, capacity, weights, library, others) if args.suggest else []
        render_before_run(sys.stdout, args.config, flags, weights, o, found, library, json_out=args.json)
        boots = boots and o.verdict == BOOTS
    return 0 if boots else 1


def _give_shape(run_, path: str) -> None:
    """The model's shape from ``path`` (a Hugging Face config.json) for the ranks that did not record theirs."""
    from memtrace import facts as F
    from memtrace.analysis.capacity.shape import read_config

    shape = read_config(path)
    for r in run_.ranks:
        if not isinstance(r.trace.facts.get(F.VLLM_MODEL_SHAPE), dict):
            r.trace.facts[F.VLLM_MODEL_SHAPE] = shape


def _on_cards(run_):
    """The run's ranks of a GPU's memory (a card holds no CPU memory); the others named on stderr, not predicted."""
    kept = run_.on_cards("predict")
    left = [r.label for r in run_.ranks if r not in kept.ranks]
    if left:
        print(f"memtrace: not predicted: {', '.join(left)} (not a GPU's memory: no card holds it)", file=sys.stderr)
    return kept


def _what_if(args: argparse.Namespace, run_, capacities: list[int]) -> int:
    """--what-if / --suggest: exit 0 when the changed flags boot on every card asked."""
    from memtrace.analysis.capacity.boot import answer
    from memtrace.analysis.capacity.whatif import BOOTS
    from memtrace.cli._runs import analysed
    from memtrace.errors import UsageError
    from memtrace.plots.render import render
    from memtrace.progress import task

    if args.util is not None or args.non_torch is not None:
        raise UsageError(
            "--what-if/--suggest take the utilization as --what-if gpu-memory-utilization=F; drop --util/--non-torch"
        )
    from memtrace.units import parse_size

    if args.others is not None and args.keep_others:
        raise UsageError("give --others SIZE or --keep-others, not both")
    others = parse_size(args.others) if args.others is not None else None
    if others is not None and any(others >= c for c in capacities):
        raise UsageError(f"--others {args.others} fills the card; give what other processes hold, less than --capacity")
    from memtrace.analysis.capacity.priors import load_library

    library = load_library(args.priors) if args.priors is not None else None
    more = []
    for path in args.more_runs:
        args.extra_run = path
        more += analysed(args, "extra_run").require_events("calibrate")
    with task("Predicting", total=None):
        answers = [
            (r, answer(r, args.what_if, capacities, suggest_too=args.suggest, keep_others=args.keep_others, others_bytes=others,
                       calibration_ranks=tuple(more), library=library))
            for r in run_.require_events("predict")
        ]  # fmt: skip
    render(run_, sys.stdout, "whatif", answers=answers, json_out=args.json)
    return 0 if all(o.verdict == BOOTS for _, a in answers for o in a.outcomes) else 1
