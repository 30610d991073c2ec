"""What the lent H200's image has that a carried torch 2.14 / vLLM 0.34 needs (run there, no network).

    python3 tests/gpu/vllm034/probe_image.py $OUT

Writes $OUT/probe.txt: Python, pip freeze, tools, free space, the CUDA libraries of the image's
nvidia-* packages, and every C symbol torch 2.14.0's shared libraries import (the list beside this
file, made with `nm -D --undefined-only` from the wheel) that none of the image's libraries defines:
a torch that imports a missing symbol does not load (Python loads extensions with RTLD_NOW).
"""

import ctypes
import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
lines: list[str] = []


def say(text: str = "") -> None:
    lines.append(text)


say(f"python {sys.version.split()[0]} at {sys.executable}")
for tool in ("xz", "zstd", "tar", "nm", "unzip", "gcc", "nvcc"):
    say(f"tool {tool}: {shutil.which(tool)}")
for path in ("/tmp", "/root", "/"):
    du = shutil.disk_usage(path)
    say(f"disk {path}: free {du.free / 2**30:.1f} GiB of {du.total / 2**30:.1f}")
say(f"cpus {os.cpu_count()}")
freeze = subprocess.run([sys.executable, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True).stdout
(out / "pip-freeze.txt").write_text(freeze)
site = next(p for p in sys.path if p.endswith("site-packages") and os.path.isdir(os.path.join(p, "nvidia")))
say(f"site-packages with nvidia/: {site}")
libs = sorted(glob.glob(os.path.join(site, "nvidia", "**", "lib*.so*"), recursive=True))
say("nvidia libraries:")
for lib in libs:
    say(f"  {os.path.relpath(lib, site)} {os.path.getsize(lib)}")
handles = []
for lib in libs:
    try:
        handles.append((lib, ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)))
    except OSError as exc:
        say(f"  cannot load {os.path.basename(lib)}: {str(exc)[:160]}")
for name in ("libcuda.so.1",):
    try:
        handles.append((name, ctypes.CDLL(name)))
    except OSError as exc:
        say(f"  cannot load {name}: {exc}")
needs = [line.strip() for line in open(Path(__file__).with_name("torch-2.14.0-needs.txt")) if line.strip()]
missing = []
for need in needs:
    sym, _, where = need.partition("@")
    if where.startswith(("GOMP", "OMP")):
        continue  # torch's own libgomp
    if not any(hasattr(h, sym) for _, h in handles):
        missing.append(need)
say(f"torch 2.14.0 needs {len(needs)} C symbols; not defined by the image's libraries: {len(missing)}")
for m in missing:
    say(f"  MISSING {m}")
(out / "probe.txt").write_text("\n".join(lines) + "\n")
print("\n".join(lines[:12]))
print(f"... {len(missing)} missing symbols; see probe.txt")
