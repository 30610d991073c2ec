"""HookCall recording: arguments, distinct-storage bytes, nesting. FlashInfer's b12x allocators need
the CUTLASS DSL and a GPU, so a stand-in module with the same call shape (keyword-only arguments,
a dataclass of tensors with views, a dispatcher calling a sibling) is used here, named as such; the
real allocator runs in tests/data/vllm-h200/flashinfer_probe.py on the H200."""

from __future__ import annotations

import importlib
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from memtrace.plugins import flashinfer as fi  # noqa: E402
from memtrace.plugins import surface  # noqa: E402
from memtrace.plugins.hooks import HookManager  # noqa: E402

STANDIN = """
from dataclasses import dataclass, field
import torch

@dataclass
class Workspace:
    rows: int
    packed: torch.Tensor
    scale: torch.Tensor
    counts: torch.Tensor
    extra: dict = field(default_factory=dict)

def allocate_dynamic_workspace(*, state_E, routed_rows, k, device, dtype=torch.uint8):
    packed = torch.empty(routed_rows, k // 2, dtype=dtype, device=device)
    ws = Workspace(routed_rows, packed, torch.empty(routed_rows, 8, dtype=torch.uint8, device=device),
                   torch.zeros(state_E, dtype=torch.int32, device=device))
    ws.packed_view = ws.packed.view(-1)          # a view added after __init__: same storage
    ws.extra["again"] = ws.scale[1:]            # another view
    return ws

def allocate_moe_workspace(*, state_E, routed_rows, k, device):
    return allocate_dynamic_workspace(state_E=state_E, routed_rows=routed_rows, k=k, device=device)

class Wrapper:
    def __init__(self):
        self._static_workspace = None
        self._moe_output = None
    def _allocate_buffers(self):
        self._static_workspace = allocate_dynamic_workspace(state_E=2, routed_rows=4, k=8, device="cpu")
        self._moe_output = torch.empty(4, 16, dtype=torch.bfloat16)
"""


@pytest.fixture
def standin(tmp_path, monkeypatch):
    name = f"fi_standin_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(STANDIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_distinct_storage_bytes_counts_each_storage_once():
    a = torch.empty(10, 4, dtype=torch.float32)
    b = torch.empty(3, dtype=torch.int64)
    assert fi.distinct_storage_bytes((a, a.view(-1), a[2:], {"b": b, "again": [b]})) == 160 + 24
    assert fi.distinct_storage_bytes({"n": 3, "s": "x"}) is None


def test_a_call_records_args_bytes_and_nested_calls_with_parents(standin):
    calls = []

    def sink(call):
        calls.append(call)
        return len(calls) - 1

    manager = HookManager()
    manager.add(f"{standin}:allocate_moe_workspace", fi.HookCallRecorder(f"{standin}:allocate_moe_workspace", sink))
    manager.add(
        f"{standin}:allocate_dynamic_workspace", fi.HookCallRecorder(f"{standin}:allocate_dynamic_workspace", sink)
    )
    mod = importlib.import_module(standin)
    ws = mod.allocate_moe_workspace(state_E=4, routed_rows=64, k=32, device=torch.device("cpu"))
    assert ws.rows == 64
    outer, inner = calls
    assert outer.name.endswith(":allocate_moe_workspace") and outer.parent is None
    assert inner.name.endswith(":allocate_dynamic_workspace") and inner.parent == 0
    assert outer.args == {"state_E": 4, "routed_rows": 64, "k": 32, "device": "cpu"}
    expected = 64 * 16 + 64 * 8 + 4 * 4  # packed u8[64,16], scale u8[64,8], counts i32[4]; views add nothing
    assert outer.returned_bytes == inner.returned_bytes == expected
    assert outer.start_us <= inner.start_us <= inner.end_us <= outer.end_us
    assert outer.allocated_delta_bytes is None  # no CUDA here: no allocator counters
    manager.unpatch()


def test_a_method_returning_none_is_measured_by_its_result_attributes(standin):
    calls = []
    manager = HookManager()
    path = f"{standin}:Wrapper._allocate_buffers"
    manager.add(
        path, fi.HookCallRecorder(path, calls.append, ("_static_workspace", "_dynamic_workspace", "_moe_output"))
    )
    mod = importlib.import_module(standin)
    mod.Wrapper()._allocate_buffers()
    (call,) = calls
    assert call.args == {}
    assert call.returned_bytes == (4 * 4 + 4 * 8 + 2 * 4) + 4 * 16 * 2
    manager.unpatch()


def test_an_error_of_the_allocator_is_recorded_and_raised(standin):
    calls = []
    manager = HookManager()
    path = f"{standin}:allocate_dynamic_workspace"
    manager.add(path, fi.HookCallRecorder(path, calls.append))
    mod = importlib.import_module(standin)
    with pytest.raises(TypeError):
        mod.allocate_dynamic_workspace(state_E=1, routed_rows=1, k=2)  # device missing
    assert calls[0].error.startswith("TypeError") and calls[0].returned_bytes is None
    manager.unpatch()


def test_tensor_and_dtype_arguments_are_summarized():
    t = torch.zeros(2, 3, dtype=torch.float16)
    assert fi.summarize_arg(t) == {"shape": [2, 3], "dtype": "float16", "device": "cpu"}
    assert fi.summarize_arg(torch.bfloat16) == "bfloat16"
    assert fi.summarize_arg((1, 2, 3)) == [1, 2, 3]
    assert fi.summarize_arg(list(range(100))) == "list[100]"
    assert fi.summarize_arg(object()) == "<object>"


def test_keyword_catch_alls_are_spread_into_the_args():
    def allocate(state_E, *, k, **rest):
        return None

    assert fi.bound_args(allocate, (4,), {"k": 2, "backend": "dynamic", "device": torch.device("cpu")}) == {
        "state_E": 4,
        "k": 2,
        "backend": "dynamic",
        "device": "cpu",
    }


def test_user_targets_come_from_memtrace_hooks():
    good, bad = fi.user_targets("a.b:f, c.d:K.m,,nonsense")
    assert good == ["a.b:f", "c.d:K.m"]
    assert len(bad) == 1 and "nonsense" in bad[0]


def test_default_targets_cover_the_06_and_07_allocators():
    paths = [e.path for e in surface.of_role("workspace")]
    dispatch = "flashinfer.fused_moe.cute_dsl.blackwell_sm12x.moe_dispatch"
    for func in (
        "allocate_sm120_dynamic_workspace",
        "allocate_sm120_static_workspace",
        "allocate_sm120_moe_workspace",
        "_allocate_sm120_w4a16_workspace",
    ):
        assert f"{dispatch}:{func}" in paths
    assert "flashinfer.fused_moe.cute_dsl.b12x_moe:B12xMoEWrapper._allocate_buffers" in paths
    assert "b12x.moe.fused_moe._impl:_allocate_core_arena" in paths


# -- FlashInfer 0.6.13's real allocator, hooked on an H200 (tests/data/vllm-h200/flashinfer_probe.py) --

REAL = Path(__file__).resolve().parents[1] / "data" / "vllm-h200" / "flashinfer-probe"
DISPATCH = "flashinfer.fused_moe.cute_dsl.blackwell_sm12x.moe_dispatch"


def test_real_b12x_dynamic_workspace_bytes_are_the_sum_of_its_storages():
    from memtrace.store import load_run

    (trace,) = load_run(REAL).traces
    calls = trace.hook_calls
    names = [(c.name.split(":")[-1], c.parent) for c in calls]
    assert names == [
        ("allocate_sm120_dynamic_workspace", None),  # through the module
        ("allocate_sm120_dynamic_workspace", None),  # through the package's re-export
        ("allocate_sm120_moe_workspace", None),
        ("allocate_sm120_dynamic_workspace", 2),  # nested in the dispatcher
    ]
    args = {"state_E": 128, "weight_E": 128, "routed_rows": 65536, "k": 2048, "n": 768, "num_topk": 8, "device": "cuda"}
    for c in calls:
        assert c.name.startswith(DISPATCH) and c.error is None
        assert c.returned_bytes == 94_974_860  # the 0.6.13 tensor list for this shape, byte for byte
        assert {k: c.args[k] for k in args} == args
        assert c.allocated_delta_bytes >= c.returned_bytes  # rounded to the allocator's blocks
    assert calls[0].allocated_delta_bytes == 95_110_144
    assert calls[3].start_us >= calls[2].start_us and calls[3].end_us <= calls[2].end_us
    assert trace.facts["env"]["flashinfer"] == "0.6.13"
