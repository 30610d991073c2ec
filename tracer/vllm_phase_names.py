"""The registry of vLLM's start-up phase names: the one spelling of each name every layer reads.

The plugin marks these phases around vLLM's functions (``plugins/surface.py`` says which function in
which release); reports, diffs and the capacity models find phases by these names. Like
:mod:`memtrace.facts` for fact keys, this module imports nothing of memtrace, so every layer (analysis
included) can import it; ``tests/unit/test_vllm_phase_names.py`` fails on a bare phase-name string
anywhere else in the code.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PhaseName:
    """One vLLM start-up phase: its name, the phase it nests in (None at the top) and what it is."""

    name: str
    parent: str | None
    doc: str


REGISTRY: dict[str, PhaseName] = {}


def _phase(name: str, parent: str | None, doc: str) -> str:
    REGISTRY[name] = PhaseName(name, parent, doc)
    return name


INIT_DEVICE = _phase("init_device", None, "the worker takes its device; the free memory it sees here sets the target")
LOAD_MODEL = _phase("load_model", None, "the model's weights are loaded onto the device")
DETERMINE_AVAILABLE_MEMORY = _phase(
    "determine_available_memory", None, "vLLM profiles a forward pass and sizes the KV cache from what is left"
)
PROFILE_RUN = _phase("profile_run", DETERMINE_AVAILABLE_MEMORY, "the dummy forward pass at the largest batch")
CUDAGRAPH_PROFILE = _phase(
    "cudagraph_profile", DETERMINE_AVAILABLE_MEMORY, "what CUDA-graph capture will hold, measured beforehand"
)
KV_CACHE_INIT = _phase("kv_cache_init", None, "the KV cache is allocated (reserved only, with the extensible cache)")
COMPILE_OR_WARM_UP = _phase("compile_or_warm_up", None, "compilation, kernel warm-up and CUDA-graph capture")
KERNEL_WARMUP = _phase("kernel_warmup", COMPILE_OR_WARM_UP, "attention and GEMM kernels run once (FlashInfer autotune)")
WARMUP_KERNELS = _phase("warmup_kernels", COMPILE_OR_WARM_UP, "the model's forward at each compile size, warmed")
KV_CACHE_SIZING_WARMUP = _phase(
    "kv_cache_sizing_warmup", COMPILE_OR_WARM_UP, "0.34's extensible cache: a warm-up whose peak sizes the KV cache"
)
CAPTURE_MODEL = _phase("capture_model", COMPILE_OR_WARM_UP, "CUDA graphs captured at the batch sizes to serve")
KV_CACHE_SIZING = _phase(
    "kv_cache_sizing", COMPILE_OR_WARM_UP, "0.34's extensible cache: the free memory measured, the blocks counted"
)
KV_CACHE_EXTEND = _phase("kv_cache_extend", None, "0.34's extensible cache: the KV pages committed through CUDA's VMM")

#: Not a phase: where vLLM's engine checks the KV cache it may size, between determine_available_memory and
#: kv_cache_init (``get_kv_cache_configs``: "No available memory for the cache blocks", "To serve at least one
#: request ..."), the profiled cache and 0.34's extensible address range alike; vLLM refuses there.
KV_SIZING_CHECK = "KV sizing (after determine_available_memory)"


def path(name: str) -> str:
    """The phase path of ``name`` as vLLM nests it (``compile_or_warm_up/kv_cache_sizing``), the way a recorded
    trace names where a start-up stops (``analysis.memory.phases.phase_path``); an unregistered name as given."""
    chain = [name]
    while (p := REGISTRY.get(chain[-1])) is not None and p.parent is not None:
        chain.append(p.parent)
    return "/".join(reversed(chain))
