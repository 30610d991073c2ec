"""Record the real-GPU data set under ``tests/data/h200/`` (run on the device machine, not a test).

1. ``startup-full``: examples/record_startup.py on the whole card (the baseline).
2. ``startup-ws1g``: the same with ``--workspace-extra 1GiB`` (for ``memtrace diff``).
3. Mimicked smaller cards, chosen from the baseline's own counters so that one dies in
   ``profile_run``, one only after the KV cache is sized (warm-up / capture), and some survive;
   16 GiB and 32 GiB are always included. Each run's outcome is in its ``*.counters.json``.

    python tests/gpu/make_h200_data.py OUTDIR
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

GiB = 1 << 30
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "record_startup.py"
UTIL = 0.92


def record(out: Path, *args: str) -> dict:
    t0 = time.time()
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--out", str(out), *args], capture_output=True, text=True, timeout=240
    )
    doc_path = next(out.glob("*.counters.json"), None)
    doc = json.loads(doc_path.read_text()) if doc_path else {}
    outcome = doc.get("outcome", {"outcome": "crashed", "phase": None, "error": proc.stderr[-500:]})
    print(
        f"{out.name}: {' '.join(args) or '(full card)'} -> {outcome} exit {proc.returncode} ({time.time() - t0:.1f} s)"
    )
    if proc.returncode not in (0, 1):
        print(proc.stdout[-2000:], proc.stderr[-3000:])
    return doc


def rows(doc: dict) -> dict:
    return {r["phase"]: r for r in doc["counters"]}


def capacities(doc: dict) -> dict[str, int]:
    """Capacities expected to die in profile_run, die after KV sizing, and survive."""
    r, v = rows(doc), doc["vllm"]
    n = v["non_torch_at_init_bytes"]
    w = r["load_model"]["memory_reserved"]
    p = r["profile_run"]["max_memory_reserved"]
    non_kv = v["non_kv_cache_memory_bytes"]
    base = r["kv_cache_init"]["memory_reserved"] - v["kv_cache_bytes"]  # non-KV reserved after KV init
    t_post = r["compile_or_warm_up"]["max_memory_reserved"] - r["kv_cache_init"]["memory_reserved"]
    min_kv = non_kv / UTIL  # below this, no memory is left for the KV cache
    survive = (t_post + n + base - non_kv) / (1 - UTIL)  # post-KV transient fits in the headroom
    print(
        f"baseline: non-torch {n / GiB:.2f} GiB, weights {w / GiB:.2f}, profile peak {p / GiB:.2f}, "
        f"non-KV {non_kv / GiB:.2f}, post-KV transient {t_post / GiB:.2f}; KV needs > {min_kv / GiB:.2f} GiB cards, "
        f"post-KV fits from {survive / GiB:.2f} GiB"
    )
    gib = lambda x: round(x / GiB * 4) / 4 * GiB  # noqa: E731
    caps = {
        "profile": gib(n + w + 0.5 * (p - w)),
        "postkv": gib(max(min_kv * 1.15, min(survive * 0.75, (min_kv + survive) / 2))),
        "survive": gib(survive * 1.3),
    }
    return caps


def main() -> int:
    root = Path(sys.argv[1])
    root.mkdir(parents=True, exist_ok=True)
    results = {}
    full = record(root / "startup-full")
    results["startup-full"] = full.get("outcome")
    results["startup-ws1g"] = record(root / "startup-ws1g", "--workspace-extra", "1GiB").get("outcome")
    caps = capacities(full)
    planned = {c: None for c in sorted({*caps.values(), 16 * GiB, 32 * GiB})}
    seen: dict[str, list[int]] = {}
    for cap in list(planned):
        name = f"startup-cap{cap / GiB:g}g"
        doc = record(root / name, "--capacity", str(cap))
        out = doc.get("outcome") or {}
        kind = (
            "survive"
            if out.get("outcome") == "ok"
            else "profile"
            if out.get("phase") == "profile_run"
            else "postkv"
            if str(out.get("phase", "")).startswith("compile_or_warm_up")
            else "other"
        )
        seen.setdefault(kind, []).append(cap)
        results[name] = {**out, "capacity_bytes": cap, "kind": kind}
    for kind in ("profile", "postkv", "survive"):  # one retry per missing kind, nudged
        if kind in seen:
            continue
        cap = caps[kind] * {"profile": 0.8, "postkv": 1.1, "survive": 1.5}[kind]
        cap = round(cap / GiB * 4) / 4 * GiB
        name = f"startup-cap{cap / GiB:g}g"
        doc = record(root / name, "--capacity", str(int(cap)))
        results[name] = {**(doc.get("outcome") or {}), "capacity_bytes": int(cap), "kind": f"retry-{kind}"}
    (root / "outcomes.json").write_text(json.dumps(results, indent=1, sort_keys=True))
    print(json.dumps(results, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
