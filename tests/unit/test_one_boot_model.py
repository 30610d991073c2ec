"""One model of booting (issue 40, cases 1-4): plain ``fits``, ``--suggest``'s recorded-flags line, ``--json``, the
what-if's phase table and "short by N" give one answer, on the real vLLM 0.34.0 start-ups recorded on the H200.

Every figure asserted is read from another output of the same run (the report's phase peaks, the smallest card
``fits`` prints), or from vLLM's own rule (one request of max-model-len needs its blocks beside the null block),
never written down from the code under test.
"""

from __future__ import annotations

import json
import re

import pytest
from memtrace.analysis.analysed.run import analyse
from memtrace.analysis.capacity import whatif as W
from memtrace.analysis.capacity.boot import answer
from memtrace.analysis.capacity.fits import SEARCH_STEP
from memtrace.cli import main
from memtrace.store import load_run
from vllm034_data import run_dir

GiB = 1 << 30


def _cli(capsys, *argv) -> tuple[int, str]:
    rc = main([str(a) for a in argv])
    return rc, " ".join(capsys.readouterr().out.split())


@pytest.fixture(scope="module")
def dense():
    return analyse(load_run(run_dir("dense-ext")).traces).ranks[0]


@pytest.fixture(scope="module")
def moe():
    return analyse(load_run(run_dir("moe-ext")).traces).ranks[0]


def test_case_1_plain_fits_suggest_and_json_refuse_the_dense_model_on_20_1_gib_alike(capsys):
    run = run_dir("dense-ext")
    rc_plain, plain = _cli(capsys, "fits", run, "--capacity", "20.1GiB")
    rc_suggest, suggest = _cli(capsys, "fits", run, "--capacity", "20.1GiB", "--suggest")
    rc_json, out = _cli(capsys, "fits", run, "--capacity", "20.1GiB", "--json")
    (fit,) = json.loads(out)["fits"]
    assert rc_plain == rc_suggest == rc_json == 1
    assert "vLLM REFUSES in compile_or_warm_up/kv_cache_sizing" in plain
    assert "vLLM REFUSES at compile_or_warm_up/kv_cache_sizing" in suggest and "BOOTS" not in suggest
    assert "these flags already boot" not in suggest
    # the JSON says one thing: refused, so no KV cache, no blocks, no tokens
    assert (fit["verdict"], fit["survives"], fit["kv_cache_bytes"], fit["kv_blocks"], fit["kv_tokens"]) == (
        "refuses",
        False,
        0,
        None,
        None,
    )


def test_case_1_the_what_if_counts_vllms_null_block_as_plain_fits_does(dense):
    """512 blocks of 64 tokens are 32,768 tokens, one max-model-len request, but block 0 is vLLM's null block."""
    s = W.sites_of(dense)
    w = W.WhatIf(s, s.flags)
    o = w.on(int(20.1 * GiB))
    assert o.kv.blocks * 64 == s.flags.max_model_len == 32768 and o.verdict == W.REFUSES
    assert (o.verdict == W.BOOTS) == dense.boot().fit(int(20.1 * GiB)).survives


@pytest.mark.parametrize("card", [16, 17, 17.5])
def test_case_2_suggests_floor_is_the_most_frugal_flags_tried_max_model_len_included(dense, card):
    s = W.sites_of(dense)
    found = W.suggest(s, int(card * GiB))
    assert "--max-model-len 2048" in found.floor_flags  # 32768 // 16, the shortest tried
    # --max-model-len 4096 with 1024 batched tokens boots on 17.8 GiB (17.75 in the issue, before the sampler's
    # logprob/gumbel buffers were scaled by max-num-seqs, not tokens): no floor of the flags tried is above it
    boots = W.WhatIf(s, W.apply_what_if(s.flags, ["max-model-len=4096", "max-num-batched-tokens=1024"]))
    assert boots.on(int(17.8 * GiB)).verdict == W.BOOTS
    assert found.floor_bytes < 17.75 * GiB


def test_case_2_the_floor_respects_a_max_model_len_given_with_what_if(dense):
    s = W.sites_of(dense)
    base = W.apply_what_if(s.flags, ["max-model-len=4096"])
    found = W.suggest(s, 16 * GiB, base=base)
    assert "--max-model-len 1024" in found.floor_flags  # 4096 // 4: never longer than the one given


@pytest.mark.parametrize(("step", "cards"), [("dense-ext", (17, 17.5, 18)), ("moe-ext", (12.25, 12.5, 13))])
def test_case_3_short_by_n_is_the_card_growth_that_boots(capsys, step, cards, dense, moe):
    rank = {"dense-ext": dense, "moe-ext": moe}[step]
    b = rank.boot()
    shorts = []
    for card in cards:
        c = int(card * GiB)
        f = b.fit(c)
        assert not f.survives and f.short_bytes == b.smallest - c
        assert b.fit(c + f.short_bytes).survives and not b.fit(c + f.short_bytes - SEARCH_STEP).survives
        shorts.append(f.short_bytes)
    assert shorts == sorted(shorts, reverse=True) and len(set(shorts)) == 3  # not one request's KV cache each
    rc, out = _cli(capsys, "fits", run_dir(step), "--capacity", ",".join(f"{c}GiB" for c in cards), "--suggest")
    smallest = re.search(r"boots on a ([\d.]+) GiB card", out).group(1)
    rc_plain, plain = _cli(capsys, "fits", run_dir(step), "--capacity", f"{cards[0]}GiB")
    assert f"Smallest card this start-up fits on at that utilization: about {smallest} GiB" in plain
    assert f"{shorts[0] / GiB:.2f} GiB short: boots on a {smallest} GiB card" in plain  # --suggest's words
    for card, short in zip(cards, shorts, strict=True):
        assert f"{card:.2f} GiB: vLLM refuses" in out or f"{card:.2f} GiB: dies" in out
        assert f"{short / GiB:.2f} GiB short: boots on a {smallest} GiB card" in out


def test_case_4_the_phase_tables_recorded_peaks_are_the_reports_and_the_kv_shows_what_was_recorded(capsys, dense):
    rc, out = _cli(capsys, "report", run_dir("dense-ext"), "--json")
    report = {p["path"]: p["peak_device_used_bytes"] for p in json.loads(out)["traces"][0]["phases"]}
    a = answer(dense, [], [17 * GiB, 24 * GiB])
    for o in a.outcomes:
        assert {p.phase: p.recorded_bytes for p in o.phases} == report
    refused, boots = a.outcomes
    kv_refused = next(p for p in refused.phases if p.phase == "kv_cache_extend").kinds[W.KV]
    kv_boots = next(p for p in boots.phases if p.phase == "kv_cache_extend").kinds[W.KV]
    recorded_kv = dense.trace.facts["vllm.kv_cache_bytes"]  # what kv_cache_extend committed
    # the pages warm-up committed before the extension (64 MiB here) stay with what does not depend on the card
    assert kv_refused == (kv_boots[0], 0) and 0 <= recorded_kv - kv_boots[0] <= 64 << 20
    assert kv_boots[1] == boots.kv.kv_bytes
    rc, text = _cli(capsys, "fits", run_dir("dense-ext"), "--capacity", "24GiB", "--suggest")
    assert f"kv_cache_extend {report['kv_cache_extend'] / GiB:.2f} GiB" in text
    assert f"KV {kv_boots[0] / GiB:.2f} GiB -> {boots.kv.kv_bytes / GiB:.2f} GiB" in text


def test_case_1_another_utilization_is_one_answer_too(dense):
    """``fits --util 0.95`` and ``fits --what-if gpu-memory-utilization=0.95`` (what --suggest takes) agree, at the
    flip too."""
    b = dense.boot(0.95)
    cards = [int(b.smallest * 0.99), b.smallest, int(b.smallest * 1.01), 24 * GiB]
    said = answer(dense, ["gpu-memory-utilization=0.95"], cards).outcomes
    assert [o.verdict for o in said] == [W.REFUSES, W.BOOTS, W.BOOTS, W.BOOTS]
    assert [o.verdict == W.BOOTS for o in said] == [b.fit(c).survives for c in cards]
