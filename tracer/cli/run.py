"""Run a command (vllm serve ...) with memtrace's vLLM plugin on; print the summary when start-up ends.

    memtrace run [--dir DIR] [--until startup|exit|serving] -- vllm serve MODEL ...

vLLM is left as it was. The plugin is turned on by memtrace's own switch (``MEMTRACE=1``,
``MEMTRACE_DIR``, ``MEMTRACE_UNTIL``), not by ``VLLM_PLUGINS``: that variable is vLLM's allow-list
for *every* plugin group, so ``VLLM_PLUGINS=memtrace`` would turn off vLLM's own general plugins and
any platform plugin. Unset, vLLM loads every installed plugin, memtrace included. When the user set
``VLLM_PLUGINS`` without memtrace, memtrace is appended to it (and a line says so), else vLLM would
not load it.
The run directory is ``--dir``, else ``MEMTRACE_DIR`` as set, else ``memtrace-YYYYmmdd-HHMMSS/`` here.
vLLM's Ray executor copies only the variables it knows to its workers; the plugin adds memtrace's
switches to the list it copies (``plugins.ray_env``), and no vLLM variable is changed (vLLM hashes every
``VLLM_*`` variable into torch.compile's cache key). This host is named the run's driver
(``MEMTRACE_DRIVER_HOST``: workers elsewhere measure their clock against it).

The command runs in its own process group; SIGINT/SIGTERM/SIGHUP are forwarded to it. The report of
every traced worker is printed as soon as start-up completes (vLLM is then serving and keeps
running) or, if it never does, when the command dies (an OOM trace is complete by then). The exit
code is the command's. With --until exit the workers record until they exit; the summary at
start-up shows what was recorded so far. With --until serving start-up is written as by default, then
the workers keep a bounded serving window, written on a CUDA OOM, SIGUSR2, SIGTERM/SIGINT and at exit
(``docs/serving.md``). Trace files are read only through ``memtrace.store``.
Traces of Ray workers on other nodes arrive through Ray (``memtrace.capture.ray_gather``); a rank the
run's manifest lists but whose file is not in the run directory counts as not done, and if it never
arrives the summary says on which node it lies and how to fetch it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from memtrace import facts as F

NAME = "run"

POLL_S = 0.5
GRACE_S = 10.0  # after one worker completes start-up, how long to wait for the others


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from memtrace.cli._runs import add_force

    parser.add_argument(
        "--dir", metavar="DIR", help="run directory (default: $MEMTRACE_DIR, else memtrace-YYYYmmdd-HHMMSS/)"
    )
    parser.add_argument(
        "--until",
        choices=_until_choices(),
        default="startup",
        help="stop recording at the end of warm-up (default), when the workers exit, or keep a bounded "
        "serving window after start-up (serving: docs/serving.md). While serving, each allocation keeps its "
        "Python stack (the site that asked is named) unless MEMTRACE_SERVING_STACKS=none: the trade, measured "
        "on an H100 (vLLM 0.34, eager): Python stacks cost 7.15 %% of output throughput, none +0.22 %% (noise) "
        "but leaves allocations unnamed",
    )
    add_force(parser, "record into DIR even if it already holds traces")
    parser.add_argument(
        "--cupti",
        choices=("off", "records", "stacks"),
        default=None,
        help="also record every device allocation outside PyTorch's allocator through CUPTI (pip install "
        "memtrace-vllm[cupti]): 'records', or 'stacks' with the Python stack of each (CUPTI's callback API: "
        "a program whose threads read the allocator's statistics while another allocates can deadlock). "
        "CUPTI takes ~12 MiB of device memory, so vLLM's KV cache comes out that much smaller. Default: "
        "MEMTRACE_CUPTI / MEMTRACE_CUPTI_STACKS as set",
    )
    parser.add_argument("--width", type=int, default=100, help="text width of the summary (100)")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the command to trace")


def _until_choices() -> tuple[str, ...]:
    from memtrace.plugins import UNTIL_CHOICES  # the package alone: the plugin is not imported by the parser

    return UNTIL_CHOICES


def child_environment(
    environ: dict[str, str], run_dir: Path, until: str, command: list[str], cupti: str | None = None
) -> dict[str, str]:
    """The command's environment: memtrace's switch and run settings, the redacted argv, the CUPTI
    source's switches when ``cupti`` is given ("off", "records", "stacks"), and ``VLLM_PLUGINS``
    untouched unless it was set without memtrace."""
    from memtrace.capture.clock import export_driver_host
    from memtrace.capture.env import redact_argv
    from memtrace.plugins.vllm import vllm_plugins_with_memtrace

    env = dict(environ)
    plugins = vllm_plugins_with_memtrace(env.get("VLLM_PLUGINS"))
    if plugins is not None:
        env["VLLM_PLUGINS"] = plugins
    env["MEMTRACE"] = "1"
    env["MEMTRACE_DIR"] = str(run_dir)
    env["MEMTRACE_UNTIL"] = until
    env["MEMTRACE_CMDLINE"] = json.dumps(redact_argv(command))
    export_driver_host(env)
    if cupti is not None:
        from memtrace.capture.cupti import ENV, STACKS_ENV

        env[ENV] = "0" if cupti == "off" else "1"
        env[STACKS_ENV] = "1" if cupti == "stacks" else "0"
    return env


def check_cupti_available() -> None:
    """UsageError when ``--cupti`` was asked for and NVIDIA's ``cupti-python`` is not importable here."""
    import importlib.util

    from memtrace.errors import UsageError
    from memtrace.store import DISTRIBUTION

    if importlib.util.find_spec("cupti") is None:
        raise UsageError(f"--cupti needs NVIDIA's cupti-python in this environment: pip install {DISTRIBUTION}[cupti]")


def exit_code(returncode: int) -> int:
    """A child's return code as a shell reports it (killed by signal N -> 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


def startup_state(run_dir: Path) -> tuple[int, int]:
    """(traces, of which completed start-up), read through the store without disturbing the writers.
    Traces the run's manifest places on other nodes count as not completed until their file arrives."""
    from memtrace.errors import MemtraceError
    from memtrace.gather import elsewhere
    from memtrace.store import read_fact, trace_files

    try:
        files = trace_files(run_dir)
    except MemtraceError:
        return 0, 0  # not created yet
    done = sum(read_fact(f, F.VLLM_STARTUP_COMPLETE_US) is not None for f in files)
    return len(files) + len(elsewhere(run_dir)), done


def _say_elsewhere(run_dir: Path) -> None:
    """One line per trace that stayed on another node: which rank, where, and how to fetch it."""
    from memtrace.gather import elsewhere

    for placed in elsewhere(run_dir):
        who = f"rank {placed.rank}" if placed.rank is not None else f"pid {placed.pid}"
        why = f" ({placed.error})" if placed.error else " (not handed over yet)" if placed.status == "on-node" else ""
        print(
            f"memtrace: {who}'s trace is on node {placed.node_ip or placed.host} (host {placed.host}), not here"
            f"{why}: {placed.fetch_hint(run_dir)}",
            file=sys.stderr,
        )


def _forward_signals(child: subprocess.Popen) -> dict[int, object]:
    """Forward signals: SIGINT to the command's process group (as a terminal's Ctrl-C), others to it."""

    def forward(signum: int, _frame: object) -> None:
        try:
            if signum == signal.SIGINT:
                os.killpg(child.pid, signum)
            else:
                child.send_signal(signum)
        except (ProcessLookupError, PermissionError):
            pass

    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        previous[sig] = signal.signal(sig, forward)
    return previous


def _summary(run_dir: Path, width: int) -> None:
    """The report of every trace in the run, as ``memtrace report`` prints it."""
    from memtrace.analysis.analysed.run import analyse
    from memtrace.cli._runs import load, missing_ranks
    from memtrace.errors import MemtraceError
    from memtrace.plots.render import render

    try:
        run_ = analyse(load(run_dir).traces, path=str(run_dir), missing=missing_ranks(run_dir))
    except MemtraceError as exc:
        print(f"memtrace: no summary: {exc}", file=sys.stderr)
        _say_elsewhere(run_dir)
        return
    render(run_, sys.stdout, "text", width=width)
    sys.stdout.flush()
    _say_elsewhere(run_dir)
    for r in run_.ranks:
        if r.oom is not None:
            print(
                f"memtrace: pid {r.trace.process.pid} ran out of GPU memory in {r.oom.phase_path or 'no phase'}: that "
                "error and its traceback are vLLM's/PyTorch's, not memtrace's; memtrace recorded it (see the summary)",
                file=sys.stderr,
            )


def run(args: argparse.Namespace) -> int:
    from memtrace.errors import MemtraceError, UsageError

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("give the command to trace after --, e.g. memtrace run -- vllm serve MODEL")
    run_dir = Path(args.dir or os.environ.get("MEMTRACE_DIR") or time.strftime("memtrace-%Y%m%d-%H%M%S")).resolve()
    if startup_state(run_dir)[0] and not args.force:
        raise UsageError(f"{run_dir} already holds traces; choose another --dir or pass --force to add to it")
    if args.cupti in ("records", "stacks"):
        check_cupti_available()
    if args.until == "serving":  # a bad serving knob is the user's error, said before vLLM starts
        from memtrace.capture import serving

        serving.knobs()
        serving.serving_stacks("python")
    env = child_environment(dict(os.environ), run_dir, args.until, command, args.cupti)
    print(f"memtrace: tracing into {run_dir} (until {args.until})", file=sys.stderr)
    if env.get("VLLM_PLUGINS") != os.environ.get("VLLM_PLUGINS"):
        print(
            f"memtrace: VLLM_PLUGINS={os.environ['VLLM_PLUGINS']!r} is vLLM's allow-list of plugins; memtrace was "
            f"added to it for this run (VLLM_PLUGINS={env['VLLM_PLUGINS']!r})",
            file=sys.stderr,
        )
    try:
        group = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
        child = subprocess.Popen(command, env=env, **group)
    except FileNotFoundError:
        raise MemtraceError(f"cannot run {command[0]!r}: command not found", exit_code=127) from None
    except PermissionError:
        raise MemtraceError(f"cannot run {command[0]!r}: permission denied", exit_code=126) from None
    previous = _forward_signals(child)
    try:
        return _wait(child, run_dir, args.width)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _wait(child: subprocess.Popen, run_dir: Path, width: int) -> int:
    printed = False
    first_done_at: float | None = None
    while True:
        try:
            returncode = child.wait(timeout=POLL_S)
            break
        except subprocess.TimeoutExpired:
            pass
        if printed:
            continue
        files, done = startup_state(run_dir)
        if done and first_done_at is None:
            first_done_at = time.monotonic()
        if done and (done == files or time.monotonic() - first_done_at > GRACE_S):
            print(f"memtrace: start-up complete; traces in {run_dir}", file=sys.stderr)
            _summary(run_dir, width)
            printed = True
    if not printed:
        print(f"memtrace: the command exited ({exit_code(returncode)}) before start-up completed", file=sys.stderr)
        if startup_state(run_dir)[0]:
            _summary(run_dir, width)
        else:  # e.g. vLLM refusing in init_device: less free memory than --gpu-memory-utilization asks
            print(f"memtrace: no trace was written in {run_dir}: a vLLM worker is recorded from the end of its "
                  "init_device, and none got there (the command's own error says why)", file=sys.stderr)  # fmt: skip
    return exit_code(returncode)
