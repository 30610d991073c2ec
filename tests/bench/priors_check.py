"""memtrace's answer before any run, checked against real vLLM start-ups (issue 43): leave one architecture out.

For each case of tests/bench/calculator-cases.json (real H200 start-ups: the model's config.json, the bytes free to
vLLM, vLLM's flags, what vLLM did), memtrace predicts the start-up with nothing recorded
(``analysis.capacity.before_run.predict``): every figure from the priors refitted WITHOUT the case's architecture,
the weights given as vLLM measured them (as the calculators of tests/bench/calculators.py are given them). It
prints the verdict, the KV cache against vLLM's, and the pre-KV peak against the one the start-up recorded (its
components put back together: ``priors.Carried`` with every figure recorded).

    .venv/bin/python tests/bench/priors_check.py            # a Markdown table
    .venv/bin/python tests/bench/priors_check.py --in-sample  # the shipped priors as they are (no leave-out)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from memtrace.analysis.capacity import before_run as B
from memtrace.analysis.capacity import priors as P
from memtrace.analysis.capacity.shape import read_config
from memtrace.analysis.capacity.whatif import BOOTS, Flags

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from priors_fit import without  # noqa: E402

CASES = ROOT / "tests" / "bench" / "calculator-cases.json"
GiB = 2**30


def flags_of(case: dict) -> Flags:
    f = case["flags"]
    util = f.get("gpu_memory_utilization")
    ext = bool(f.get("enable_extensible_kv_cache", True))
    return Flags(int(f["max_num_batched_tokens"]), int(f["max_num_seqs"]), int(f["max_model_len"]),
                 bool(f.get("enforce_eager")), str(f.get("kv_cache_dtype") or "auto"),
                 None if util in (None, 1.0 if ext else 0.92) else float(util), ext)  # fmt: skip


def measured_pre_kv(lib: P.Library, label: str, shape: dict, flags: Flags) -> int | None:
    o = next((x for x in lib.observed if x.label == label), None)
    if o is None:
        return None
    c = P.Carried(shape, flags, lib, {k: P.Figure(k, v, P.RECORDED) for k, v in o.values.items()})
    return c.pre_kv[1]


def check(case: dict, lib: P.Library, in_sample: bool) -> dict:
    shape = read_config(str(ROOT / case["config"]))
    arch = (shape.get("architectures") or ["?"])[0]
    used = lib if in_sample else without(lib, arch)
    flags = flags_of(case)
    total = int(case.get("card_total_bytes") or case["free_bytes"])
    others = total - int(case["free_bytes"])
    weights = B.Weights(int(case["weights_bytes"]), "vLLM's measured weights")
    o = B.predict(shape, flags, total, weights, used, others)
    real = case["vllm"]
    kv_real = real.get("kv_cache_bytes") or 0
    kv = o.kv.kv_bytes if o.kv is not None and o.verdict == BOOTS else 0
    pre = measured_pre_kv(lib, case["name"], shape, flags)
    return {"case": case["name"], "arch": arch, "library": ", ".join(used.architectures), "vllm": real["outcome"],
            "boots": bool(real.get("boots")), "kv_real": kv_real, "verdict": o.verdict, "kv": kv,
            "kv_error": (kv - kv_real) / kv_real if kv_real and kv else None, "spread": o.spread_bytes,
            "pre_kv": o.pre_kv_peak_bytes, "pre_kv_real": pre,
            "pre_kv_error": (o.pre_kv_peak_bytes - pre) / pre if pre else None}  # fmt: skip


def _gib(x: int | None, none: str = "? (unmeasured)") -> str:
    return f"{x / GiB:.2f} GiB" if x is not None else none


def _pct(x: float | None) -> str:
    return f"{x:+.1%}" if x is not None else "-"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--in-sample", action="store_true", help="the shipped priors, no architecture left out")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    lib = P.load_library()
    rows = [check(c, lib, args.in_sample) for c in json.loads(CASES.read_text())]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print("| case | priors from | vLLM | vLLM's KV cache | memtrace (no run) | KV cache ± spread | error | "
          "pre-KV peak | recorded | error |")  # fmt: skip
    print("| --- | --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        right = (r["verdict"] == BOOTS) == r["boots"]
        print(f"| {r['case']} | {r['library'] or 'nothing'} | {r['vllm']} | {r['kv_real'] / GiB:.2f} GiB | "
              f"{r['verdict']}{'' if right else ' (wrong)'} | {r['kv'] / GiB:.2f} ± {_gib(r['spread'])} | "
              f"{_pct(r['kv_error'])} | {r['pre_kv'] / GiB:.2f} GiB | "
              f"{_gib(r['pre_kv_real'], '-')} | {_pct(r['pre_kv_error'])} |")  # fmt: skip
    right = sum((r["verdict"] == BOOTS) == r["boots"] for r in rows)
    print(f"\nverdict right in {right} of {len(rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
