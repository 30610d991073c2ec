"""fits --what-if / --suggest (analysis.whatif) on the real vLLM 0.34.0 start-ups recorded on the H200.

Every expected figure is vLLM's own (its log, its facts) or another recorded start-up's, never one memtrace
wrote down: the model with the recorded flags gives back vLLM's block counts; turning the extensible KV cache
off on moe-ext predicts what vLLM did on moe-noext; small-ext (the same start-up beside a 96 GiB neighbour)
answers on a 48 GiB card what moe-ext (alone) answers there.
"""

from __future__ import annotations

import json

import pytest
from memtrace import facts as F
from memtrace.analysis.analysed.run import analyse
from memtrace.analysis.capacity import fits
from memtrace.analysis.capacity import whatif as W
from memtrace.analysis.capacity.extensible import address_range
from memtrace.cli import main
from memtrace.errors import UsageError
from memtrace.store import load_run
from vllm034_data import logged, run_dir
from whatif_heldout_cases import markdown_table

GiB = 1 << 30


def _rank(step: str):
    return analyse(load_run(run_dir(step)).traces).ranks[0]


def _what_if(step: str, *items: str) -> W.WhatIf:
    s = W.sites_of(_rank(step))
    return W.WhatIf(s, W.apply_what_if(s.flags, list(items)))


@pytest.mark.parametrize(
    ("step", "blocks"), [("moe-ext", 258528), ("moe-noext", 239986), ("dense-ext", 31168), ("dense-noext", 28819)]
)
def test_the_recorded_flags_on_the_recorded_card_give_vllms_own_block_count(step, blocks):
    r = _rank(step)
    o = W.WhatIf(W.sites_of(r), W.sites_of(r).flags).on(r.trace.process.device_total_bytes)
    assert o.verdict == W.BOOTS and o.kv.blocks == blocks
    assert o.kv.tokens == int(logged(step, r"GPU KV cache size: ([0-9,]+) tokens").replace(",", ""))


@pytest.mark.parametrize(("step", "blocks"), [("moe-ext", 263_061), ("dense-ext", 31_641)])
def test_the_extensible_address_range_is_vllms_with_no_cuda_graphs_in_it(step, blocks):
    """vLLM 0.34 sizes the extensible cache's address range (its ``capacity_blocks``, the most the sizing after
    warm-up may commit) in determine_available_memory, before it captures the CUDA graphs, with no graph estimate
    (``profile_cudagraph_memory`` returns 0 in that mode). ``fits`` and the what-if size it with one function; the
    what-if used to count the captured graphs against it (moe-ext: 42,518,564 B, 262,980 blocks)."""
    r = _rank(step)
    sizing = r.trace.facts[F.VLLM_KV_SIZING]
    total, per = sizing.get("total_memory_bytes") or r.trace.process.device_total_bytes, sizing["bytes_per_block"]
    w = _what_if(step)
    assert address_range(w.flags.util, total, w.withheld[0], per)[1] == blocks == sizing["capacity_blocks"]
    assert address_range(w.flags.util, total, fits.recorded(r).extensible.non_kv_bytes, per)[1] == blocks


def test_a_profiled_recording_switched_to_the_extensible_cache_sizes_the_range_without_its_graph_estimate():
    """moe-noext's 89,128,960 B CUDA-graph estimate is not withheld from the extensible range: its non-KV figure is
    moe-ext's (the same start-up recorded with the extensible cache)."""
    noext = _what_if("moe-noext", "extensible-kv-cache=on").withheld[0]
    assert noext == _what_if("moe-ext").withheld[0] == fits.recorded(_rank("moe-ext")).non_kv_bytes == 12_189_696_164


def test_small_ext_with_its_neighbour_kept_gives_vllms_60704_blocks():
    r = _rank("small-ext")
    o = W.WhatIf(W.sites_of(r), W.sites_of(r).flags).on(r.trace.process.device_total_bytes, keep_others=True)
    assert o.kv.blocks == 60704 and o.others_bytes > 96 * GiB and o.others_left_out_bytes == 0


def test_the_what_if_card_leaves_the_neighbour_out_and_says_how_much():
    """32 defect 2: small-ext 'died' on every small card because the 96 GiB neighbour was carried onto it."""
    small = W.WhatIf(W.sites_of(_rank("small-ext")), W.sites_of(_rank("small-ext")).flags).on(48 * GiB)
    alone = _what_if("moe-ext").on(48 * GiB)
    assert small.verdict == alone.verdict == W.BOOTS
    assert small.kv.blocks == alone.kv.blocks == 70528
    assert small.others_left_out_bytes > 96 * GiB and small.others_bytes == 0


def test_fits_without_what_if_leaves_the_neighbour_out_too(capsys):
    assert main(["fits", str(run_dir("small-ext")), "--capacity", "48GiB"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "BOOTS" in out and "70,528 blocks" in out
    assert "Other processes held 96.60 GiB on the recorded card: left out" in out


def test_turning_the_extensible_cache_off_predicts_moe_noext_within_2_percent():
    r_no = _rank("moe-noext")
    o = _what_if("moe-ext", "extensible-kv-cache=off").on(r_no.trace.process.device_total_bytes)
    measured = r_no.trace.facts["vllm.available_kv_cache_bytes"]
    assert o.verdict == W.BOOTS and abs(o.kv.available_bytes - measured) / measured < 0.02
    assert o.kv.how.startswith("ceil(0.92 x")


def test_fewer_batched_tokens_shrink_profile_runs_workspaces_and_name_them():
    w = _what_if("moe-noext", "max-num-batched-tokens=2048")
    assert w.scales[W.TOKENS].factor == 0.25 and "estimate, one trace" in w.scales[W.TOKENS].rule
    p = next(p for p in w.on(16 * GiB).phases if p.phase == "determine_available_memory/profile_run")
    rec, new = p.kinds[W.TOKENS]
    assert new == round(rec * 0.25) and p.predicted_bytes == p.needed_bytes - (rec - new)
    assert any("_ensure_workspace_size" in site for site, _ in p.sites[W.TOKENS])


def test_enforce_eager_drops_the_cuda_graphs():
    w = _what_if("moe-ext", "enforce-eager")
    assert w.flags.graphs == 0 and w.scales[W.GRAPHS].factor == 0.0
    assert W.Flags.graphs.fget(w.rec) == 5  # 1, 2, 4, 8, 16 for --max-num-seqs 8


def test_the_kv_cache_dtype_doubles_the_bytes_per_token():
    fp8 = _what_if("moe-noext").on(32 * GiB).kv
    bf16 = _what_if("moe-noext", "kv-cache-dtype=auto").on(32 * GiB).kv
    assert bf16.blocks == fp8.blocks // 2 or abs(bf16.blocks - fp8.blocks / 2) <= 1


def test_a_card_smaller_than_the_weights_dies_in_profiling_and_no_flag_helps(capsys):
    code = main(["fits", str(run_dir("dense-noext")), "--capacity", "16GiB", "--suggest"])
    out = " ".join(capsys.readouterr().out.split())
    assert code == 1
    assert "DIES in determine_available_memory/profile_run by 0.64 GiB" in out
    # the most frugal flags tried (--max-model-len 2048 among them) fit under the card, yet vLLM refuses at 0.92
    assert "No flag tried helps (1178 sets of up to four flag changes): with --max-num-batched-tokens 256 " in out
    assert (
        "need 15.96 GiB, under the card's 16.00 GiB, yet vLLM refuses in KV sizing (after determine_available_memory)"
        in out
    )


def test_suggest_ranks_the_changes_that_boot_by_the_kv_cache_they_leave():
    s = W.suggest(W.sites_of(_rank("moe-noext")), 12 * GiB)
    assert s.recorded.verdict != W.BOOTS and s.booting
    tokens = [x.outcome.kv.tokens for x in s.booting]
    assert tokens == sorted(tokens, reverse=True) and all(len(x.changes) == 1 for x in s.booting)
    assert all(x.outcome.verdict == W.BOOTS for x in s.booting)


def test_json_has_the_same_figures_as_the_text(capsys):
    args = ["fits", str(run_dir("moe-ext")), "--capacity", "16GiB", "--what-if", "max-num-seqs=4"]
    assert main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["what_if"]
    assert main(args) == 0
    text = " ".join(capsys.readouterr().out.split())
    kv = doc["outcomes"][0]["kv"]
    assert f"{kv['blocks']:,} blocks, {kv['tokens']:,} tokens" in text
    assert doc["changes"] == ["--max-num-seqs 4"] and doc["calibrated_traces"] == 0


@pytest.mark.parametrize("bad", ["max-num-seqs=many", "num-gpus=2", "kv-cache-dtype=int3", "enforce-eager=maybe"])
def test_a_bad_what_if_is_one_line_and_exit_2(bad, capsys):
    assert main(["fits", str(run_dir("moe-ext")), "--capacity", "16GiB", "--what-if", bad]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--what-if" in err


def test_a_trace_that_is_not_vllm_cannot_take_a_what_if():
    from memtrace.model import Trace

    r = analyse([Trace()]).ranks[0]
    with pytest.raises(UsageError, match="need a vLLM start-up"):
        W.sites_of(r)


def test_a_shared_card_dies_in_profiling_and_suggest_names_fewer_batched_tokens(capsys):
    """The smaller-card plan (/work/wt/_gpu/whatif-plan.md): another process holds 127.30 GiB of the H200."""
    args = ["fits", str(run_dir("moe-noext")), "--capacity", "139.8GiB", "--others", "127.3GiB"]
    args += ["--what-if", "max-num-batched-tokens=16384", "--what-if", "gpu-memory-utilization=0.0823", "--suggest"]
    assert main(args) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "DIES in determine_available_memory/profile_run by 0.35 GiB" in out
    assert "1. --max-num-batched-tokens 1024: KV cache" in out and "2. --max-num-batched-tokens 2048" in out


def test_others_that_fill_the_card_are_one_line_and_exit_2(capsys):
    args = ["fits", str(run_dir("moe-ext")), "--capacity", "16GiB", "--others", "16GiB"]
    assert main(args) == 2
    assert "--others 16GiB fills the card" in capsys.readouterr().err


def test_the_issue_bundle_of_a_run_that_died_says_what_would_make_it_boot(tmp_path):
    from testdata import DATA

    out = tmp_path / "issue"
    assert main(["issue", str(DATA / "vllm-h200" / "shared-gpu"), "-o", str(out)]) == 0
    md = " ".join((out / "issue.md").read_text().split())
    assert "## What would make it boot" in md
    assert "DIES in determine_available_memory/profile_run" in md
    assert "No flag helps: weights and workspaces alone need 11.23 GiB" in md
    assert "11.21 GiB of it free of other processes" in md


def test_a_recording_that_ends_at_its_oom_answers_unknown_past_it_where_vllms_sizing_does_not_decide():
    from testdata import DATA

    r = analyse(load_run(DATA / "vllm-h200" / "shared-gpu").traces).ranks[0]
    s = W.sites_of(r)
    o = W.WhatIf(s, W.apply_what_if(s.flags, ["gpu-memory-utilization=0.92"])).on(16 * GiB)
    assert o.verdict == W.UNKNOWN and "before the KV cache was sized" in o.why
    # at its recorded 0.07 vLLM may fill less than the weights it loaded: its KV sizing refuses whatever came next
    assert W.WhatIf(s, s.flags).on(16 * GiB).verdict == W.REFUSES


def test_fitted_scalings_come_from_the_traces_and_state_their_residual():
    """Two traces of the same start-up labelled with different max-num-batched-tokens: the fitted line is flat
    (the same bytes at both), so the what-if keeps every tokens site as recorded, with residual 0."""
    import copy

    a = _rank("moe-noext")
    t = copy.deepcopy(a.trace)
    t.facts["vllm.config"] = {**t.facts["vllm.config"], "max_num_batched_tokens": 4096}
    b = analyse([t]).ranks[0]
    cal = W.calibrate([W.sites_of(a), W.sites_of(b)])
    line = cal.lines[("profile_run", W.TOKENS)]
    assert abs(line.b) < 1e-6 and line.residual_bytes == 0 and line.points == 2
    s = W.sites_of(a)
    w = W.WhatIf(s, W.apply_what_if(s.flags, ["max-num-batched-tokens=2048"]), cal)
    assert w.scales[W.TOKENS].rule.startswith("fitted over 2 traces")
    p = next(p for p in w.on(32 * GiB).phases if p.phase == "determine_available_memory/profile_run")
    assert p.predicted_bytes == p.needed_bytes


@pytest.mark.parametrize(
    ("base", "held_out"), [("moe-ext", "small-ext"), ("moe-ext", "moe-noext"), ("dense-ext", "dense-noext")]
)
def test_a_real_start_up_is_predicted_from_another_within_2_percent_or_256_mib(base, held_out):
    """fits_check: the held-out run's flags and card (its neighbour kept) predicted from the base run, every
    phase's peak, vLLM's available KV and its blocks compared with what the held-out run measured."""
    import fits_check

    c = fits_check.check(W.sites_of(_rank(base)), None, W.sites_of(_rank(held_out)), held_out)
    bad = [f for f in c.figures if not f.ok]
    assert not bad, markdown_table([c])
    assert len(c.figures) >= 10 and c.verdict == W.BOOTS
    if held_out == "small-ext":  # the neighbour's 96 GiB kept: vLLM's own 60704 blocks, to the block
        assert next(f for f in c.figures if f.name == "KV blocks").error == 0


def test_the_view_says_what_the_issue_bundle_says_about_what_would_make_it_boot(tmp_path):
    from memtrace.plots.whatif_text import boot_section
    from testdata import DATA

    out = tmp_path / "view.html"
    assert main(["view", str(DATA / "vllm-h200" / "shared-gpu"), "-o", str(out)]) == 0
    page = out.read_text()
    run = analyse(load_run(DATA / "vllm-h200" / "shared-gpu").traces)
    assert "What would make it boot" in page
    doc = json.loads(page.split('id="mt-doc">', 1)[1].split("</script>", 1)[0])
    assert doc["boot"] == "\n".join(boot_section(run, markdown=False)[2:])
    assert doc["boot"].startswith("On the recorded card (139.80 GiB), with the recorded flags: DIES in")
