"""``memtrace run`` does not change which plugins vLLM loads (issue 11, item 4).

``VLLM_PLUGINS`` is vLLM's allow-list for every plugin group. The command here asks vLLM's own loader
(``vllm.plugins.load_plugins_by_group``, what ``load_general_plugins`` and the platform resolution
call) which plugins it loads, once as it is and once under ``memtrace run``, for the settings users
have: ``VLLM_PLUGINS`` unset, and set to one of vLLM's own plugins.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.vllm

PROBE = (
    "import json, vllm.plugins as p\n"
    "print('PLUGINS', json.dumps({g: sorted(p.load_plugins_by_group(getattr(p, g)))"
    " for g in ('DEFAULT_PLUGINS_GROUP', 'PLATFORM_PLUGINS_GROUP')}))\n"
)


def _loaded(tmp_path, vllm_plugins: str | None, wrapped: bool) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMTRACE", "VLLM_PLUGINS"))}
    if vllm_plugins is not None:
        env["VLLM_PLUGINS"] = vllm_plugins
    command = [sys.executable, "-c", PROBE]
    if wrapped:
        command = [sys.executable, "-m", "memtrace", "run", "--dir", str(tmp_path / "run"), "--", *command]
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("PLUGINS "))
    return json.loads(line.removeprefix("PLUGINS ")), out.stderr


def test_with_vllm_plugins_unset_vllm_loads_what_it_loads_without_memtrace(vllm_ready, tmp_path):
    plain, _ = _loaded(tmp_path, None, wrapped=False)
    traced, err = _loaded(tmp_path, None, wrapped=True)
    assert traced == plain
    assert {"lora_filesystem_resolver", "lora_hf_hub_resolver", "memtrace"} <= set(plain["DEFAULT_PLUGINS_GROUP"])
    assert "VLLM_PLUGINS" not in err


def test_a_users_vllm_plugins_keeps_its_plugins_plus_memtrace_and_says_so(vllm_ready, tmp_path):
    plain, _ = _loaded(tmp_path, "lora_filesystem_resolver", wrapped=False)
    traced, err = _loaded(tmp_path, "lora_filesystem_resolver", wrapped=True)
    assert plain["DEFAULT_PLUGINS_GROUP"] == ["lora_filesystem_resolver"]
    assert traced["DEFAULT_PLUGINS_GROUP"] == ["lora_filesystem_resolver", "memtrace"]
    assert traced["PLATFORM_PLUGINS_GROUP"] == plain["PLATFORM_PLUGINS_GROUP"]
    assert "VLLM_PLUGINS='lora_filesystem_resolver' is vLLM's allow-list" in err
    assert "'lora_filesystem_resolver,memtrace'" in err
