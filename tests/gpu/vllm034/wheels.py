"""What the stage scripts (``resolve.py``, ``stage.py``) ask pip for: wheels for the H200 image's CPython 3.12
on x86_64, manylinux up to 2.31, never for this machine's own interpreter, platform or constraints."""

from __future__ import annotations

import os
import sys

GLIBC_MAX = 31  # wheels up to manylinux_2_31 (the 0.25.1 set's llguidance was 2_31 and ran there)
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(GLIBC_MAX, 16, -1)] + [
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
]
#: pip's environment: this machine caps torch in a constraints file, which the H200's set must not see
PIP_ENV = dict(os.environ, PIP_CONSTRAINT="")


def pip_for_h200(verb: str, *args: str, platforms: list[str] = PLATFORMS, abis: tuple[str, ...] = ()) -> list[str]:
    """``python -m pip VERB -q --no-deps`` of binary wheels for the H200's interpreter, then ``args``
    (``download -d DIR SPEC...`` or ``install --target DIR WHEEL...``); run it with :data:`PIP_ENV`."""
    cmd = [sys.executable, "-m", "pip", verb, "-q", "--no-deps", "--only-binary=:all:"]
    cmd += ["--python-version", "3.12", "--implementation", "cp"]
    cmd += [flag for abi in abis for flag in ("--abi", abi)]
    cmd += [flag for p in platforms for flag in ("--platform", p)]
    return cmd + list(args)
