"""vLLM's own copy list (``vllm.ray.ray_env.get_env_vars_to_copy``, what its Ray executor hands each worker)
holds every memtrace switch once vLLM has loaded the plugin, keeps the user's own prefixes, and loads the
same plugins as without memtrace; vLLM's torch.compile cache key (``vllm.envs.compile_factors``, every
registered ``VLLM_*`` variable) is the same as without memtrace. Each case is a fresh process that loads
vLLM's general plugins as vLLM does."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.vllm

SWITCHES = {
    "MEMTRACE": "1",
    "MEMTRACE_DIR": "/runs/x",
    "MEMTRACE_UNTIL": "exit",
    "MEMTRACE_STACKS": "none",
    "MEMTRACE_HOOKS": "pkg.mod:func",
    "MEMTRACE_CUPTI": "0",
    "MEMTRACE_CUPTI_STACKS": "0",
    "MEMTRACE_CMDLINE": '["vllm", "serve"]',
}
USER = {"VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY": "MYCO_, OTHER_", "MYCO_TOKEN_PATH": "/t", "OTHER_X": "1"}

PROBE = """
import json, os
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.ray.ray_env import get_env_vars_to_copy
from vllm.plugins import load_plugins_by_group
from vllm.ray import ray_env
import vllm.v1.engine.utils as engine_utils
import vllm.envs as envs
copied = get_env_vars_to_copy(destination="workers")
by_name = engine_utils.get_env_vars_to_copy(destination="workers")  # the DP engine launcher's binding
print(json.dumps({
    "copied": sorted(n for n in copied if n in os.environ),
    "copied_by_name": sorted(n for n in by_name if n in os.environ),
    "compile_factors": repr(sorted(envs.compile_factors().items())),
    "prefixes": os.environ.get("VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY"),
    "vllm_plugins": os.environ.get("VLLM_PLUGINS"),
    "general_plugins": sorted(load_plugins_by_group("vllm.general_plugins")),
}))
"""


def _probe(tmp_path, env: dict[str, str]) -> dict:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("MEMTRACE", "VLLM_", "MYCO_", "OTHER_"))}
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        env={**base, "VLLM_NO_USAGE_STATS": "1", **env},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_every_memtrace_switch_reaches_vllms_ray_workers_with_the_users_prefixes_kept(tmp_path, vllm_ready):
    got = _probe(tmp_path, {**SWITCHES, **USER})
    for name in [*SWITCHES, "MEMTRACE_DRIVER_HOST", "MYCO_TOKEN_PATH", "OTHER_X"]:
        assert name in got["copied"], name
    assert got["copied_by_name"] == got["copied"]
    assert got["prefixes"] == "MYCO_, OTHER_"  # the user's list, untouched
    assert got["vllm_plugins"] is None  # which plugins vLLM loads is left to vLLM
    without = _probe(tmp_path, USER)
    assert got["general_plugins"] == without["general_plugins"] and "memtrace" in got["general_plugins"]
    # torch.compile's cache key: a traced start-up reuses what an untraced one compiled (and vice versa)
    assert got["compile_factors"] == without["compile_factors"]


def test_without_the_plugin_vllm_would_drop_every_memtrace_switch(tmp_path, vllm_ready):
    """The control: memtrace installed but not switched on (no MEMTRACE=1), the same variables are not copied."""
    switches = {k: v for k, v in SWITCHES.items() if k not in ("MEMTRACE", "MEMTRACE_DIR")}
    got = _probe(tmp_path, {**switches, **USER})
    assert not [n for n in got["copied"] if n.startswith("MEMTRACE")]
    assert got["prefixes"] == "MYCO_, OTHER_"
    assert "MYCO_TOKEN_PATH" in got["copied"]
