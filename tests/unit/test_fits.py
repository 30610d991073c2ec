"""memtrace fits: the capacity what-if. Synthetic start-ups (named so) check the model's arithmetic;
real H200 runs at mimicked capacities (tests/data/h200) check its predictions against outcomes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import synthetic_gates as g
from capacity_model import fit
from memtrace.analysis.capacity.fits import DIED, FITS, NO_KV, ONE_REQUEST, OOM, REFUSED, UNKNOWN
from memtrace.analysis.memory.curves import all_curves
from memtrace.cli import main
from memtrace.store import save_trace
from testdata import unpacked

TESTS = Path(__file__).resolve().parents[1]
GiB, MiB = g.GiB, g.MiB

# The SYNTHETIC start-up: 20 MiB + 20 GiB weights + 2 GiB workspace + 900 MiB non-PyTorch before
# profiling; profile_run peaks 6 GiB higher (28.90 GiB); after the KV cache, a 2 GiB warm-up spike
# and a 512 MiB CUDA-graph pool (post-KV transient 2.5 GiB).
PRE_KV_PEAK = 20 * MiB + 20 * GiB + 2 * GiB + 6 * GiB + g.NON_TORCH


@pytest.fixture(scope="module")
def synthetic():
    return g.vllm_like_startup(capacity=48 * GiB, util=0.92)


def test_card_independent_memory_is_the_one_non_kv_figure(synthetic):
    from memtrace.analysis.capacity.reconcile import MEMTRACE, non_kv

    r = fit(synthetic, 48 * GiB)
    # vLLM's formula on the curves (what report shows), not the SYNTHETIC builder's own simpler sizing,
    # which also counted the 600 MiB context and 20 MiB worker memory in use before init_device ended
    assert (r.non_kv_bytes, r.non_kv_source) == (non_kv(synthetic).bytes, MEMTRACE)
    assert r.non_kv_bytes == PRE_KV_PEAK - 920 * MiB
    assert r.pre_kv_peak_bytes == PRE_KV_PEAK
    assert r.pre_kv_peak_phase == "determine_available_memory/profile_run"


def test_the_recorded_card_fits_with_the_reconstructed_kv_cache(synthetic):
    from memtrace.analysis.capacity.reconcile import reconcile_kv

    r = fit(synthetic, 48 * GiB)
    assert r.outcome == FITS
    # vLLM rounds the target up (ceil); the synthetic recording rounded it down
    assert r.kv_cache_bytes - reconcile_kv(synthetic).available_kv_bytes == 1


def test_a_card_smaller_than_the_profile_peak_dies_in_profile_run(synthetic):
    r = fit(synthetic, 24 * GiB)
    assert (r.outcome, r.stage, r.phase) == (OOM, "pre-KV", "determine_available_memory/profile_run")
    assert r.overshoot_bytes == PRE_KV_PEAK - 24 * GiB


def test_a_card_smaller_than_the_weights_dies_loading_them(synthetic):
    assert fit(synthetic, 16 * GiB).phase == "load_model"


def test_a_card_whose_target_is_under_non_kv_gets_no_kv_cache(synthetic):
    # 30 GiB physical holds the 28.90 GiB profile peak, but 0.92 x 30 GiB = 27.6 GiB < non-KV (28.0 GiB)
    r = fit(synthetic, 30 * GiB)
    assert (r.outcome, r.stage) == (NO_KV, "KV sizing")
    assert r.overshoot_bytes == PRE_KV_PEAK - 920 * MiB - int(-(-30 * GiB * 0.92 // 1))


def test_post_kv_transient_kills_warm_up_when_util_leaves_too_little_headroom():
    # an 8 GiB warm-up spike, more than profile_run's 6 GiB that vLLM kept out of the KV cache:
    # on 40 GiB at 0.99 the KV cache takes 39.6 - 28.9 GiB and warm-up peaks at 22.9 + 10.7 + 8.5 GiB
    heavy_warmup = g.vllm_like_startup(capacity=48 * GiB, util=0.92, warmup=8 * GiB)
    assert fit(heavy_warmup, 48 * GiB).outcome == FITS
    r = fit(heavy_warmup, 40 * GiB, util=0.99)
    assert (r.outcome, r.stage) == (OOM, "post-KV")
    assert r.phase == "compile_or_warm_up/kernel_warmup"
    assert r.post_kv_peak_bytes > 40 * GiB


def test_several_capacities_give_one_row_each(synthetic):
    rows = [fit(synthetic, c) for c in (16 * GiB, 24 * GiB, 30 * GiB, 32 * GiB, 48 * GiB)]
    assert [r.outcome for r in rows] == [OOM, OOM, NO_KV, FITS, FITS]


def test_cli_table_and_exit_status(synthetic, tmp_path, capsys):
    path = save_trace(synthetic, tmp_path / "run.memtrace")
    rc = main(["fits", str(path), "--capacity", "24GiB,32GiB"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "dies in determine_available_memory/profile_run (before KV sizing; needs 4.90 GiB more)" in out
    assert "boots, " in out  # a vLLM start-up in its verdict's word
    rc = main(["fits", str(path), "--capacity", "32GiB", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["fits"][0]["survives"] is True


def test_cli_refuses_a_bad_capacity_with_exit_2(synthetic, tmp_path, capsys):
    path = save_trace(synthetic, tmp_path / "run.memtrace")
    assert main(["fits", str(path), "--capacity", "big"]) == 2
    assert "cannot read size 'big'" in capsys.readouterr().err


def test_a_run_that_died_in_profiling_cannot_tell_about_larger_cards():
    died = g.vllm_like_startup(oom_in="profile_run")
    assert fit(died, 16 * GiB).outcome == OOM  # its weights alone do not fit
    assert fit(died, 64 * GiB).outcome == UNKNOWN  # the recording stops before the KV cache


# -- validation on real H200 runs at mimicked capacities (tests/data/h200, tests/gpu/make_h200_data.py) --

H200 = TESTS / "data" / "h200"
OUTCOMES = H200 / "outcomes.json"


def _h200_cases() -> list[tuple[str, dict]]:
    if not OUTCOMES.exists():
        return []
    doc = json.loads(OUTCOMES.read_text())
    return sorted(
        ((k, v) for k, v in doc.items() if k.startswith("startup-cap")), key=lambda kv: kv[1]["capacity_bytes"]
    )


def _real(outcome: dict) -> tuple[str, str | None]:
    """A real outcome as (kind, phase): ("ok", None), ("oom", "profile_run"), ("error", phase)..."""
    return ("ok", None) if outcome.get("outcome") == "ok" else (outcome.get("outcome"), outcome.get("phase"))


def _predicted(r) -> tuple[str, str | None]:
    if r.outcome == FITS:
        return ("ok", None)
    if r.outcome == NO_KV:  # vLLM (and the example) raise ValueError while sizing the KV cache
        return ("error", "determine_available_memory")
    return ("oom", r.phase)


NEEDS_H200 = pytest.mark.skipif(
    not _h200_cases(), reason="no real H200 runs at mimicked capacities under tests/data/h200 yet"
)


@NEEDS_H200
def test_fits_predicts_where_real_h200_startups_died_at_mimicked_capacities():
    from memtrace.store import load_run

    full = load_run(H200 / "startup-full").traces[0]
    rows = []
    for name, outcome in _h200_cases():
        # no override: the non-PyTorch memory is the one the full-card run recorded
        r = fit(full, outcome["capacity_bytes"], util=0.92)
        rows.append((name, outcome["capacity_bytes"] / GiB, _real(outcome), _predicted(r)))
    report = "\n".join(f"{n}: {c:.2f} GiB real {real} predicted {pred}" for n, c, real, pred in rows)
    agree = [row for row in rows if row[2] == row[3]]
    assert len(agree) == len(rows), report
    kinds = {real for _, _, real, _ in agree}
    assert len(agree) >= 3, report
    assert ("oom", "profile_run") in kinds, report  # one dies in profiling
    assert any(k == "oom" and str(p).startswith("compile_or_warm_up") for k, p in kinds), report  # one in warm-up
    assert ("ok", None) in kinds, report


@NEEDS_H200
def test_the_recorded_non_torch_memory_is_in_cudas_accounting_like_the_mimics_limit():
    # NVML's "used" includes memory the driver reserves and CUDA never reports (NVML total - CUDA total).
    # Left in, it made the full card's non-PyTorch memory look 0.60 GiB larger than the mimicked cards'
    # (set_per_process_memory_fraction was sized from cudaMemGetInfo) and fits predicted death on 32 GiB.
    from memtrace.analysis.analysed.landmarks import landmarks
    from memtrace.analysis.memory.curves import driver_reserved_bytes
    from memtrace.store import load_run

    full = load_run(H200 / "startup-full").traces[0]
    mimic = load_run(H200 / "startup-cap32g").traces[0]
    assert driver_reserved_bytes(full) == 150_754_820_096 - 150_109_880_320  # 644,939,776 B on the H200
    recorded = landmarks(full, all_curves(full)).before_kv_non_torch_bytes
    assert abs(recorded - mimic.facts["vllm.non_torch_at_init_bytes"]) < 16 * MiB
    # each GiB more card adds only (1 - 0.92) GiB of headroom after the KV cache
    assert fit(full, 28 * GiB, util=0.92).outcome == OOM
    assert fit(full, 30 * GiB, util=0.92).outcome == FITS


@NEEDS_H200
def test_shifted_full_card_curve_matches_the_32gib_runs_own_warm_up_peak():
    # the model's core assumption, checked on real data: after the KV cache, the small card's curve is
    # the full card's moved by the difference in KV bytes (to within the KV cache's block rounding)
    from memtrace.analysis.memory.curves import all_curves
    from memtrace.analysis.memory.phases import phase_stats
    from memtrace.store import load_run

    full, small = (load_run(H200 / n).traces[0] for n in ("startup-full", "startup-cap32g"))
    shift = small.facts["vllm.available_kv_cache_bytes"] - full.facts["vllm.available_kv_cache_bytes"]
    peaks = [{s.path: s.peak_reserved_bytes for s in phase_stats(t, all_curves(t))} for t in (full, small)]
    assert (
        abs(peaks[0]["compile_or_warm_up/kernel_warmup"] + shift - peaks[1]["compile_or_warm_up/kernel_warmup"])
        < 8 * MiB
    )


@NEEDS_H200
def test_cli_non_torch_option_describes_another_cards_context(capsys):
    run = str(H200 / "startup-full")
    assert main(["fits", run, "--capacity", "32GiB"]) == 0
    assert "BOOTS" in capsys.readouterr().out
    # a card whose CUDA context and libraries hold 1.3 GiB instead of the H200's 0.68 GiB dies in warm-up
    assert main(["fits", run, "--capacity", "32GiB", "--non-torch", "1.3GiB"]) == 1
    assert "DIES in compile_or_warm_up/kernel_warmup, after the KV cache" in capsys.readouterr().out


def test_vllm_refuses_a_kv_cache_too_small_for_one_max_model_len_request():
    trace = g.vllm_like_startup()  # 15.26 GiB of KV cache on its 48 GiB card
    kv = trace.facts["vllm.available_kv_cache_bytes"]
    trace.facts["vllm.kv_cache_tokens"] = kv // (64 * 1024)  # 64 KiB of KV cache per token
    trace.facts["vllm.config"] = {"max_model_len": 147456}  # one request needs 9 GiB
    # 0.92 x 40 GiB - 28.0 GiB non-KV = 8.80 GiB of KV cache: positive, but short of one request
    r = fit(trace, 40 * GiB)
    # vLLM's engine checks it between determine_available_memory and kv_cache_init (get_kv_cache_configs)
    assert (r.outcome, r.phase, r.stage) == (NO_KV, "KV sizing (after determine_available_memory)", ONE_REQUEST)
    assert 0.19 * GiB < r.overshoot_bytes < 0.21 * GiB
    assert fit(trace, 44 * GiB).outcome == FITS


def test_pinned_curve_drops_cached_segments_that_the_allocator_could_release():
    from memtrace.analysis.memory.curves import all_curves
    from memtrace.analysis.memory.pinned import pinned_curve

    trace = g.vllm_like_startup()
    curves = all_curves(trace)
    pinned = pinned_curve(trace, curves)
    assert (pinned.bytes <= curves.reserved.bytes).all()
    profile = next(p for p in trace.phases if p.name == "profile_run")
    # the 6 GiB activation was freed 530 ms before the end of profile_run and stays cached until
    # empty_cache at its end: reserved keeps it, pinned does not
    t = profile.end_us - 100_000
    assert curves.reserved.at(t) - pinned.at(t) == 6 * GiB
    # the 2 GiB warm-up segment stays cached to the end: the reserved peak (in capture_model) holds it
    assert curves.reserved.bytes[-1] - pinned.bytes[-1] == 2 * GiB
    assert curves.reserved.peak_bytes - pinned.peak_bytes == 512 * MiB  # pinned peaks in kernel_warmup


VLLM_RUN = unpacked(TESTS / "data" / "vllm-h200" / "startup")


@pytest.mark.skipif(not VLLM_RUN.is_dir(), reason="no real vLLM start-up under tests/data/vllm-h200 yet")
def test_real_vllm_startup_applies_vllms_own_checks():
    from memtrace.store import load_run

    trace = load_run(VLLM_RUN).traces[0]  # vLLM 0.25.1 on the H200, util 0.92, 117.02 GiB of KV cache
    full = fit(trace, trace.process.device_total_bytes)
    assert full.outcome == FITS
    # memtrace's reconstruction (what report shows) is vLLM's figure but for requested-vs-rounded weights
    assert full.kv_available_bytes - trace.facts["vllm.available_kv_cache_bytes"] == 1_068_928
    # and vLLM allocates whole blocks of it, as it did on this card (958,658 blocks of 131,072 B): 9 blocks more here
    per = trace.facts["vllm.kv_cache_bytes"] // trace.facts["vllm.kv_cache_blocks"]
    assert full.kv_blocks == full.kv_available_bytes // per and full.kv_cache_bytes == full.kv_blocks * per
    assert full.kv_blocks - trace.facts["vllm.kv_cache_blocks"] == 9
    assert (trace.facts["vllm.available_kv_cache_bytes"] % per + 1_068_928) // per == 9
    # vLLM's request_memory compares its own init snapshot's free memory with ceil(util x card): that snapshot
    # (after NCCL's init) saw this process use 552,402,944 B, not the 0.71 GiB the need curve holds at
    # init_device's end (its non-PyTorch part is NVML's at KV sizing, after cuBLAS and the like grew)
    snap = trace.facts["vllm.profile"]["init_snapshot"]
    used = snap["total_memory"] - snap["free_memory"]
    assert used == 552_402_944
    for card in (6 * GiB, 8 * GiB):  # 6 GiB: 8% of it is less than the snapshot's use; 8 GiB: more
        refused = math.ceil(0.92 * card) > card - used
        got = fit(trace, card)
        assert (got.outcome == REFUSED) == refused and card == (6 * GiB if refused else 8 * GiB)
        if refused:
            assert got.phase == "init_device" and got.overshoot_bytes == math.ceil(0.92 * card) - (card - used)
    small = fit(trace, 8 * GiB)  # past init, the 10.5 GiB of weights do not fit
    assert (small.outcome, small.phase) == (OOM, "load_model")
    mid = fit(trace, 12 * GiB)
    assert (mid.outcome, mid.phase) == (OOM, "determine_available_memory/profile_run")
    assert fit(trace, 16 * GiB).outcome == FITS


def test_vllm_refuses_at_init_when_util_leaves_less_than_the_cuda_context():
    trace = g.vllm_like_startup()
    trace.facts["vllm.version"] = "0.25.1"  # recorded by the vLLM plugin: vLLM's request_memory check applies
    # 900 MiB in use after init_device; 0.99 x 64 GiB leaves 655 MiB free of util: vLLM raises ValueError
    r = fit(trace, 64 * GiB, util=0.99)
    assert (r.outcome, r.phase) == (REFUSED, "init_device")
    assert fit(trace, 64 * GiB, util=0.92).outcome == FITS
    del trace.facts["vllm.version"]  # a plain PyTorch program makes no such check
    assert fit(trace, 64 * GiB, util=0.99).outcome != REFUSED


# -- issue 10: a recording that ended in an OOM says so, and never claims more than it covers --------

OOM_RUNS = ("startup-cap16g", "startup-cap20.75g")


def _run_fits(capsys, *argv) -> tuple[int, str, str]:
    """(exit code, stdout with wrapped lines joined, stderr)."""
    rc = main(["fits", *argv])
    cap = capsys.readouterr()
    return rc, cap.out if "--json" in argv else cap.out.replace("\n    ", " "), cap.err


@NEEDS_H200
@pytest.mark.parametrize("name", OOM_RUNS)
def test_a_run_that_died_of_oom_on_its_card_says_it_dies_there(name, capsys):
    outcome = json.loads(OUTCOMES.read_text())[name]
    run, card = str(H200 / name), f"{outcome['capacity_bytes'] / GiB:g}GiB"
    rc, out, _ = _run_fits(capsys, run, "--capacity", card)
    assert rc == 1  # it said "SURVIVES … 0.93 GiB to spare", exit 0, for cap16g
    assert f"DIES in {outcome['phase']}, where the recording died:" in out
    requested, requested_bytes = ("1024.00 MiB", GiB) if name == "startup-cap16g" else ("512.00 MiB", GiB // 2)
    assert f"died of CUDA OOM in {outcome['phase']}: requested {requested}, device free" in out
    assert "BOOTS" not in out and "Smallest card: unknown" in out
    rc, out, _ = _run_fits(capsys, run, "--capacity", card, "--json")
    doc = json.loads(out)
    assert rc == 1 and doc["smallest_fitting_capacity_bytes"] is None
    (r,) = doc["fits"]
    assert (r["verdict"], r["stage"], r["phase"], r["survives"]) == ("dies", "recorded OOM", outcome["phase"], False)
    assert r["recorded_oom"]["requested_bytes"] == requested_bytes


@NEEDS_H200
@pytest.mark.parametrize("name", OOM_RUNS + ("startup-cap6g",))
def test_a_recording_that_ended_in_oom_never_fits_any_card(name):
    from memtrace.analysis.analysed.run import analyse
    from memtrace.store import load_run

    rank = analyse(load_run(H200 / name).traces).ranks[0]
    trace = rank.trace
    card = trace.facts["capacity_bytes"]
    rows = [fit(trace, c) for c in (card, card + GiB, 2 * card, 8 * card)]
    assert rows[0].outcome == DIED  # the recorded card: as recorded
    assert all(r.outcome in (DIED, UNKNOWN) for r in rows), [r.outcome for r in rows]
    assert rows[-1].outcome == UNKNOWN and rows[-1].stage == "beyond the recording"
    assert rank.boot().smallest is None


@NEEDS_H200
def test_text_and_json_render_the_same_answer(capsys):
    from memtrace.plots.fits_text import HEADLINE

    # cap6g on 32 GiB printed "DIES in , after the KV cache … the post-KV peak would be —" while --json
    # said "unknown"
    for name in ("startup-cap6g", "startup-cap16g", "startup-cap32g", "startup-full"):
        for card in ("6GiB", "16GiB", "32GiB", "64GiB"):
            _, out, _ = _run_fits(capsys, str(H200 / name), "--capacity", card)
            _, js, _ = _run_fits(capsys, str(H200 / name), "--capacity", card, "--json")
            (r,) = json.loads(js)["fits"]
            words = {HEADLINE[r["verdict"]], "FITS" if r["verdict"] == "boots" else ""} - {""}  # FITS: not vLLM
            assert any(f"  {w}" in out for w in words), (name, card, out)
            assert "DIES in ," not in out and "—" not in out
            if r["phase"]:
                assert r["phase"] in out
    _, out, _ = _run_fits(capsys, str(H200 / "startup-cap6g"), "--capacity", "32GiB")
    assert "UNKNOWN: the recorded run died of CUDA OOM in profile_run: requested 1024.00 MiB" in out


@NEEDS_H200
@pytest.mark.parametrize("capacity", ["0", "1MiB", "512MiB", "-5GiB"])
def test_a_capacity_that_is_no_card_is_refused_in_one_line(capacity, capsys):
    rc, out, err = _run_fits(capsys, str(H200 / "startup-cap6g"), "--capacity", capacity)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "at least 1GiB" in err or "is negative" in err


@NEEDS_H200
def test_the_assumed_non_torch_memory_is_the_recorded_steady_figure(capsys):
    # cap6g has 181 NVML samples but no KV sizing: it printed "assumed: none recorded (no NVML)"
    _, out, _ = _run_fits(capsys, str(H200 / "startup-cap6g"), "--capacity", "32GiB")
    assert "assumed: 0.68 GiB (NVML, last steady sample)" in out
    assert "no NVML" not in out
    _, out, _ = _run_fits(capsys, str(H200 / "startup-cap32g"), "--capacity", "32GiB")
    assert "assumed: 0.68 GiB (NVML at KV sizing)" in out


PROBE = TESTS / "data" / "vllm-h200" / "flashinfer-probe"


@pytest.mark.skipif(not PROBE.is_dir(), reason="no real FlashInfer probe trace")
def test_a_program_with_no_kv_cache_fits_when_its_whole_curve_does(capsys):
    # a real FlashInfer probe on the H200 (not vLLM): it said "unknown: the recording ends before the KV
    # cache", and would have refused "no memory for the KV cache" on a card below its peak / util
    rc, out, _ = _run_fits(capsys, str(PROBE), "--capacity", "2GiB")
    assert rc == 0 and "FITS: its whole recording fits (no KV cache)" in out
    assert "it needs at most 0.32 GiB in moe_workspace_dynamic" in out and "vLLM" not in out  # its own terms
    assert "Smallest card this program fits on: 1.00 GiB or less" in out  # was "about 1.03 GiB": the floor
    assert "assumed: 0.04 GiB (NVML, last steady sample)" in out  # it has NVML samples


@pytest.mark.parametrize("capacities", ["80GiB", "80GiB,96GiB"])
def test_a_run_without_phases_says_outside_any_phase_not_an_empty_name(capacities, capsys):
    # issue 21: the three-device snapshot (no phases) printed "dies in , as recorded" and "peak 78.42 GiB in "

    snap = Path(__file__).resolve().parents[1] / "data" / "snapshots" / "multi-device-oom.pickle"
    assert main(["fits", str(snap), "--capacity", capacities, "--rank", "1"]) == 1
    out = capsys.readouterr().out
    assert "outside any phase" in out
    assert (
        " in ," not in out
        and " in  " not in out
        and not any(line.rstrip().endswith(" in") for line in out.splitlines())
    )


@pytest.mark.parametrize("non_torch", ["96GiB", "100GiB"])
def test_non_torch_memory_that_fills_the_card_is_refused_in_one_line(non_torch, capsys):
    # issue 21: --non-torch 100GiB on a 96 GiB card was accepted (and predicted on)
    run = TESTS / "data" / "h200" / "startup-full"
    assert main(["fits", str(run), "--capacity", "96GiB,192GiB", "--non-torch", non_torch]) == 2
    got = capsys.readouterr()
    assert got.out == "" and got.err.count("\n") == 1
    assert f"--non-torch {non_torch[:-3]}.00 GiB is not less than the 96.00 GiB card" in got.err
