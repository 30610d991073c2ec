"""Refit the library of priors (issue 43) from real vLLM start-ups: one command, one file.

    python tests/bench/fit_priors.py                 # the shipped library: prints each prior, writes nothing
    python tests/bench/fit_priors.py --write         # ... and writes tracer/analysis/capacity/priors-vllm-0.34.json

Each start-up is a recorded whole start-up (it reached vLLM's KV sizing) and the config.json of its model: the
shape comes from the trace's facts (``vllm.model_shape``, recorded since issue 43) or from that config. The list of
start-ups is LIBRARY below: the shipped vLLM 0.34 traces recorded with dummy weights on the H200 (the Qwen3-MoE and
Llama-shaped dense models) and on an H100 80GB (Gemma3, Qwen3.5-MoE; tests/data/vllm-h100-034-archs).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from memtrace.analysis.capacity import priors as P

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from priors_fit import fit, observe_folder, to_json, without  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
MOE = DATA / "vllm-h200" / "model-config.json"
DENSE = ROOT / "tests" / "gpu" / "vllm034" / "dense-config.json"
MODELS = ROOT / "tests" / "gpu" / "vllm034" / "models"
#: (trace folder, architecture, config.json of the model when the trace does not record its shape)
LIBRARY = [
    *((DATA / "vllm-h200-034" / n, "Qwen3MoeForCausalLM", MOE) for n in ("moe-ext", "moe-noext")),
    *((DATA / "vllm-h200-034" / n, "LlamaForCausalLM", DENSE) for n in ("dense-ext", "dense-noext")),
    *((DATA / "vllm-h200-034-grid" / n, "Qwen3MoeForCausalLM", MOE)
      for n in ("g03", "g07", "g08", "g4096-s8-eager", "g8192-s64-eager", "small-r2048", "small-rescue-p2048",
                "small-rescue-u0835")),
    *((DATA / "vllm-h100-034-archs" / n, a, MODELS / f"{m}.json")
      for n, a, m in (("a-gemma3", "Gemma3ForCausalLM", "gemma3"), ("a-q35moe", "Qwen3_5MoeForCausalLM", "q35moe"))),
]  # fmt: skip


def observations(entries=LIBRARY) -> list[P.Observed]:
    out = []
    for folder, arch, config in entries:
        if not folder.exists():
            print(f"  (no {folder.relative_to(ROOT)}: left out)", file=sys.stderr)
            continue
        out.append(observe_folder(folder, arch, config))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help=f"write {P.LIBRARY_FILE}")
    ap.add_argument("--leave-out", metavar="ARCH", help="refit the shipped library's observations without ARCH "
                    "(fast: no trace is read) and write it to --out (leave one architecture out)")  # fmt: skip
    ap.add_argument("--out", metavar="PATH", help="with --leave-out: where to write the refitted priors")
    args = ap.parse_args(argv)
    if args.leave_out:
        if not args.out:
            ap.error("--leave-out needs --out PATH")
        lib = without(P.load_library(), args.leave_out)
        Path(args.out).write_text(to_json(lib))
        print(f"wrote {args.out}: {len(lib.observed)} start-ups of {', '.join(lib.architectures)}")
        return 0
    lib = fit(observations(), "0.34")
    for o in lib.observed:
        print(o.label, o.architecture, {k: f"{v / 2**20:.1f}M" for k, v in o.values.items()})
    for k, p in lib.priors.items():
        print(
            f"{k:16s} {p.coefficient:14.6g} spread {f'{p.spread:7.1%}' if p.spread is not None else 'unmeasured'}  "
            f"{p.starts} start-ups, {', '.join(p.architectures)}"
        )
    if args.write:
        P.LIBRARY_FILE.write_text(to_json(lib))
        print(f"wrote {P.LIBRARY_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
