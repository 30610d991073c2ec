"""The pure part of tests/gpu/seed_b12x.py: what vLLM 0.25.1 passes to FlashInfer's b12x wrapper and
allocators for the seed's model, and FlashInfer 0.6.13's bytes for it (the GPU run measures them)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("seed_b12x", TESTS / "gpu" / "seed_b12x.py")
seed = importlib.util.module_from_spec(_spec)
sys.modules["seed_b12x"] = seed  # dataclasses look their module up
_spec.loader.exec_module(seed)

MODEL = seed.SEED_MODEL


def test_the_wrapper_gets_vllm_0251_arguments_for_the_seed():
    assert seed.wrapper_kwargs(MODEL, 8192) == {
        "num_experts": 256,
        "top_k": 8,
        "hidden_size": 2048,
        "intermediate_size": 512,
        "use_cuda_graph": True,
        "max_num_tokens": 8192,  # max_num_batched_tokens; --max-num-seqs plays no part
        "num_local_experts": 256,
        "activation": "silu",
    }


def test_allocate_buffers_asks_for_a_static_workspace_capped_at_the_cutover_and_a_dynamic_one():
    static, dynamic = seed.allocator_calls(MODEL, 8192, cutover_pairs=640)
    assert static["backend"] == "static" and static["max_rows"] == 640  # min(8192 x 8, 640)
    assert dynamic["backend"] == "dynamic" and dynamic["routed_rows"] == 65536
    assert {static["state_E"], static["weight_E"], static["k"], static["n"], static["num_topk"]} == {256, 2048, 512, 8}
    # below the cutover there is only a static workspace, sized for every routed row
    (only,) = seed.allocator_calls(MODEL, 64, cutover_pairs=640)
    assert only == {**static, "max_rows": 512}
    # a 0.7.x-style larger cutover changes the static rows, not the dynamic call
    assert seed.allocator_calls(MODEL, 8192, cutover_pairs=1024)[0]["max_rows"] == 1024


def test_dynamic_prediction_matches_the_real_0613_allocator_on_the_h200():
    # tests/data/vllm-h200/flashinfer-probe: allocate_sm120_dynamic_workspace(state_E=128, weight_E=128,
    # routed_rows=65536, k=2048, n=768, num_topk=8) returned 94,974,860 B of distinct storages on the H200
    log = (TESTS / "data" / "vllm-h200" / "flashinfer-probe" / "flashinfer-probe.log").read_text()
    measured = {int(x.split("returned_bytes=")[1].split()[0]) for x in log.splitlines() if "returned_bytes=" in x}
    assert measured == {94_974_860}
    args = json.loads(log.split("args=")[1].splitlines()[0].replace("'", '"'))
    assert seed.dynamic_0613_bytes(**args) == 94_974_860


def test_seed_prediction_per_layer_and_for_40_layers():
    exp = seed.expected_0613_bytes(MODEL, 8192)
    assert exp["static"] == 256 * 640 * 1024 + 256 * 640 * 128 + 2 * 4 * 256 * 640 + 4 * (256 + 3 + 256 + 256 + 640)
    assert exp["static"] == 190_060_044
    assert exp["dynamic"] == 113_963_964  # 767 tiles of 128 rows: 98,176 rows x (1024 + 128 + 8) B + task queues
    assert exp["output"] == 33_554_432  # bf16 [8192, 2048]
    assert exp["one_layer"] == 337_578_440
    assert exp["all_layers"] == 40 * 337_578_440 == 13_503_137_600  # 12.58 GiB against the seed's 11.47 GiB


@pytest.mark.parametrize("rows", [1, 127, 128, 129, 640, 65536])
def test_dynamic_tiles_follow_0613_geometry(rows):
    # T = ceil(R / 128) + min(E, R) - 1 tiles of 128 rows; one task per (tile, 128-column slice of n)
    b = seed.dynamic_0613_bytes(state_E=4, routed_rows=rows, k=256, n=256)
    tiles = -(-rows // 128) + min(4, rows) - 1
    assert b == tiles * 128 * (128 + 16 + 8) + 4 * (4 + 2 + 4 + 5 + 5 + 6 * tiles * 2 + tiles)


# -- the GPU script's control flow, over FAKE FlashInfer modules (this machine has no GPU) --------------------


class _FakeWrapper:
    """FAKE B12xMoEWrapper: records its arguments; ``refuse`` makes it raise as on an unsupported GPU."""

    made: list = []
    refuse = False

    def __init__(self, num_experts, top_k, hidden_size, intermediate_size, **kw):
        if _FakeWrapper.refuse:
            raise RuntimeError("b12x needs SM120")
        self.kw = {"num_experts": num_experts, "top_k": top_k, "hidden_size": hidden_size,
                   "intermediate_size": intermediate_size, **kw}  # fmt: skip
        self._static_workspace = kw.get("shared_static_workspace") or object()
        self._dynamic_workspace = kw.get("shared_dynamic_workspace") or object()
        self._moe_output = kw.get("shared_output") or object()
        _FakeWrapper.made.append(self)


def _fake_flashinfer(monkeypatch, cutover_signature):
    import types

    calls: list = []
    b12x = types.ModuleType("flashinfer.fused_moe.cute_dsl.b12x_moe")
    b12x.B12xMoEWrapper = _FakeWrapper
    dispatch = types.ModuleType("flashinfer.fused_moe.cute_dsl.blackwell_sm12x.moe_dispatch")

    def allocate_sm120_moe_workspace(*, state_E, weight_E, k, n, num_topk, device, max_rows=None, routed_rows=None,
                                     quant_mode=None, activation_precision=None, backend=None, activation="silu"):  # fmt: skip
        calls.append({"backend": backend, "max_rows": max_rows, "routed_rows": routed_rows, "device": device})
        return object()

    dispatch.allocate_sm120_moe_workspace = allocate_sm120_moe_workspace
    dispatch._get_static_compact_cutover_pairs = cutover_signature
    cute = types.ModuleType("flashinfer.fused_moe.cute_dsl")
    cute.b12x_moe = b12x
    sm12x = types.ModuleType("flashinfer.fused_moe.cute_dsl.blackwell_sm12x")
    sm12x.moe_dispatch = dispatch
    for name, mod in {"flashinfer": types.ModuleType("flashinfer"), "flashinfer.fused_moe": types.ModuleType("x"),
                      "flashinfer.fused_moe.cute_dsl": cute, "flashinfer.fused_moe.cute_dsl.b12x_moe": b12x,
                      "flashinfer.fused_moe.cute_dsl.blackwell_sm12x": sm12x,
                      "flashinfer.fused_moe.cute_dsl.blackwell_sm12x.moe_dispatch": dispatch}.items():  # fmt: skip
        monkeypatch.setitem(sys.modules, name, mod)
    return calls


class _FakeTorch:
    """FAKE torch: cuda devices and empty tensors as plain records."""

    bfloat16 = "bfloat16"
    empties: list = []

    @staticmethod
    def device(name):
        return name

    @staticmethod
    def empty(shape, dtype, device):
        _FakeTorch.empties.append((shape, dtype, device))
        return object()


def _args(**kw):
    import argparse

    base = {"layers": 40, "max_num_batched_tokens": 8192, "shared": False, "mode": "auto"}
    return argparse.Namespace(**{**base, **kw})


def test_one_wrapper_per_layer_with_vllms_arguments_FAKE_flashinfer(monkeypatch):
    import memtrace

    _FakeWrapper.made, _FakeWrapper.refuse = [], False
    _fake_flashinfer(monkeypatch, lambda activation_precision="fp4": 640)
    how, keep = seed._build_layers(_args(), MODEL, _FakeTorch, memtrace)
    assert how == "B12xMoEWrapper" and len(keep) == 40
    assert all(w.kw == seed.wrapper_kwargs(MODEL, 8192) for w in keep)  # nothing shared: 40 sets of workspaces


def test_shared_mode_hands_the_first_layers_workspaces_to_the_others_FAKE_flashinfer(monkeypatch):
    import memtrace

    _FakeWrapper.made, _FakeWrapper.refuse = [], False
    _fake_flashinfer(monkeypatch, lambda activation_precision="fp4": 640)
    _, keep = seed._build_layers(_args(shared=True), MODEL, _FakeTorch, memtrace)
    first = keep[0]
    assert "shared_static_workspace" not in first.kw
    assert all(w._static_workspace is first._static_workspace and w._moe_output is first._moe_output for w in keep)


def test_a_refusing_wrapper_falls_back_to_the_allocators_with_its_arguments_FAKE_flashinfer(monkeypatch, capsys):
    import memtrace

    _FakeWrapper.made, _FakeWrapper.refuse, _FakeTorch.empties = [], True, []

    def cutover_07(activation_precision="fp4", quant_mode=None, num_experts=None, intermediate_size=None, *,
                   hidden_size=None, activation=None, num_topk=None, capacity_tokens=None, sm_count=None):  # fmt: skip
        assert (quant_mode, num_experts, hidden_size, num_topk, capacity_tokens) == ("nvfp4", 256, 2048, 8, 8192)
        return 1024

    calls = _fake_flashinfer(monkeypatch, cutover_07)
    how, keep = seed._build_layers(_args(), MODEL, _FakeTorch, memtrace)
    assert how == "allocate_sm120_moe_workspace"
    assert (
        "B12xMoEWrapper refused (RuntimeError: b12x needs SM120); calling the allocators instead"
        in capsys.readouterr().out
    )
    assert len(calls) == 80 and len(_FakeTorch.empties) == 40  # static + dynamic + output per layer
    assert calls[:2] == [
        {"backend": "static", "max_rows": 1024, "routed_rows": None, "device": "cuda"},
        {"backend": "dynamic", "max_rows": None, "routed_rows": 65536, "device": "cuda"},
    ]
    assert _FakeTorch.empties[0] == ((8192, 2048), "bfloat16", "cuda")


def test_the_report_reads_a_real_hooked_trace(capsys):
    # the real 0.6.13 probe trace (tests/data/vllm-h200/flashinfer-probe): four hooked calls, one nested
    path = next((TESTS / "data" / "vllm-h200" / "flashinfer-probe").glob("*.memtrace"))
    seed._report(path, _args(layers=3), MODEL, "allocate_sm120_moe_workspace", 285_362_432, 297_795_584, "0.6.13")
    out = capsys.readouterr().out
    assert "flashinfer 0.6.13; allocate_sm120_moe_workspace; 3 MoE layers" in out
    assert "total added by outermost hooked calls (memtrace diff's figure): 284924580 B" in out  # 3 x 94,974,860
    assert "  allocate_sm120_dynamic_workspace: 3 calls (1 nested), returned 284924580 B" in out
    assert "0.6.13 prediction per layer: {'static': 190060044, 'dynamic': 113963964, 'output': 33554432" in out
