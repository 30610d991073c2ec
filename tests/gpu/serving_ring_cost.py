"""What PyTorch's allocator history costs as a flight-recorder ring (for memtrace's serving-mode default).

Run on a machine with a CUDA GPU (not a test; needs torch and numpy; sized for < 90 s, --quick < 20 s):

    python3 tests/gpu/serving_ring_cost.py OUT_DIR [--quick]

Writes ``OUT_DIR/serving-ring-cost.json`` and prints a summary. Every measurement runs in repeated
rounds with its configurations alternating; each round's value and the median are kept. A failing
measurement is recorded as ``{"error": ...}`` in the JSON (exit code 1) and the others still run.

1. ``per_pair_ns``: ns per ``torch.empty(512 bytes)`` + ``del`` at a Python stack depth of ~60 frames,
   with the history off, ``context="alloc"`` (memtrace's start-up setting), the same without
   ``free_requested`` entries (``skip_actions``: memtrace's held serving ring, ``held``), ``context=None``
   with them skipped (``held_no_stacks``), and ``held`` with a small ring kept full (every entry evicts one:
   the steady state of a serving ring).
2. ``rss``: host memory (VmRSS) before and after filling a ``max_entries=M`` ring with >= M entries
   (one pair makes 2 held: alloc, free_completed), per entry, and after disabling, clearing
   and ``malloc_trim`` (glibc may keep freed memory: the figures are what the process holds). Each round
   runs in a fresh process (all at once), so one ring's leftovers can't hide the next one's cost.
3. ``snapshot``: ``torch.cuda.memory._snapshot()`` and memtrace's converter
   (``importers.torch_snapshot.entries_to_events`` with its in-memory ``Interner``) on K entries.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import inspect
import json
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

try:
    import torch
except ImportError:  # reported by main()
    torch = None

REPO = Path(__file__).resolve().parents[2]
DEPTH = 60  # Python frames on the stack at each allocation (the timed function's own frame included)
BLOCK_BYTES = 512
#: name -> (context, free_requested skipped); "off": no history
CONFIGS = {
    "off": ("off", False),
    "alloc_stacks": ("alloc", False),
    "held": ("alloc", True),
    "held_no_stacks": (None, True),
    "held_full_ring": ("alloc", True),
}
RSS_CONFIGS = ("held", "held_no_stacks")
FULL_RING = 30_000  # max_entries of the "held_full_ring" configuration, filled before timing
RSS_ROUNDS = 3  # fresh processes per context for the host-memory figures
DEV = None  # the torch.device allocations use (set in main)
CAN_CLEAR = False  # _record_memory_history takes clear_history
CAN_SKIP = False  # ... and skip_actions


def import_converter():
    """memtrace's snapshot converter: the installed ``memtrace`` or the repo's ``tracer`` package."""
    try:
        from memtrace.importers import torch_snapshot
    except ImportError:
        sys.path.insert(0, str(REPO))
        from tracer.importers import torch_snapshot
    return torch_snapshot


def stack_depth() -> int:
    frame, n = sys._getframe(1), 0
    while frame is not None:
        n, frame = n + 1, frame.f_back
    return n


def at_depth(fn, *args):
    """``fn(*args)`` called with DEPTH Python frames on the stack, counting fn's own."""
    if stack_depth() + 1 < DEPTH:
        return at_depth(fn, *args)
    return fn(*args)


def pairs(n: int, prefill: int = 0) -> tuple[int, int]:
    """ns for ``n`` alloc+free pairs (after ``prefill`` untimed ones) and this frame's stack depth."""
    empty, u8, dev = torch.empty, torch.uint8, DEV
    for _ in range(prefill):
        x = empty(BLOCK_BYTES, dtype=u8, device=dev)
        del x
    t0 = time.perf_counter_ns()
    for _ in range(n):
        x = empty(BLOCK_BYTES, dtype=u8, device=dev)
        del x
    return time.perf_counter_ns() - t0, stack_depth()


def history_on(context: str | None, max_entries: int, skip: bool = False) -> None:
    kw = {"enabled": "all", "context": context, "stacks": "python", "max_entries": max_entries}
    if CAN_CLEAR:
        kw["clear_history"] = True
    if skip and CAN_SKIP:
        kw["skip_actions"] = ["free_requested"]
    torch.cuda.memory._record_memory_history(**kw)


def history_off() -> None:
    torch.cuda.memory._record_memory_history(enabled=None)


def rss_bytes() -> int:
    gc.collect()
    torch.cuda.synchronize()
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def malloc_trim() -> bool:
    try:
        return bool(ctypes.CDLL("libc.so.6").malloc_trim(0))
    except (OSError, AttributeError):
        return False


def attempt(fn, *args):
    """``fn(*args)``, or ``{"error": ...}`` if it raised (the history is switched off again)."""
    try:
        return fn(*args)
    except Exception as exc:
        try:
            history_off()
        except Exception:
            pass
        return {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=4)}


def one_pair_cost(name: str, n: int, max_entries: int) -> dict:
    context, skip = CONFIGS[name]
    full = name == "held_full_ring"
    if name != "off":
        history_on(context, FULL_RING if full else max_entries, skip)
    try:
        ns, depth = at_depth(pairs, n, FULL_RING if full else 0)
    finally:
        history_off()
    return {"ns_per_pair": ns / n, "depth": depth}


def one_rss(context: str | None, m: int) -> dict:
    history_off()
    malloc_trim()
    before = rss_bytes()
    history_on(context, m, True)
    at_depth(pairs, m // 2 + 1000)
    filled = rss_bytes()
    history_off()
    after_off = rss_bytes()
    history_on(context, m, True)  # clear_history, in case disabling alone kept the entries
    history_off()
    after_clear = rss_bytes()
    trimmed = malloc_trim()
    after_trim = rss_bytes()
    return {
        "rss_before": before,
        "rss_filled": filled,
        "rss_after_off": after_off,
        "rss_after_clear": after_clear,
        "rss_after_malloc_trim": after_trim,
        "malloc_trim_released": trimmed,
        "bytes_per_entry": (filled - before) / m,
        "kept_after_trim_bytes": after_trim - before,
    }


def rss_in_children(out_dir: Path, m: int) -> dict:
    """``one_rss`` for each context and round, each in a fresh process (a ring's freed memory may stay
    with the process and be reused by the next ring), all at once: VmRSS is per process."""
    procs = {}
    for r in range(RSS_ROUNDS):
        for name in RSS_CONFIGS:
            cmd = [sys.executable, __file__, str(out_dir), "--rss-child", str(CONFIGS[name][0]), str(m)]
            procs[name, r] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rss: dict[str, list] = {name: [] for name in RSS_CONFIGS}
    for (name, _), proc in procs.items():
        try:
            stdout, stderr = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        try:
            rss[name].append(json.loads(stdout.strip().splitlines()[-1]))
        except (ValueError, IndexError):
            rss[name].append({"error": f"child exited {proc.returncode} with no result", "stderr": stderr[-2000:]})
    return rss


def rss_child(context: str, m: int) -> int:
    at_depth(pairs, 1000)  # CUDA context and the cached block exist before the first reading
    print(json.dumps(attempt(one_rss, None if context == "None" else context, m)))
    return 0


def one_snapshot(context: str | None, k: int, max_entries: int, converter) -> dict:
    history_on(context, max_entries, True)
    try:
        at_depth(pairs, k // 2 + 1)
        t0 = time.perf_counter()
        snap = torch.cuda.memory._snapshot()
        snapshot_s = time.perf_counter() - t0
    finally:
        history_off()
    entries = snap["device_traces"][DEV.index]
    t0 = time.perf_counter()
    events = converter.entries_to_events(entries, converter.Interner())
    convert_s = time.perf_counter() - t0
    n = len(entries)
    del snap, entries
    gc.collect()
    return {
        "entries": n,
        "events": len(events),
        "snapshot_s": snapshot_s,
        "convert_s": convert_s,
        "snapshot_us_per_entry": snapshot_s / n * 1e6,
        "convert_us_per_entry": convert_s / n * 1e6,
        "total_us_per_entry": (snapshot_s + convert_s) / n * 1e6,
    }


def median_of(rounds: list, key: str):
    values = [r[key] for r in rounds if isinstance(r, dict) and key in r]
    return statistics.median(values) if values else None


def measure(args, out: dict) -> None:
    quick = args.quick
    n, m = (20_000, 200_000) if quick else (100_000, 1_000_000)
    ks = [50_000] if quick else [100_000, 500_000]
    rounds = 3 if quick else 5
    out["params"] = {"depth": DEPTH, "N": n, "M": m, "K": ks, "rounds": rounds, "full_ring_entries": FULL_RING}
    converter = import_converter()
    at_depth(pairs, 1000)  # the block is cached before timing
    warm = attempt(one_snapshot, "alloc", 3000, m, converter)  # a process's first snapshot can take seconds
    out["first_snapshot"] = warm

    per_pair = {name: [] for name in CONFIGS}
    for _ in range(rounds):
        for name in CONFIGS:
            per_pair[name].append(attempt(one_pair_cost, name, n, m))
    out["per_pair_ns"] = {k: {"rounds": v, "median": median_of(v, "ns_per_pair")} for k, v in per_pair.items()}

    rss = rss_in_children(args.out_dir, m)
    out["rss"] = {k: {"rounds": v, "median_bytes_per_entry": median_of(v, "bytes_per_entry")} for k, v in rss.items()}

    snaps = {(name, k): [] for k in ks for name in RSS_CONFIGS}
    for _ in range(3):
        for (name, k), runs in snaps.items():
            runs.append(attempt(one_snapshot, CONFIGS[name][0], k, max(m, k + 1000), converter))
    out["snapshot"] = {}
    for (name, k), v in snaps.items():
        keys = ("entries", "snapshot_s", "convert_s", "total_us_per_entry")
        out["snapshot"][f"{name}/{k}"] = {"rounds": v, **{f"median_{key}": median_of(v, key) for key in keys}}

    ns = {k: v["median"] for k, v in out["per_pair_ns"].items()}
    out["summary"] = {
        "ns_per_pair": ns,
        "overhead_ns_over_off": {k: v - ns["off"] for k, v in ns.items() if k != "off" and None not in (v, ns["off"])},
        "bytes_per_ring_entry": {k: v["median_bytes_per_entry"] for k, v in out["rss"].items()},
        "snapshot_convert_us_per_entry": {
            name: {str(k): out["snapshot"][f"{name}/{k}"]["median_total_us_per_entry"] for k in ks}
            for name in RSS_CONFIGS
        },
    }


def has_error(doc) -> bool:
    if isinstance(doc, dict):
        return "error" in doc or any(has_error(v) for v in doc.values())
    return isinstance(doc, list) and any(has_error(v) for v in doc)


def main() -> int:
    global DEV, CAN_CLEAR, CAN_SKIP
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--quick", action="store_true", help="smaller counts (under ~20 s)")
    parser.add_argument("--rss-child", nargs=2, metavar=("CONTEXT", "M"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if torch is None or not torch.cuda.is_available():
        print(
            "serving_ring_cost: no CUDA device (torch missing or torch.cuda.is_available() is False)", file=sys.stderr
        )
        return 2
    DEV = torch.device("cuda", torch.cuda.current_device())
    params = inspect.signature(torch.cuda.memory._record_memory_history).parameters
    CAN_CLEAR, CAN_SKIP = "clear_history" in params, "skip_actions" in params
    if args.rss_child:
        return rss_child(args.rss_child[0], int(args.rss_child[1]))
    t0 = time.perf_counter()
    out = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(DEV),
        "python": platform.python_version(),
        "clear_history_supported": CAN_CLEAR,
        "skip_actions_supported": CAN_SKIP,
        "quick": args.quick,
    }
    try:
        measure(args, out)
    except Exception as exc:  # outside any one measurement: keep what was measured
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc()
    out["elapsed_s"] = round(time.perf_counter() - t0, 2)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    path = args.out_dir / "serving-ring-cost.json"
    path.write_text(json.dumps(out, indent=2, default=str) + "\n")

    s = out.get("summary", {})
    print(f"{out['device']}, torch {out['torch']}, Python {out['python']}, depth {DEPTH}: {out['elapsed_s']} s")
    for key in ("ns_per_pair", "overhead_ns_over_off", "bytes_per_ring_entry"):
        print(
            f"  {key}: " + ", ".join(f"{k} {v:.0f}" if v is not None else f"{k} -" for k, v in s.get(key, {}).items())
        )
    for name, by_k in s.get("snapshot_convert_us_per_entry", {}).items():
        print(
            f"  snapshot+convert us/entry {name}: "
            + ", ".join(f"K={k} " + (f"{v:.2f}" if v else "-") for k, v in by_k.items())
        )
    failed = has_error(out)
    print(f"wrote {path}" + (" (some measurements failed: see 'error' in the JSON)" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
