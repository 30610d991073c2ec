"""What the no-GPU memory calculators say about real vLLM start-ups, beside what vLLM did (issue 43).

A user whose card is "too small" asks a calculator first: does this model fit this card with these vLLM flags,
and how large will the KV cache be? This bench asks three such calculators the questions of real start-ups
recorded on the H200 (tests/bench/calculator-cases.json: each case names the model's config.json, the bytes
free to vLLM, vLLM's flags, and what vLLM did) and prints their verdicts and KV-cache figures beside vLLM's.
A bench, not a test: nothing imports it, and it needs none of the calculators to print --help.

Install the calculators in a venv of their own (never the project's .venv; they pull their own HTTP stacks):

    python3 -m venv /work/wt/calc-venv
    /work/wt/calc-venv/bin/pip install kvfit==0.3.0 hf-mem==0.5.6 vramscout==0.7.0

Run (any Python 3.10+; --case-from needs the project's .venv, it reads the trace through memtrace):

    python3 tests/bench/calculators.py                       # Markdown tables of every case, every calculator
    python3 tests/bench/calculators.py --venv DIR --json     # another venv; one JSON object per case and calculator
    .venv/bin/python tests/bench/calculators.py --case-from tests/data/vllm-h200-034-grid/g03 \\
        --config tests/data/vllm-h200/model-config.json      # print the case of a recorded start-up, to add it

No network at run time: each calculator reads the case's local config.json (kvfit and hf-mem would fetch it from
the Hugging Face Hub; they are called through their own Python functions with the local file instead), and
HF_HUB_OFFLINE=1 is set for each. How each is asked, and what it cannot be told:

- kvfit 0.3.0: its CLI (`kvfit.cli.main`, --json) with its Hub reader replaced by the local config.json;
  --hardware custom:<bytes free, GiB> --utilization <budget / free> --context <max_model_len> --kv-dtype
  --tp 1 --weight-gib <vLLM's measured weights>. Verdict: its "fits" (one max_model_len sequence fits beside the
  weights). KV figure: its budget less weights, fixed state and reserve (what it leaves for the cache). It has no
  notion of max_num_seqs, max_num_batched_tokens, enforce_eager or the extensible cache.
- vramscout 0.7.0: its CLI (`vramscout.cli.main`, --json) on the local config.json with --engine vllm
  --vram-gib <bytes free> --gpu-memory-utilization <budget / free> --context <max_model_len> --kv-dtype
  --prefill-chunk <max_num_batched_tokens> --batch-size 1. Verdict: its "fits" and "startup_ok". KV figure: its
  budget less its non-KV parts (weights, CUDA/runtime, prefill scratch, reserve): the pool vLLM would size under
  its model. Weights are its own estimate from the config (it has no weights option). It refuses MoE configs
  without Hub metadata. --batch-size N asks for N full-length sequences, which is not what max_num_seqs means
  (vLLM boots when one max_model_len request fits), so it stays 1: max_num_seqs, enforce_eager and the
  extensible cache are not expressed.
- hf-mem 0.5.6: its KV function (`compute_safetensors_kv_cache_size`, the one its --experimental CLI calls) on the
  local config.json with --max-model-len and --kv-cache-dtype; batch size 1 as above. It has no notion of a card,
  so no verdict; its KV figure is what one max_model_len sequence needs, not a cache size.

The card: every calculator is told the bytes free to vLLM (`free_bytes`: holder.log's cudaMemGetInfo on a
shared card, the device total on a whole one) and a utilization chosen so its budget is vLLM's:
min(gpu_memory_utilization x card total, bytes free).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import statistics
import subprocess
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "bench" / "calculator-cases.json"
VENV = Path("/work/wt/calc-venv")
GIB = 1 << 30
INSTALL = "python3 -m venv DIR && DIR/bin/pip install kvfit==0.3.0 hf-mem==0.5.6 vramscout==0.7.0"
#: The vLLM flags of a case, each with the calculators that can be told it.
FLAGS = {
    "max_model_len": ("kvfit", "vramscout", "hf-mem"),
    "kv_cache_dtype": ("kvfit", "vramscout", "hf-mem"),
    "gpu_memory_utilization": ("kvfit", "vramscout"),
    "max_num_batched_tokens": ("vramscout",),
    "max_num_seqs": (),
    "enforce_eager": (),
    "enable_extensible_kv_cache": (),
}


def budget_bytes(case: dict) -> int:
    """What vLLM may use: its utilization of the card's total, never more than is free."""
    total = case.get("card_total_bytes", case["free_bytes"])
    return min(round(case["flags"]["gpu_memory_utilization"] * total), case["free_bytes"])


def _config(case: dict) -> dict:
    return json.loads(Path(case["config"]).read_text())


def _kv_dtype(case: dict) -> str:
    return case["flags"]["kv_cache_dtype"]


# --- the calculators, run inside their venv (--worker NAME, the case on stdin) --------------------------------


def ask_kvfit(case: dict) -> dict:
    import kvfit.cli
    from kvfit.models import ModelMetadata

    config = _config(case)

    def local(model, revision=None, token=None, timeout=20.0):
        return ModelMetadata("local/" + case["name"], "local", None, config, None, None)

    kvfit.cli.fetch_model_metadata = local
    free = case["free_bytes"]
    argv = ["local/" + case["name"], "--hardware", f"custom:{free / GIB:.9f}", "--tp", "1", "--json"]
    argv += ["--utilization", f"{budget_bytes(case) / free:.9f}", "--context", str(case["flags"]["max_model_len"])]
    argv += ["--kv-dtype", _kv_dtype(case)]
    if case.get("weights_bytes"):
        argv += ["--weight-gib", f"{case['weights_bytes'] / GIB:.9f}"]
    rc, out = _captured(kvfit.cli.main, argv)
    if rc:
        return {"refused": out.strip() or f"exit {rc}"}
    layout = json.loads(out)["layouts"][0]
    left = layout["budget_per_rank_gib"] - layout["weights_per_rank_gib"] - layout["fixed_cache_per_rank_gib"]
    left -= layout["runtime_reserve_per_rank_gib"]
    return {"fits": layout["verdict"] == "fits", "kv_bytes": round(left * GIB), "kv_is": "pool"}


def ask_vramscout(case: dict) -> dict:
    import vramscout.cli

    free = case["free_bytes"]
    flags = case["flags"]
    argv = [case["config"], "--engine", "vllm", "--vram-gib", f"{free / GIB:.9f}", "--json", "--batch-size", "1"]
    argv += ["--gpu-memory-utilization", f"{budget_bytes(case) / free:.9f}", "--context", str(flags["max_model_len"])]
    kv_dtype = "fp8" if _kv_dtype(case).startswith("fp8") else _kv_dtype(case)  # its one fp8
    argv += ["--kv-dtype", kv_dtype, "--prefill-chunk", str(flags["max_num_batched_tokens"])]
    rc, out = _captured(vramscout.cli.main, argv)
    try:
        said = json.loads(out)
    except ValueError:
        return {"refused": (out.strip().splitlines() or [f"exit {rc}"])[-1]}
    if "error" in said:
        return {"refused": said["error"]}
    non_kv = said["total_gib"] - said["parts_gib"]["KV cache"]
    fits = bool(said["fits"] and said["startup_ok"])
    return {"fits": fits, "kv_bytes": round((said["memory_budget_gib"] - non_kv) * GIB), "kv_is": "pool"}


def ask_hf_mem(case: dict) -> dict:
    from hf_mem.safetensors.kv_cache import compute_safetensors_kv_cache_size, resolve_kv_cache_dtype

    config = _config(case)
    config = {**config.get("text_config", {}), **config} if "text_config" in config else config
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its note that every fp8 takes one byte
        dtype = resolve_kv_cache_dtype(config, _kv_dtype(case), None, case["name"])
    kv = compute_safetensors_kv_cache_size(config, dtype, case["flags"]["max_model_len"], batch_size=1)
    by_hand = case["weights_bytes"] + kv <= budget_bytes(case) if case.get("weights_bytes") else None
    return {"fits": None, "by_hand": by_hand, "kv_bytes": kv, "kv_is": "need", "said": f"{dtype}, no card"}


def _captured(main, argv: list[str]) -> tuple[int, str]:
    """A calculator's CLI run in this process: its exit code and what it printed (stdout and stderr)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
    return rc or 0, out.getvalue()


CALCULATORS = {"kvfit": ask_kvfit, "vramscout": ask_vramscout, "hf-mem": ask_hf_mem}


def worker(name: str) -> int:
    case = json.load(sys.stdin)
    try:
        answer = CALCULATORS[name](case)
    except ImportError as e:
        answer = {"refused": f"not installed in this venv ({e.name}): {INSTALL}"}
    except Exception as e:  # the calculator's own failure, reported as its answer
        answer = {"refused": f"{type(e).__name__}: {e}"}
    print(json.dumps(answer))
    return 0


# --- asking every calculator about every case, and the tables -------------------------------------------------


def ask(venv: Path, name: str, case: dict) -> dict:
    case = {**case, "config": str(ROOT / case["config"])}
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    cmd = [str(venv / "bin" / "python"), str(Path(__file__).resolve()), "--worker", name]
    done = subprocess.run(cmd, input=json.dumps(case), capture_output=True, text=True, timeout=300, env=env)
    if done.returncode:
        return {"refused": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]}
    return json.loads(done.stdout)


#: How the table names a flag.
SHORT = {"gpu_memory_utilization": "util", "max_num_batched_tokens": "batched", "max_num_seqs": "seqs",
         "enforce_eager": "eager", "enable_extensible_kv_cache": "extensible"}  # fmt: skip


def unexpressed(name: str, case: dict) -> str:
    """The case's flags that calculator could not be told, with their values."""
    flags = case["flags"]
    left = [f"{SHORT.get(k, k)}={flags[k]}" for k in FLAGS if name not in FLAGS[k] and k in flags]
    return ", ".join((["no card"] if name == "hf-mem" else []) + left)


def error(row: dict, real: int | None) -> float | None:
    """The calculator's KV pool against vLLM's figure, in %: only for a start-up that booted, and only where the
    calculator sized a pool (hf-mem's figure is what one request needs, not a cache size)."""
    kv = row.get("kv_bytes")
    if not row["vllm"]["boots"] or row.get("kv_is") != "pool" or kv is None or not real:
        return None
    return 100.0 * (kv - real) / real


def rows(cases: list[dict], venv: Path, names: list[str]) -> list[dict]:
    out = []
    for case in cases:
        vllm = case["vllm"]
        whole = case["free_bytes"] == case.get("card_total_bytes", case["free_bytes"])
        for name in names:
            row = {"case": case["name"], "calculator": name, "whole_card": whole, "vllm": vllm}
            row.update(ask(venv, name, case))
            said = row.get("fits") if row.get("fits") is not None else row.get("by_hand")
            row["verdict_right"] = None if said is None else said == vllm["boots"]
            row["error_vs_kv_cache_pct"] = error(row, vllm.get("kv_cache_bytes"))
            row["error_vs_available_pct"] = error(row, vllm.get("available_kv_bytes"))
            row["not_expressed"] = unexpressed(name, case)
            out.append(row)
    return out


def _b(n: int | None) -> str:
    return "—" if n is None else f"{n:,}"


def _pct(p: float | None) -> str:
    return "—" if p is None else f"{p:+.1f} %"


def _verdict(row: dict) -> str:
    if "refused" in row:
        return "refuses: " + " / ".join(row["refused"].replace("|", "/").split("\n"))  # one table row
    if row["verdict_right"] is None:
        return "no verdict"
    by_hand = row.get("fits") is None
    said = "fits" if (row.get("by_hand") if by_hand else row["fits"]) else "does not fit"
    said = f"no verdict; by hand, weights + its KV vs the budget: {said}" if by_hand else said
    return f"{said} ({'right' if row['verdict_right'] else '**wrong**'})"


def markdown(table: list[dict], names: list[str]) -> list[str]:
    lines = []
    for name in names:
        mine = [r for r in table if r["calculator"] == name]
        lines += [f"**{name}**", ""]
        lines.append("| case | vLLM did | vLLM's KV cache, B | vLLM's available KV, B | verdict | its KV figure, B "
                     "| error vs KV cache | error vs available | flags it could not be told |")  # fmt: skip
        lines.append("| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | --- |")
        for r in mine:
            v = r["vllm"]
            kv = _b(r.get("kv_bytes")) + (" (one request's need)" if r.get("kv_is") == "need" else "")
            lines.append(f"| `{r['case']}` | {v['outcome']} | {_b(v.get('kv_cache_bytes'))} "
                         f"| {_b(v.get('available_kv_bytes'))} | {_verdict(r)} | {kv} "
                         f"| {_pct(r['error_vs_kv_cache_pct'])} | {_pct(r['error_vs_available_pct'])} "
                         f"| {r['not_expressed']} |")  # fmt: skip
        lines += ["", summary(mine), ""]
    return lines


def summary(mine: list[dict]) -> str:
    judged = [r for r in mine if r["verdict_right"] is not None]
    wrong = [r["case"] for r in judged if not r["verdict_right"]]
    by_hand = any(r.get("fits") is None for r in judged)
    said = f"verdicts{' (read by hand)' if by_hand else ''}: {len(judged) - len(wrong)} of {len(judged)} right"
    said += f" (wrong: {', '.join(wrong)})" if wrong else ""
    said += f"; refused {sum('refused' in r for r in mine)} of {len(mine)}"
    for where, whole in (("on the whole card", True), ("on a shared card", False)):
        errs = [r["error_vs_kv_cache_pct"] for r in mine if r["whole_card"] == whole]
        errs = [e for e in errs if e is not None]
        if errs:
            said += (f"; KV figure vs vLLM's KV cache {where} ({len(errs)} that booted): {min(errs):+.1f} % to "
                     f"{max(errs):+.1f} %, median {statistics.median(errs):+.1f} %")  # fmt: skip
    return said + "."


# --- a case from a recorded start-up (the lead's folders: vllm.log, holder.log, the trace) --------------------


def case_from(folder: Path, config: str) -> dict:
    from memtrace.store import load_trace

    trace = load_trace(next(folder.glob("*.memtrace*")))
    facts, log = trace.facts, (folder / "vllm.log").read_text()
    total = trace.process.device_total_bytes
    holder = folder / "holder.log"
    held = re.search(r"free (\d+) B of (\d+) B", holder.read_text()) if holder.exists() else None
    died = "CUDA out of memory" in log
    refused = "No available memory for the cache blocks" in log
    outcome = "dies (CUDA OOM)" if died else "refuses: no KV blocks after warm-up" if refused else "boots"
    boots = not died and not refused and "GPU KV cache size" in log
    cfg = facts["vllm.config"]
    flags = {k: cfg[k] for k in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "kv_cache_dtype")}
    flags["gpu_memory_utilization"] = facts["gpu_memory_utilization"]
    flags["enforce_eager"] = cfg["enforce_eager"]
    flags["enable_extensible_kv_cache"] = "'enable_extensible_kv_cache': False" not in log
    return {
        "name": folder.name, "folder": str(folder.resolve().relative_to(ROOT)), "config": config,
        "free_bytes": int(held.group(1)) if held else total, "card_total_bytes": total,
        "weights_bytes": facts.get("vllm.weights_memory_bytes"), "flags": flags,
        "vllm": {"outcome": outcome, "boots": boots,
                 "kv_cache_bytes": facts.get("vllm.kv_cache_bytes") if boots else (0 if refused else None),
                 "available_kv_bytes": facts.get("vllm.available_kv_cache_bytes")},
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--cases", type=Path, default=CASES, help=f"the cases (default {CASES.relative_to(ROOT)})")
    p.add_argument("--venv", type=Path, default=VENV, help=f"the calculators' venv (default {VENV}); {INSTALL}")
    p.add_argument("--only", choices=list(CALCULATORS), action="append", help="ask only these calculators")
    p.add_argument("--json", action="store_true", help="one JSON object per case and calculator")
    p.add_argument("--case-from", type=Path, metavar="DIR", help="print the case of a recorded start-up")
    p.add_argument("--config", help="with --case-from: the model's config.json, relative to the repository")
    p.add_argument("--worker", choices=list(CALCULATORS), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args.worker)
    if args.case_from:
        if not args.config:
            p.error("--case-from needs --config: the model's config.json, relative to the repository")
        print(json.dumps(case_from(args.case_from, args.config), indent=1))
        return 0
    if not (args.venv / "bin" / "python").exists():
        print(f"calculators.py: no venv at {args.venv}; make one: {INSTALL.replace('DIR', str(args.venv))}")
        return 2
    names = args.only or list(CALCULATORS)
    table = rows(json.loads(args.cases.read_text()), args.venv, names)
    print("\n".join(json.dumps(r) for r in table) if args.json else "\n".join(markdown(table, names)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
