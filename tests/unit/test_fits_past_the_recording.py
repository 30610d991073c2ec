"""Plain ``memtrace fits`` (no ``--what-if``) where the recording stops short of the answer (issue 28).

``shared-gpu`` is a real vLLM 0.25.1 start-up at ``--gpu-memory-utilization 0.07`` that died of a CUDA OOM in
``profile_run`` beside a 128 GiB neighbour. Alone on its card, vLLM may fill ceil(0.07 x 150,109,880,320 B) =
10,507,691,623 B, less than the 11,259,703,296 B of weights vLLM itself logged: vLLM's own KV sizing refuses
("No available memory for the cache blocks") whatever the rest of ``profile_run`` needed, so the answer is that
vLLM refuses, not "unknown".
"""

from __future__ import annotations

import json
import math

from memtrace.analysis import whatif as W
from memtrace.analysis.run import analyse
from memtrace.cli import main
from memtrace.store import load_run
from testdata import DATA

H200 = 150_109_880_320  # the recorded card (cudaMemGetInfo's total)
SHARED = DATA / "vllm-h200" / "shared-gpu"


def _fits(capsys, run, *args: str) -> tuple[int, dict, str]:
    """``memtrace fits`` as JSON and as text: (exit status, the JSON, the text unwrapped)."""
    rc = main(["fits", str(run), *args, "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert main(["fits", str(run), *args]) == rc
    return rc, doc, " ".join(capsys.readouterr().out.split())


def _rank(run):
    return analyse(load_run(run).traces).ranks[0]


def test_shared_gpu_alone_on_its_card_at_util_0_07_is_refused_by_vllms_kv_sizing(capsys):
    rc, doc, out = _fits(capsys, SHARED, "--capacity", str(H200))
    (fit,) = doc["fits"]
    target = math.ceil(0.07 * H200)
    weights = _rank(SHARED).trace.facts["vllm.weights_memory_bytes"]  # vLLM's own figure
    assert (target, weights) == (10_507_691_623, 11_259_703_296) and weights > target
    assert rc == 1 and not fit["survives"]
    assert (fit["outcome"], fit["stage"], fit["target_bytes"]) == ("no-kv-memory", "KV sizing", target)
    assert fit["non_kv_bytes"] >= weights and fit["overshoot_bytes"] == fit["non_kv_bytes"] - target == 753_039_901
    assert fit["recorded_oom"]["phase_path"] == "determine_available_memory/profile_run"  # still said
    assert "vLLM REFUSES at KV sizing: vLLM keeps at least 10.49 GiB out of the KV cache" in out
    assert "No available memory for the cache blocks" in out and "UNKNOWN" not in out


def test_shared_gpu_what_if_of_no_change_is_refused_too():
    s = W.sites_of(_rank(SHARED))
    o = W.WhatIf(s, s.flags).on(H200)
    assert (o.verdict, o.phase) == (W.REFUSES, "determine_available_memory")
    assert o.by_bytes >= 753_039_901 and "No available memory for the cache blocks" in o.why


def test_shared_gpu_at_a_utilization_that_covers_its_weights_stays_unknown_past_its_oom(capsys):
    rc, doc, out = _fits(capsys, SHARED, "--capacity", str(H200), "--util", "0.92")
    (fit,) = doc["fits"]
    assert rc == 1 and fit["outcome"] == "unknown"
    assert "nothing after it was recorded" in out or "never recorded" in out
    s = W.sites_of(_rank(SHARED))
    assert W.WhatIf(s, W.apply_what_if(s.flags, ["gpu-memory-utilization=0.92"])).on(H200).verdict == W.UNKNOWN
