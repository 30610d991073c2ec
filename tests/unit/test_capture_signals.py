"""A traced process stopped by SIGTERM, SIGINT or SIGKILL leaves a readable trace (CPU-only session).

No clock decides an outcome: the child prints "ready" inside its phase and then waits in ``signal.pause()``
for the signal however late it comes (it slept 60 s before, so a signal later than that met a clean exit),
and its exit is waited for with a limit only against a hang (on this 2-core machine under load the child's
interpreter teardown alone, torch's modules garbage-collected, took 5 s of the 60 s the test allowed:
measured with 3 busy loops, faulthandler said "Garbage-collecting").
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest
from memtrace.store import load_run

CHILD = textwrap.dedent(
    """
    import signal, sys
    import memtrace
    if sys.argv[2] == "own-handler":
        signal.signal(signal.SIGTERM, lambda s, f: (print("own handler ran", flush=True), sys.exit(7)))
    session = memtrace.start(sys.argv[1])
    session.set_fact("marker", 42)
    with memtrace.phase("work"):
        print("ready", flush=True)
        while True:
            signal.pause()  # returns only after a handler that did not raise (none here): wait again
    """
)


#: A bound only against a hung child, never a measure of speed.
EXIT_WAIT_S = 600


def _run(tmp_path, sig, mode="plain"):
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path), mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert child.stdout.readline().strip() == "ready"
    child.send_signal(sig)
    out, err = child.communicate(timeout=EXIT_WAIT_S)
    return child.returncode, out, err, load_run(tmp_path).traces[0]


def test_sigterm_writes_the_trace_and_the_process_still_dies_of_sigterm(tmp_path):
    code, _, _, trace = _run(tmp_path, signal.SIGTERM)
    assert code == -signal.SIGTERM
    assert trace.recording.end_reason == "signal:SIGTERM"
    assert trace.facts["marker"] == 42
    assert [p.name for p in trace.phases] == ["work"] and trace.phases[0].end_us is None


def test_sigterm_chains_the_programs_own_handler(tmp_path):
    code, out, _, trace = _run(tmp_path, signal.SIGTERM, "own-handler")
    assert "own handler ran" in out and code == 7
    assert trace.recording.end_reason == "signal:SIGTERM"


def test_sigint_raises_keyboardinterrupt_as_before_and_the_trace_is_written_at_exit(tmp_path):
    code, _, err, trace = _run(tmp_path, signal.SIGINT)
    assert "KeyboardInterrupt" in err and code == -signal.SIGINT  # Python exits of an uncaught one by SIGINT
    assert trace.recording.end_reason.startswith("exit") or trace.recording.end_reason == "stop"
    assert trace.phases[0].end_us is not None  # the with-block unwound


@pytest.mark.parametrize("delay", [0.0, 0.2])
def test_sigkill_leaves_everything_flushed_before_it_readable(tmp_path, delay):
    time.sleep(delay)
    code, _, _, trace = _run(tmp_path, signal.SIGKILL)
    assert code == -signal.SIGKILL
    assert trace.facts["marker"] == 42
    assert [p.name for p in trace.phases] == ["work"] and trace.phases[0].end_us is None
