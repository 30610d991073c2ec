"""Clock offsets: the round-trip measurement, the test-only clock-skew shim, the ``clock`` fact, and each rank's
offset to the driver's clock as recorded (``tests/aligned_clocks.py``)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from aligned_clocks import alignment
from memtrace import facts as F
from memtrace.capture import clock
from memtrace.model import Phase, Process, Trace
from ray_cluster import worker_shim

ROOT = Path(__file__).resolve().parents[2]


class World:
    """One true clock; a worker reads it ``skew`` µs ahead; each call to the driver takes (out, back) µs."""

    def __init__(self, skew: int, trips: list[tuple[int, int]]):
        self.t = 1_000_000_000
        self.skew = skew
        self.trips = list(trips)
        self.remote_reads: list[int] = []

    def local(self) -> int:
        return self.t + self.skew

    def remote(self) -> int:
        out, back = self.trips.pop(0)
        self.t += out
        self.remote_reads.append(self.t)
        self.t += back
        return self.t - back


def test_the_round_trip_with_the_smallest_rtt_gives_the_offset_and_half_of_it_the_uncertainty():
    world = World(skew=5_000_000, trips=[(900, 100), (300, 300), (40, 60), (2_000, 10)])
    got = clock.measure_offset(world.remote, rounds=4, local_now=world.local)
    # best trip: 40 out, 60 back (RTT 100): the remote read lies 10 µs before the midpoint
    assert got == clock.Offset(offset_us=-5_000_010, uncertainty_us=50, rtt_us=100, rounds=4)
    assert abs(got.offset_us - (-world.skew)) <= got.uncertainty_us


def test_a_symmetric_round_trip_measures_the_skew_exactly():
    world = World(skew=-1_234_567, trips=[(500, 500)] * 3)
    got = clock.measure_offset(world.remote, rounds=3, local_now=world.local)
    assert (got.offset_us, got.uncertainty_us, got.rtt_us) == (1_234_567, 500, 1_000)


SKEWED = (
    "import json, sys, time, memtrace\n"
    "from memtrace.capture import clock\n"
    "true = time.time_ns() // 1000\n"
    "with memtrace.trace(sys.argv[1], sidecar=False, handle_signals=False) as s:\n"
    "    with memtrace.phase('p'):\n"
    "        pass\n"
    "t = memtrace.load(s.path).traces[0]\n"
    "print(json.dumps({'skew': clock.now_us() - time.time_ns() // 1000, 'start': t.phases[0].start_us - true,"
    " 'clock': t.facts['clock'], 'offset': clock.measure_offset(lambda: time.time_ns() // 1000).offset_us}))\n"
)


def _run_skewed(tmp_path, env: dict[str, str]) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", SKEWED, str(tmp_path / "run")],
        env={**_env(), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_test_shim_skews_memtraces_clock_and_the_times_a_session_stamps(tmp_path):
    got = _run_skewed(tmp_path, worker_shim(clock_skew_us=123_000_000))
    assert 122_990_000 < got["skew"] <= 123_000_000
    assert 123_000_000 <= got["start"] < 123_000_000 + 30_000_000  # the phase is stamped on the skewed clock
    assert got["clock"]["method"] == "same-host" and got["clock"]["offset_us"] == 0
    # measure_offset's own default clock is the skewed one too: an unskewed remote is 123 s behind
    assert -123_000_000 <= got["offset"] < -122_990_000


def test_the_shipped_package_has_no_clock_knob(tmp_path):
    got = _run_skewed(tmp_path, {"MEMTRACE_TEST_CLOCK_SKEW_US": "123000000"})  # the package's former knob
    assert abs(got["skew"]) < 10_000 and 0 <= got["start"] < 30_000_000
    sources = [p for folder in ("tracer", "plugins", "plots") for p in (ROOT / folder).rglob("*.py")]
    assert len(sources) > 50
    assert [str(p) for p in sources if re.search(r"MEMTRACE_TEST|MT_TEST_", p.read_text())] == []


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("MEMTRACE")}


def test_a_process_on_the_drivers_host_shares_its_clock_and_one_elsewhere_is_unmeasured():
    here = clock.hostname()
    assert clock.local_fact({clock.DRIVER_HOST_ENV: here}) == {
        "host": here,
        "reference_host": here,
        "method": "same-host",
        "offset_us": 0,
        "uncertainty_us": 0,
    }
    assert clock.local_fact({})["method"] == "same-host"  # no driver named: the run started here
    other = clock.local_fact({clock.DRIVER_HOST_ENV: "head-node"})
    assert (other["method"], other["offset_us"], other["reference_host"]) == ("unmeasured", None, "head-node")


def test_the_driver_host_is_exported_once_for_every_child():
    env = {}
    assert clock.export_driver_host(env) == clock.hostname() == env[clock.DRIVER_HOST_ENV]
    env = {clock.DRIVER_HOST_ENV: "head-node"}
    assert clock.export_driver_host(env) == "head-node"


def _trace(rank: int, host: str, clock_fact: dict | None, phase_end_us: int = 2_000) -> Trace:
    facts = {F.CLOCK: clock_fact} if clock_fact is not None else {}
    return Trace(
        process=Process(pid=100 + rank, hostname=host, rank=rank),
        phases=[Phase("barrier", 1_000, phase_end_us)],
        facts=facts,
    )


def _ray(host: str, offset: int, unc: int) -> dict:
    return {"host": host, "reference_host": "head", "method": "ray", "offset_us": offset, "uncertainty_us": unc}


def _same(host: str = "head") -> dict:
    return {"host": host, "reference_host": "head", "method": "same-host", "offset_us": 0, "uncertainty_us": 0}


def test_ranks_on_other_hosts_are_shifted_by_their_measured_offsets():
    traces = [_trace(0, "head", _same()), _trace(1, "node-b", _ray("node-b", -5_000_012, 412), 5_002_012)]
    a = alignment(traces)
    assert a.aligned and a.uncertainty_us == 412 and a.reference_host == "head"
    assert [r.to_driver_us(t.phases[0].end_us) for r, t in zip(a.ranks, traces, strict=True)] == [2_000, 2_000]
    assert a.statement == (
        "aligned to the driver's clock (head) within ± 0.41 ms: rank 1 -5.000012 s ± 0.41 ms (ray, node-b); "
        "1 on the driver's host"
    )


def test_a_rank_without_a_measured_offset_leaves_the_run_unaligned_and_says_whose():
    traces = [
        _trace(0, "head", _same()),
        _trace(
            1,
            "node-b",
            {
                "host": "node-b",
                "reference_host": "head",
                "method": "unmeasured",
                "offset_us": None,
                "uncertainty_us": None,
            },
        ),
    ]
    a = alignment(traces)
    assert not a.aligned and a.uncertainty_us is None
    assert a.ranks[1].to_driver_us(7) == 7
    assert a.statement == (
        "not aligned: no measured offset to the driver's clock (head) for rank 1 (node-b); "
        "their times are their own hosts' clocks"
    )


def test_traces_from_before_clock_facts_share_a_clock_only_when_they_share_a_host():
    one_host = alignment([_trace(0, "vm", None), _trace(1, "vm", None)])
    assert one_host.aligned and [r.offset_us for r in one_host.ranks] == [0, 0]
    assert one_host.statement == "one clock: all 2 traces were recorded on the driver's host (vm)"
    two_hosts = alignment([_trace(0, "a", None), _trace(1, "b", None)])
    assert not two_hosts.aligned and two_hosts.statement.startswith("not aligned: ")
    assert "rank 0 (a), rank 1 (b)" in two_hosts.statement


def test_one_trace_and_no_trace_have_their_own_statements():
    assert alignment([_trace(0, "vm", _same("vm"))]).statement == "one trace on vm: its own clock"
    assert alignment([]).statement == "no traces"
