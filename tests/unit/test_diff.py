"""memtrace diff: the regression gate. Synthetic start-ups (named so) until real H200 pairs exist,
then the real pair recorded with and without --workspace-extra 1GiB (tests/data/h200)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import synthetic_gates as g
from memtrace.cli import main
from memtrace.store import save_trace
from memtrace.units import parse_threshold
from references import diff_traces
from testdata import unpacked

TESTS = Path(__file__).resolve().parents[1]
GiB, MiB = g.GiB, g.MiB


@pytest.fixture(scope="module")
def synthetic_runs(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("runs")
    runs = {
        "base": g.vllm_like_startup(),
        "same": g.vllm_like_startup(),
        "workspace_1gib": g.vllm_like_startup(extra_workspace=GiB),
        "warmup_plus_1gib": g.vllm_like_startup(warmup=3 * GiB),
        "oom": g.vllm_like_startup(oom_in="profile_run"),
    }
    return {name: save_trace(t, d / f"{name}.memtrace") for name, t in runs.items()}


def _run(capsys, *argv) -> tuple[int, str, str]:
    rc = main(["diff", *map(str, argv)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_identical_synthetic_runs_pass_with_exit_0(synthetic_runs, capsys):
    rc, out, _ = _run(capsys, synthetic_runs["base"], synthetic_runs["same"], "--fail-over", "2%")
    assert rc == 0
    assert "OK: nothing grew more than 2%" in out


def test_synthetic_workspace_growth_fails_in_profile_run_and_names_the_site(synthetic_runs, capsys):
    rc, out, _ = _run(capsys, synthetic_runs["base"], synthetic_runs["workspace_1gib"], "--fail-over", "2%")
    assert rc == 1
    # headline first: available KV and memory before KV sizing, old -> new, delta
    head = out.splitlines()[2:5]
    assert head[0].startswith("Headline")
    assert "available KV cache (vLLM)      15.26 GiB →   14.26 GiB      -1.00 GiB" in head[1]
    assert "memory before KV sizing        22.90 GiB →   23.90 GiB      +1.00 GiB" in head[2]
    assert "phase determine_available_memory/profile_run: 28.90 GiB → 29.90 GiB (+1.00 GiB" in out
    assert "new     +1.00 GiB     0.00 GiB →    1.00 GiB  allocate_extra_workspace (my_patch/workspace.py:17)" in out
    assert "hooked allocate_sm120_dynamic_workspace: 2.00 GiB → 3.00 GiB (+1.00 GiB" in out
    assert "FAIL: 4 figure(s) grew more than 2% (exit 1)" in out


def test_synthetic_workspace_growth_changes_nothing_else(synthetic_runs):
    base, new = (g.vllm_like_startup(), g.vllm_like_startup(extra_workspace=GiB))
    d = diff_traces(base, new, parse_threshold("2%"))
    grown = {p.path: p.peak.delta for p in d.phases if p.peak.delta}
    assert grown == {"determine_available_memory": GiB, "determine_available_memory/profile_run": GiB}
    assert [c.label for c in d.regressions] == [
        "memory before KV sizing",
        "determine_available_memory",
        "determine_available_memory/profile_run",
        "flashinfer.fused_moe.cute_dsl.blackwell_sm12x.moe_dispatch.allocate_sm120_dynamic_workspace",
    ]
    assert [c.label for c in d.headline if c.delta] == [
        "available KV cache (vLLM)",
        "memory before KV sizing",
        "KV cache",
    ]
    cats = {c.label: c.delta for c in d.categories if c.delta}
    assert cats == {"flashinfer_workspace": GiB, "kv_cache": -GiB}
    assert [(s.frames[0].name, s.delta) for s in d.sites] == [
        ("allocate_extra_workspace", GiB),
        ("_allocate_kv_cache_tensors", -GiB),
    ]
    (hook,) = d.hooks
    assert (hook.base_bytes_per_call, hook.new_bytes_per_call) == ((2 * GiB,), (3 * GiB,))


def test_a_growth_inside_profile_run_fails_even_when_the_global_peak_is_unchanged():
    # a fixed KV cache (--kv-cache-memory) keeps the global peak in warm-up, where nothing changed
    base = g.vllm_like_startup(kv_cache=14 * GiB)
    new = g.vllm_like_startup(kv_cache=14 * GiB, activation=7 * GiB)  # profile_run's spike +1 GiB
    d = diff_traces(base, new, parse_threshold("2%"))
    peaks = [c for c in d.headline if c.label.startswith("peak ")]
    assert [c.label for c in peaks] == ["peak reserved", "peak allocated", "peak device used"]
    assert all(c.delta == 0 for c in peaks)
    assert "determine_available_memory/profile_run" in [c.label for c in d.regressions]
    assert d.failed


def test_post_kv_transient_growth_fails(synthetic_runs, capsys):
    rc, out, _ = _run(capsys, synthetic_runs["base"], synthetic_runs["warmup_plus_1gib"], "--fail-over", "512MiB")
    assert rc == 1
    assert "post-KV transient: 2.50 GiB → 3.50 GiB (+1.00 GiB, allowed +512.0 MiB)" in out


def test_absolute_threshold_above_the_growth_passes(synthetic_runs, capsys):
    rc, out, _ = _run(capsys, synthetic_runs["base"], synthetic_runs["workspace_1gib"], "--fail-over", "1.5GiB")
    assert rc == 0


def test_new_run_dying_of_oom_fails(synthetic_runs, capsys):
    rc, out, _ = _run(capsys, synthetic_runs["base"], synthetic_runs["oom"])
    assert rc == 1
    assert "the new run died of CUDA OOM in determine_available_memory/profile_run" in out


def test_json_output_carries_the_regressions(synthetic_runs, capsys):
    rc, out, _ = _run(capsys, synthetic_runs["base"], synthetic_runs["workspace_1gib"], "--json")
    doc = json.loads(out)
    assert rc == 1 and doc["failed"] is True
    (t,) = doc["traces"]
    assert [r["label"] for r in t["regressions"]][0] == "memory before KV sizing"
    assert t["regressions"][0]["delta_bytes"] == GiB


@pytest.mark.parametrize(
    "argv, message",
    [
        (["missing-dir", "missing-dir"], "no such file or directory"),
        (["{base}", "{base}", "--fail-over", "lots"], "cannot read limit 'lots': write a percentage (2%) or a size"),
        (["{base}", "{not_a_trace}"], "is not a memtrace trace"),
        # both runs are loaded at once; the base's error is the one said, as when they loaded one by one
        (["{not_a_trace}", "missing-dir"], "junk.memtrace is not a memtrace trace"),
        (["missing-dir", "{not_a_trace}"], "missing-dir: no such file or directory"),
    ],
)
def test_bad_input_exits_2_with_one_line(synthetic_runs, tmp_path, capsys, argv, message):
    junk = tmp_path / "junk.memtrace"
    junk.write_text("hello")
    argv = [a.format(base=synthetic_runs["base"], not_a_trace=junk) for a in argv]
    rc, out, err = _run(capsys, *argv)
    assert rc == 2
    assert err.startswith("memtrace: error: ") and message in err
    assert len(err.strip().splitlines()) == 1


# -- real H200 runs: examples/record_startup.py with and without --workspace-extra 1GiB -------------

H200 = TESTS / "data" / "h200"
REAL_PAIR = (H200 / "startup-full", H200 / "startup-ws1g")
NEEDS_PAIR = pytest.mark.skipif(
    not all(p.is_dir() for p in REAL_PAIR),
    reason="no real H200 pair (startup-full, startup-ws1g) under tests/data/h200 yet",
)
TOL = 64 * MiB  # allocator rounding and NVML sampling; far below the 1 GiB change


@pytest.fixture(scope="module")
def real_diff():
    from memtrace.store import load_run

    base, new = (load_run(p).traces[0] for p in REAL_PAIR)
    return diff_traces(base, new, parse_threshold("2%"))


@NEEDS_PAIR
def test_real_workspace_extra_shows_as_1gib_growth_inside_profile_run(real_diff):
    phases = {p.path: p for p in real_diff.phases}
    assert abs(phases["profile_run"].peak.delta - GiB) < TOL
    assert abs(phases["profile_run"].inside_delta - GiB) < TOL
    before = next(c for c in real_diff.headline if c.label == "memory before KV sizing")
    assert abs(before.delta - GiB) < TOL
    kv = next(c for c in real_diff.headline if c.label == "available KV cache (vLLM)")
    assert abs(kv.delta + GiB) < TOL  # the KV cache pays for it


@NEEDS_PAIR
def test_real_workspace_extra_changes_nothing_else(real_diff):
    phases = {p.path: p for p in real_diff.phases}
    for path, p in phases.items():
        if path == "profile_run":
            continue
        if path == "kv_cache_init":  # the KV cache is 1 GiB smaller
            assert abs(p.inside_delta + GiB) < TOL, path
            continue
        assert abs(p.inside_delta) < TOL, f"{path} grew by {p.inside_delta} B inside itself"
    post = next(c for c in real_diff.headline if c.label == "post-KV transient")
    assert abs(post.delta) < TOL
    cats = {c.label: c.delta for c in real_diff.categories if abs(c.delta) >= TOL}
    assert cats.keys() == {"flashinfer_workspace", "kv_cache"}  # the hooked workspace grew, the KV cache paid
    assert abs(cats["flashinfer_workspace"] - GiB) < TOL and abs(cats["kv_cache"] + GiB) < TOL
    assert [
        c.label for c in real_diff.regressions if not c.label.startswith(("profile_run", "determine_available"))
    ] == ["memory before KV sizing"]


@NEEDS_PAIR
def test_real_workspace_extra_names_the_workspace_site(real_diff):
    grew = [s for s in real_diff.sites if s.delta > 0]
    assert grew and abs(grew[0].delta - GiB) < TOL
    assert any(f.name == "allocate_sm120_dynamic_workspace" for f in grew[0].frames)
    assert all(abs(s.delta) < TOL for s in grew[1:])


@NEEDS_PAIR
def test_stacks_are_keyed_as_site_key_says_frame_by_frame():
    """The diff keys each stack through a per-frame memo; it must give :func:`site_key`'s answer for every stack."""
    from memtrace.analysis.gate.diff_sites import SiteKeys, site_key
    from memtrace.store import load_run

    trace = load_run(REAL_PAIR[1]).traces[0]
    keys = SiteKeys(trace)
    assert len(trace.stacks) > 100
    assert [keys(s) for s in range(-1, len(trace.stacks))] == [
        site_key(trace.stack_frames(s)) for s in range(-1, len(trace.stacks))
    ]
    assert any(name == "allocate_sm120_dynamic_workspace" for s in range(len(trace.stacks)) for name, _ in keys(s))


@NEEDS_PAIR
def test_real_pair_cli_exit_codes(capsys):
    base, new = REAL_PAIR
    assert main(["diff", str(base), str(new), "--fail-over", "2%"]) == 1
    out = capsys.readouterr().out
    assert "profile_run" in out.split("Over the threshold")[1].split("Per phase")[0]
    assert main(["diff", str(base), str(base)]) == 0
    assert main(["diff", str(base), str(new), "--fail-over", "2GiB"]) == 0


# -- issue 13 item 3: a gate that cannot be fooled ------------------------------------------------------------

H200 = TESTS / "data" / "h200"
VLLM_RUN = unpacked(TESTS / "data" / "vllm-h200" / "startup")


def _phaseless_snapshot(run: str, out: Path) -> Path:
    """A real H200 trace exported for memory_viz with its phases removed: what an imported snapshot looks like."""
    import pickle

    from memtrace.store import load_run
    from references import snapshot_dict

    snap = snapshot_dict(load_run(H200 / run).traces[0])
    snap["external_annotations"] = []
    with open(out, "wb") as f:
        pickle.dump(snap, f, protocol=4)
    return out


@pytest.fixture(scope="module")
def snapshots(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("snapshots")
    return {r: _phaseless_snapshot(f"startup-{r}", d / f"{r}.pickle") for r in ("cap16g", "cap20.75g", "full", "ws1g")}


def test_phaseless_snapshot_pair_fails_on_global_peak_growth(snapshots, capsys):
    before = {p: p.read_bytes() for p in snapshots.values()}
    rc, out, err = _run(capsys, snapshots["cap16g"], snapshots["cap20.75g"], "--fail-over", "2%")
    assert rc == 1
    # 15,458,107,392 -> 21,495,808,000 B reserved (+39.1 %), the figures `memtrace report` shows for these runs
    assert "peak reserved                  14.40 GiB →   20.02 GiB      +5.62 GiB (+39.1%)  << over 2%" in out
    assert "peak allocated                 14.32 GiB →   19.94 GiB      +5.62 GiB (+39.3%)  << over 2%" in out
    assert "neither run recorded phases" in out
    assert "FAIL: 2 figure(s) grew more than 2% (exit 1)" in out
    assert "pickle" in err  # the loader's warning, once per file
    assert before == {p: p.read_bytes() for p in snapshots.values()}


def test_phaseless_snapshot_global_peaks_match_the_recorded_run():
    import tempfile

    from memtrace.analysis.gate.diff import PEAK_ALLOCATED, PEAK_RESERVED, figures
    from memtrace.store import load_run
    from references import trace_from_snapshot_file

    with tempfile.TemporaryDirectory() as d:
        snap = trace_from_snapshot_file(_phaseless_snapshot("startup-cap16g", Path(d) / "x.pickle"))
    live = load_run(H200 / "startup-cap16g").traces[0]
    fs, fl = figures(snap), figures(live, device_level=False)
    assert fs.phases == {} and fl.phases
    assert fs.headline[PEAK_RESERVED] == fl.headline[PEAK_RESERVED] == 15_458_107_392
    assert fs.headline[PEAK_ALLOCATED] == fl.headline[PEAK_ALLOCATED]


def test_phaseless_snapshots_of_an_unchanged_peak_pass(snapshots, capsys):
    # the workspace-extra run's 1 GiB is paid by the KV cache: the global peaks do not move
    rc, out, _ = _run(capsys, snapshots["full"], snapshots["ws1g"], "--fail-over", "2%")
    assert rc == 0, out
    assert "OK: nothing grew more than 2%" in out


def test_a_shrinking_peak_passes_and_a_size_threshold_applies_to_peaks(snapshots, capsys):
    assert _run(capsys, snapshots["cap20.75g"], snapshots["cap16g"], "--fail-over", "2%")[0] == 0
    assert _run(capsys, snapshots["cap16g"], snapshots["cap20.75g"], "--fail-over", "6GiB")[0] == 0
    assert _run(capsys, snapshots["cap16g"], snapshots["cap20.75g"], "--fail-over", "5GiB")[0] == 1


def test_vllm_run_against_a_plain_pytorch_script_warns_which_fields_differ(capsys):
    rc, out, _ = _run(capsys, VLLM_RUN, H200 / "startup-full", "--fail-over", "2%")
    warning = out.split("WARNING: the two runs are not comparable; they differ in:")[1].split("Headline")[0]
    assert "  kind: vllm → pytorch" in warning
    assert "Versions compared: vllm 0.25.1 → —, flashinfer 0.6.13 → —" in out
    assert "  model: /tmp/model → record_startup.py" in warning
    assert "(the runs are not comparable: see the WARNING above)" in out
    rc, out, _ = _run(capsys, VLLM_RUN, H200 / "startup-full", "--json")
    doc = json.loads(out)
    assert doc["comparable"] is False
    fields = {m["field"]: (m["base"], m["new"]) for m in doc["traces"][0]["mismatches"]}
    assert fields["kind"] == ("vllm", "pytorch") and fields["max_num_seqs"] == ("8", "—")


def test_two_runs_of_one_matrix_key_are_comparable(capsys):
    rc, out, _ = _run(capsys, H200 / "startup-full", H200 / "startup-ws1g")
    assert "WARNING" not in out and "note: a run recorded no environment" not in out
    rc, out, _ = _run(capsys, H200 / "startup-full", H200 / "startup-cap32g")
    assert "  card_bytes: — → 32.00 GiB" in out  # a run that stood for a 32 GiB card is another key


def test_new_run_dying_of_oom_names_phase_request_and_free_memory(capsys):
    # startup-cap6g died in profile_run asking for 1 GiB (outcomes.json); the OOM comes from analysis.oom
    rc, out, _ = _run(capsys, H200 / "startup-cap32g", H200 / "startup-cap6g", "--fail-over", "100GiB")
    assert rc == 1
    assert "the new run died of CUDA OOM in profile_run: requested 1024.00 MiB, device free 134.06 GiB" in out
    rc, out, _ = _run(capsys, H200 / "startup-cap16g", H200 / "startup-cap6g", "--fail-over", "100GiB")
    assert rc == 0  # the base died too: not a new failure


def test_hooked_bytes_are_what_each_call_added():
    from memtrace.analysis.gate.diff import hook_call_bytes

    # the real 0.6.13 dynamic allocator on the H200: 94,974,860 B returned, 95,110,144 B allocated (512 B blocks)
    assert hook_call_bytes(94_974_860, 95_110_144) == 94_974_860
    # a wrapper handed shared workspaces returns them again but allocates nothing: it adds nothing
    assert hook_call_bytes(337_578_440, 0) == 0
    assert hook_call_bytes(None, 4096) == 4096 and hook_call_bytes(1000, None) == 1000


def test_shared_workspaces_show_as_a_drop_per_hook_target_FAKE_calls():
    # FAKE: the hooked calls of 40 layers are made up from the real probe call (one allocating, the
    # rest handed the first one's storages), as FlashInfer 0.7's shared workspaces would record them
    import dataclasses

    from memtrace.store import load_run

    probe = load_run(TESTS / "data" / "vllm-h200" / "flashinfer-probe").traces[0]
    first = next(c for c in probe.hook_calls if c.parent is None)
    per_layer = dataclasses.replace(probe, hook_calls=[first] * 40)
    shared = dataclasses.replace(probe, hook_calls=[first] + [dataclasses.replace(first, allocated_delta_bytes=0)] * 39)
    d = diff_traces(per_layer, shared, parse_threshold("2%"))
    (total,) = d.hook_totals
    assert (total.base, total.new) == (40 * 94_974_860, 94_974_860)
    assert not d.failed
    assert diff_traces(shared, per_layer, parse_threshold("2%")).failed  # and back: +39 workspaces fail the gate


SNAPSHOTS = TESTS / "data" / "snapshots"


@pytest.mark.skipif(not (SNAPSHOTS / "stacks-all.pickle").exists(), reason="public snapshots not shipped")
def test_real_public_snapshots_without_phases_are_gated_on_their_peaks(capsys):
    # two students' runs of one assignment (tests/data/snapshots/README.md): phase-less, no NVML
    small, big = SNAPSHOTS / "stacks-all.pickle", SNAPSHOTS / "python-stacks.pickle"
    rc, out, _ = _run(capsys, small, big, "--fail-over", "2%")
    assert rc == 1
    assert "peak reserved                   3.52 GiB →   13.21 GiB      +9.69 GiB (+275.0%)  << over 2%" in out
    assert "note: a run recorded no environment (GPU, versions, model, flags): comparability not checked" in out
    assert "FAIL: 2 figure(s) grew more than 2% (exit 1)" in out
    assert _run(capsys, big, small, "--fail-over", "2%")[0] == 0
    assert _run(capsys, small, small, "--fail-over", "0%")[0] == 0


def test_diff_peaks_are_report_peaks_on_every_real_trace():
    from memtrace.analysis.gate.diff import PEAK_ALLOCATED, PEAK_DEVICE, PEAK_RESERVED, figures
    from memtrace.store import load_trace
    from references import summarize
    from testdata import real_traces

    paths = real_traces()
    assert len(paths) >= 9
    for path in paths:
        trace = load_trace(path)
        f, s = figures(trace), summarize(trace)
        assert (f.headline[PEAK_RESERVED], f.where[PEAK_RESERVED]) == (s.peak.reserved_bytes, s.peak.phase_path)
        assert (f.headline[PEAK_ALLOCATED], f.where[PEAK_ALLOCATED]) == (
            s.peak_allocated.bytes,
            s.peak_allocated.phase_path,
        )
        if s.peak_device_used is not None:
            assert f.headline[PEAK_DEVICE] == s.peak_device_used.bytes, path
        else:
            assert PEAK_DEVICE not in f.headline


def test_a_new_run_that_recorded_nothing_fails_the_gate(tmp_path, capsys):
    # what FlashInfer 0.7.4 did on the H200: the import failed inside memtrace.trace(), leaving a trace of
    # the environment and no allocator event; diff said "OK: nothing grew" before
    from memtrace.model import Trace
    from memtrace.store import load_trace, save_trace

    base = H200 / "startup-full"
    empty = load_trace(next(base.glob("*.memtrace")))
    empty = Trace(process=empty.process, recording=empty.recording, facts=empty.facts)
    new = save_trace(empty, tmp_path / "empty.memtrace")
    rc, out, err = _run(capsys, base, new)
    assert rc == 1 and out == ""
    assert err.count("\n") == 1 and "recorded no allocator events" in err and "not passed" in err


SEED = H200.parent / "h200"


def test_flashinfer_release_pair_from_the_real_allocators_per_target_and_in_total(capsys):
    # the seed's 40 B12xMoEWrapper per-layer workspaces on the H200: FlashInfer 0.6.13 vs 0.7.4
    rc, out, _ = _run(capsys, SEED / "seed-b12x-0613", SEED / "seed-b12x-074", "--fail-over", "2%")
    assert rc == 0 and "WARNING" not in out
    assert "Versions compared: flashinfer 0.6.13 → 0.7.4" in out
    assert "total B12xMoEWrapper._allocate_buffers: 12.58 GiB → 6.71 GiB (-5.86 GiB)" in out
    # nested calls are shown under their caller, so no line is added to its siblings (issue 34: the flat list
    # of "inside" lines added up to 22.66 GiB under a 12.58 GiB total)
    assert (
        "    inside B12xMoEWrapper._allocate_buffers: allocate_sm120_moe_workspace: 11.33 GiB → 5.46 GiB (-5.86 GiB)\n"
        "      inside allocate_sm120_moe_workspace: allocate_sm120_dynamic_workspace: 4.25 GiB → 4.24 GiB (-2.0 MiB)\n"
        "      inside allocate_sm120_moe_workspace: allocate_sm120_static_workspace: 7.08 GiB → 1.22 GiB (-5.86 GiB)\n"
    ) in out
    # the other way round is a release that grew: the gate fails on the peaks and the hooked total
    rc, out, _ = _run(capsys, SEED / "seed-b12x-074", SEED / "seed-b12x-0613", "--fail-over", "2%")
    assert rc == 1
    assert "total B12xMoEWrapper._allocate_buffers: 6.71 GiB → 12.58 GiB (+5.86 GiB)  << over 2%" in out
    # shared workspaces (flashinfer#4603): one wrapper's worth for all 40 layers
    rc, out, _ = _run(capsys, SEED / "seed-b12x-074", SEED / "seed-b12x-074-shared", "--json")
    doc = json.loads(out)
    totals = {c["label"]: (c["base_bytes"], c["new_bytes"]) for c in doc["traces"][0]["hook_totals"]}
    assert totals["flashinfer.fused_moe.cute_dsl.b12x_moe:B12xMoEWrapper._allocate_buffers"] == (
        7_208_031_040,
        180_200_776,
    )


# -- by allocating stack (issue 21): frames matched by function and file, never by line ---------------------


def _sites_section(out: str) -> list[str]:
    lines = out.split("By allocating stack", 1)[1].splitlines()[1:]
    return lines[: lines.index("")] if "" in lines else lines


def test_a_flashinfer_release_that_moved_its_lines_matches_the_same_workspace_allocator(capsys):
    # FlashInfer 0.6.13 -> 0.7.4 on the H200: allocate_sm120_dynamic_workspace moved from one line to another
    # of blackwell_sm12x/moe_dispatch.py; it is the same allocator, holding 4.25 GiB -> 4.24 GiB as its hook says
    rc, out, _ = _run(capsys, SEED / "seed-b12x-0613", SEED / "seed-b12x-074", "--json")
    (d,) = json.loads(out)["traces"]
    assert not any(s["new"] for s in d["sites"])  # nothing is "new" just because its line moved
    dyn = [s for s in d["sites"] if s["frames"][0][2] == "allocate_sm120_dynamic_workspace"]
    assert [(s["base_bytes"] >> 20, s["new_bytes"] >> 20, s["delta_bytes"] >> 20) for s in dyn] == [(4347, 4345, -2)]
    rc, out, _ = _run(capsys, SEED / "seed-b12x-0613", SEED / "seed-b12x-074")
    rows = _sites_section(out)
    assert not any(r.lstrip().startswith("new") for r in rows)
    assert any("allocate_sm120_dynamic_workspace" in r and "4.25 GiB →    4.24 GiB" in r for r in rows)


def test_a_stack_that_vanished_is_listed_as_gone():
    base, new = g.vllm_like_startup(extra_workspace=GiB), g.vllm_like_startup()
    d = diff_traces(base, new, parse_threshold("2%"))
    gone = [s for s in d.sites if s.vanished]
    assert [(s.frames[0].name, s.base_bytes, s.new_bytes) for s in gone] == [("allocate_extra_workspace", GiB, 0)]


def test_a_base_recorded_without_stacks_is_said_so_instead_of_everything_new(capsys):
    # the real vLLM start-up on the H200 recorded without stacks, against the same start-up with stacks: the KV
    # cache is not "new +117.02 GiB"
    vllm = TESTS / "data" / "vllm-h200"
    rc, out, _ = _run(capsys, unpacked(vllm / "startup"), unpacked(vllm / "startup-stacks"))
    rows = _sites_section(out)
    assert rows == ["  not compared: the base run recorded no Python stacks (MEMTRACE_STACKS=python records them)"]
    assert "+117.02 GiB" not in out
    rc, out, _ = _run(capsys, unpacked(vllm / "startup"), unpacked(vllm / "startup-stacks"), "--json")
    (d,) = json.loads(out)["traces"]
    assert d["sites"] == [] and d["sites_without_stacks"] == "base"
