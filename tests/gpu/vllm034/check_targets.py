"""Check every hook target memtrace lists against a vLLM release's own source (its unpacked wheel).

    pip download --no-deps vllm==0.34.0 -d /tmp/w && unzip -q /tmp/w/vllm-0.34.0-*.whl 'vllm/*' -d /tmp/v034
    python3 tests/gpu/vllm034/check_targets.py 0.34.0=/tmp/v034 0.33.0=/tmp/v033 0.32.0=.venv/lib/python3.11/site-packages > tests/gpu/vllm034/vllm-targets-0.32-0.34.txt

For each release, every target of ``targets_for(version)`` (the phases of ``plugins.vllm_targets``, the
virtual-memory hooks of ``plugins.vllm_vmm`` from 0.34, vLLM's ``device_memory_info`` read in the sizing)
must be defined there (a class's own method or a module-level name); the targets listed only for other
versions are shown as absent or present, so a table entry that is too narrow shows up too. Exit 1 when a
target that applies is missing.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[2]))  # tests/ (vllm_source)

from memtrace.plugins import vllm as plugin  # noqa: E402
from memtrace.plugins.vllm_targets import TARGETS, parse_version, targets_for  # noqa: E402
from memtrace.plugins.vllm_vmm import TARGETS as VMM_TARGETS  # noqa: E402
from vllm_source import target_defined  # noqa: E402


def main(argv: list[str]) -> int:
    bad = 0
    for arg in argv:
        version_text, _, root = arg.partition("=")
        version = parse_version(version_text)
        applies = {t.path for t in targets_for(version)}
        if version is not None and version >= (0, 34):
            applies |= {p for p, _ in VMM_TARGETS} | {plugin.SIZING_READ_TARGET, plugin.TRANSIENT_PEAK_TARGET}
        every = sorted(
            {t.path for t in TARGETS}
            | {p for p, _ in VMM_TARGETS}
            | {plugin.SIZING_READ_TARGET, plugin.TRANSIENT_PEAK_TARGET}
        )
        print(f"# vLLM {version_text} ({root})")
        for path in every:
            found = target_defined(Path(root), path)
            if path in applies:
                status = "ok" if found else "MISSING"
                bad += not found
            else:
                status = "not listed for this version; " + ("present" if found else "absent")
            print(f"{status:45s} {path}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
