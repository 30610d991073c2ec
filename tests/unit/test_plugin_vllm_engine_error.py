"""vLLM 0.34 refusing to start in its engine, after the worker's hooked phases returned, is still named.

The H100 rescue ``cold-gemma3-0`` (vLLM 0.34.0, uni executor): ``EngineCore._initialize_kv_caches`` called
``finalize_extensible_kv_cache`` after ``compile_or_warm_up`` had returned, and it raised ValueError ("No
available memory for the cache blocks"). No phase hook saw it, so the trace had no ``vllm.startup_error``.
vLLM 0.34's ``vllm/v1/engine/core.py`` binds the function by name (``from vllm.v1.core.kv_cache_planning
import finalize_extensible_kv_cache``): the modules here do the same, in the same order.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
import uuid

import pytest
from memtrace import facts as F
from memtrace import vllm_phase_names as PN
from memtrace.plugins import vllm_phases
from memtrace.plugins.hooks import SENTINEL, HookManager
from memtrace.plugins.surface import of_role

MESSAGE = (
    "No available memory for the cache blocks. The extensible KV cache already takes all device memory left after "
    "the model, its activations, CUDA graphs and warmup; decrease `max_model_len` or `max_num_seqs`."
)


class _Session:
    """Stands in for the capture session (its facts): the hook runs only inside a real vLLM process."""

    def __init__(self):
        self.facts: dict = {}

    def set_fact(self, key, value):
        self.facts[key] = value


@pytest.fixture
def engine(tmp_path, monkeypatch):
    """``planning.finalize_extensible_kv_cache`` raises vLLM's error (``blocks`` 0) or returns ``blocks``;
    ``core`` imports it by name, as vLLM 0.34's engine does."""
    name = f"fake034_{uuid.uuid4().hex[:8]}"
    root = tmp_path / name
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "planning.py").write_text(
        textwrap.dedent(f"""
        def finalize_extensible_kv_cache(vllm_config, kv_cache_configs, scheduler_kv_cache_config, times):
            if vllm_config["blocks"] <= 0:
                raise ValueError({MESSAGE!r} + " See https://docs.vllm.ai/ for more details.\\nsecond line")
            return vllm_config["blocks"]
        """)
    )
    (root / "core.py").write_text(
        "from .planning import finalize_extensible_kv_cache\n\n"
        "def initialize_kv_caches(blocks):\n"
        "    return finalize_extensible_kv_cache({'blocks': blocks}, [], None, [])\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    session = _Session()
    monkeypatch.setattr(vllm_phases, "session", lambda: session)
    entry = next(e for e in of_role("engine-error") if e.qualname == "finalize_extensible_kv_cache")
    manager = HookManager()
    manager.add(f"{name}.planning:finalize_extensible_kv_cache", entry.build(None))  # before vLLM imports it
    yield importlib.import_module(f"{name}.core"), session
    manager.unpatch()
    for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[mod]


def test_the_engines_refusal_after_warm_up_is_kept_and_raised_unchanged(engine):
    core, session = engine
    assert getattr(core.finalize_extensible_kv_cache, SENTINEL, None)  # the engine's own binding is the hooked one
    with pytest.raises(ValueError) as raised:
        core.initialize_kv_caches(0)
    assert str(raised.value).endswith("for more details.\nsecond line")  # vLLM's error object, untouched
    assert raised.type is ValueError
    assert session.facts[F.VLLM_STARTUP_ERROR] == {
        "phase": PN.KV_CACHE_SIZING,
        "type": "ValueError",
        "message": MESSAGE + " See https://docs.vllm.ai/ for more details.",
    }


def test_a_kv_cache_that_fits_records_nothing_and_returns_vllms_blocks(engine):
    core, session = engine
    assert core.initialize_kv_caches(1234) == 1234
    assert session.facts == {}


def test_an_error_a_phase_kept_first_is_not_replaced(engine):
    core, session = engine
    session.facts[F.VLLM_STARTUP_ERROR] = {"phase": PN.CAPTURE_MODEL, "type": "RuntimeError", "message": "first"}
    with pytest.raises(ValueError):
        core.initialize_kv_caches(0)
    assert session.facts[F.VLLM_STARTUP_ERROR]["message"] == "first"


def test_the_entry_is_hooked_for_034_only_and_no_trace_relies_on_it():
    entry = next(e for e in of_role("engine-error"))
    assert entry.path == "vllm.v1.core.kv_cache_planning:finalize_extensible_kv_cache"
    assert entry.applies_to((0, 34)) and not entry.applies_to((0, 33)) and not entry.required
