"""Plain ``memtrace fits`` (no ``--what-if``) where the recording stops short of the answer (issue 28).

``small-r2048`` is a real vLLM 0.34.0 start-up refused at ``kv_cache_sizing`` (0 KV blocks) on an H200 another
process shared: the recording ends before the KV cache was extended. Asked about another card, plain ``fits``
answers what the what-if model answers with the recorded flags, says it is a prediction and where its figures
come from, and gives the same answer in its text, its JSON, its smallest card and its exit status. The figures
it is held to are vLLM's own: on the whole H200 (the neighbour left out) it predicts the 260,064 blocks and
16,644,096 tokens vLLM logged for ``g08``, the same flags booted alone on the same card.

``shared-gpu`` is a real vLLM 0.25.1 start-up at ``--gpu-memory-utilization 0.07`` that died of a CUDA OOM in
``profile_run`` beside a 128 GiB neighbour. Alone on its card, vLLM may fill ceil(0.07 x 150,109,880,320 B) =
10,507,691,623 B, less than the 11,259,703,296 B of weights vLLM itself logged: vLLM's own KV sizing refuses
("No available memory for the cache blocks") whatever the rest of ``profile_run`` needed, so the answer is that
vLLM refuses, not "unknown".
"""

from __future__ import annotations

import json
import math

import pytest
from memtrace.analysis.analysed.run import analyse
from memtrace.analysis.capacity import whatif as W
from memtrace.analysis.capacity.fits import SEARCH_STEP
from memtrace.cli import main
from memtrace.store import load_run
from testdata import DATA
from whatif_heldout_cases import GRID

GiB = 1 << 30
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


@pytest.fixture(scope="module")
def r2048():
    return GRID.run_dir("small-r2048")


def test_small_r2048_on_16_gib_boots_as_the_what_if_of_no_change_predicts(capsys, r2048):
    rc, doc, out = _fits(capsys, r2048, "--capacity", "16GiB")
    (fit,) = doc["fits"]
    s = W.sites_of(_rank(r2048))
    o = W.WhatIf(s, s.flags).on(16 * GiB)
    assert o.verdict == W.BOOTS
    assert rc == 0 and fit["verdict"] == "boots" and fit["survives"]
    assert (fit["kv_blocks"], fit["kv_tokens"], fit["kv_cache_bytes"]) == (6496, 415_744, 3_405_774_848)
    assert (fit["kv_blocks"], fit["kv_cache_bytes"]) == (o.kv.blocks, o.kv.kv_bytes)
    # what the recording covers as the capacity model measured it (the null block committed at kv_cache_init
    # included), what lies past it as the what-if model predicts it
    assert fit["pre_kv_peak_phase"] == o.pre_kv_peak_phase == "compile_or_warm_up/kv_cache_sizing_warmup"
    assert fit["pre_kv_peak_bytes"] == 12_602_179_584 and fit["headroom_bytes"] == 16 * GiB - 12_602_179_584
    # a prediction, said so, with where its figures come from
    assert "0 KV blocks" in fit["prediction"] and "what-if model with the recorded flags" in fit["prediction"]
    assert fit["prediction_how"] == f"the KV cache from {o.kv.how}"
    assert "UNKNOWN" not in out and "BOOTS: vLLM sizes the KV cache after warm-up to 3.17 GiB (6,496 blocks" in out
    assert "Predicted past the recording: it ends where vLLM refused on its card (0 KV blocks at" in out


def test_small_r2048_alone_on_the_whole_h200_is_predicted_to_get_g08s_260064_blocks(capsys, r2048):
    rc, doc, out = _fits(capsys, r2048, "--capacity", str(H200))
    (fit,) = doc["fits"]
    assert rc == 0 and fit["verdict"] == "boots" and fit["prediction"]
    blocks = int(GRID.logged("g08", r"Extended KV cache to (\d+) blocks"))
    tokens = int(GRID.logged("g08", r"GPU KV cache size: ([\d,]+) tokens").replace(",", ""))
    assert (fit["kv_blocks"], fit["kv_tokens"]) == (blocks, tokens) == (260_064, 16_644_096)
    assert fit["others_left_out_bytes"] > 127 * GiB  # the neighbour that made vLLM refuse is not on this card


def test_small_r2048_on_several_cards_refuses_below_its_smallest_card_and_boots_above(capsys, r2048):
    rc, doc, out = _fits(capsys, r2048, "--capacity", "12GiB,13GiB,16GiB")
    outcomes = [(f["verdict"], bool(f["prediction"])) for f in doc["fits"]]
    assert rc == 1 and outcomes == [("refuses", False), ("refuses", False), ("boots", True)]
    smallest = doc["smallest_fitting_capacity_bytes"]
    assert smallest is not None and 13 * GiB < smallest < 16 * GiB
    # the smallest card is where the same answer turns, to fits' 64 MiB
    s = W.sites_of(_rank(r2048))
    w = W.WhatIf(s, s.flags)
    assert w.on(smallest).verdict == W.BOOTS and w.on(smallest - SEARCH_STEP).verdict == W.REFUSES
    assert "16.00 GiB 1 16.00 GiB 10.75 GiB 3.17 GiB — boots: 6,496 blocks, 415,744 tokens (predicted)" in out
    assert doc["smallest_fitting_prediction"] == doc["fits"][2]["prediction"]  # said to be predicted, as above
    assert "Smallest card this start-up fits on at that utilization: about 13.10 GiB (predicted past the" in out


def test_small_r2048_issue_bundle_view_and_fits_keep_others_give_one_answer_on_its_card(capsys, r2048, tmp_path):
    from memtrace.plots.whatif_text import boot_section

    assert main(["issue", str(r2048), "-o", str(tmp_path / "issue")]) == 0
    md = " ".join((tmp_path / "issue" / "issue.md").read_text().split())
    head = "vLLM REFUSES at compile_or_warm_up/kv_cache_sizing: no memory left for one request of max-model-len tokens"
    assert f"On the recorded card (139.80 GiB), with the recorded flags: {head}" in md
    assert main(["fits", str(r2048), "--capacity", str(H200), "--keep-others"]) == 1
    assert head in " ".join(capsys.readouterr().out.split())
    assert main(["view", str(r2048), "-o", str(tmp_path / "view.html")]) == 0
    page = (tmp_path / "view.html").read_text()
    view = json.loads(page.split('id="mt-doc">', 1)[1].split("</script>", 1)[0])
    assert view["boot"] == "\n".join(boot_section(analyse(load_run(r2048).traces), markdown=False)[2:])
    assert head in " ".join(view["boot"].split())


def test_shared_gpu_alone_on_its_card_at_util_0_07_is_refused_by_vllms_kv_sizing(capsys):
    rc, doc, out = _fits(capsys, SHARED, "--capacity", str(H200))
    (fit,) = doc["fits"]
    target = math.ceil(0.07 * H200)
    weights = _rank(SHARED).trace.facts["vllm.weights_memory_bytes"]  # vLLM's own figure
    assert (target, weights) == (10_507_691_623, 11_259_703_296) and weights > target
    assert rc == 1 and not fit["survives"]
    assert (fit["verdict"], fit["stage"], fit["target_bytes"]) == ("refuses", "KV sizing", target)
    assert fit["non_kv_bytes"] >= weights and fit["overshoot_bytes"] == fit["non_kv_bytes"] - target == 753_039_901
    assert fit["recorded_oom"]["phase_path"] == "determine_available_memory/profile_run"  # still said
    assert "vLLM REFUSES at KV sizing: vLLM keeps at least 10.49 GiB out of the KV cache" in out
    assert "No available memory for the cache blocks" in out and "UNKNOWN" not in out


def test_shared_gpu_what_if_of_no_change_is_refused_too():
    s = W.sites_of(_rank(SHARED))
    o = W.WhatIf(s, s.flags).on(H200)
    # vLLM's engine refuses between determine_available_memory and kv_cache_init (get_kv_cache_configs), where
    # plain fits says it does too
    assert (o.verdict, o.phase) == (W.REFUSES, "KV sizing (after determine_available_memory)")
    assert o.by_bytes >= 753_039_901 and "No available memory for the cache blocks" in o.why


def test_shared_gpu_at_a_utilization_that_covers_its_weights_stays_unknown_past_its_oom(capsys):
    rc, doc, out = _fits(capsys, SHARED, "--capacity", str(H200), "--util", "0.92")
    (fit,) = doc["fits"]
    assert rc == 1 and fit["verdict"] == "unknown" and fit["prediction"] == ""
    assert "never recorded" in out
    s = W.sites_of(_rank(SHARED))
    assert W.WhatIf(s, W.apply_what_if(s.flags, ["gpu-memory-utilization=0.92"])).on(H200).verdict == W.UNKNOWN


def test_small_d16384_is_not_refused_at_init_device_it_passed_there_on_its_crowded_card(capsys):
    """vLLM 0.34 with its extensible KV cache (util 1.0) does not refuse at init_device when less than util x card
    is free: small-d16384 passed init_device with 12.66 GiB of the H200 free, loaded its weights and died of a CUDA
    OOM in profile_run. Alone on any card the failed request fits, and nothing after it was recorded: unknown,
    as the what-if model answers too."""
    d = GRID.run_dir("small-d16384")
    rank = _rank(d)
    assert {"init_device", "load_model", "profile_run"} <= {p.name for p in rank.trace.phases}
    rc, doc, out = _fits(capsys, d, "--capacity", f"16GiB,{H200}")
    assert rc == 1 and [f["verdict"] for f in doc["fits"]] == ["unknown", "unknown"]
    assert {f["recorded_oom"]["phase_path"] for f in doc["fits"]} == {"determine_available_memory/profile_run"}
    assert "refuses at init_device" not in out
    s = W.sites_of(rank)
    assert {W.WhatIf(s, s.flags).on(c).verdict for c in (16 * GiB, H200)} == {W.UNKNOWN}
