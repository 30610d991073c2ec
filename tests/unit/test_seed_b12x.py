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
