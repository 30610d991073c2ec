#!/usr/bin/env python3
"""Compute which wheels the lent H200 needs beside its image to run vLLM 0.34.0 (and 0.33.0).

    python3 tests/gpu/vllm034/resolve.py              # both sets -> wheels-vllm-0.34.0.tsv, wheels-vllm-0.33.0.tsv
    python3 tests/gpu/vllm034/resolve.py --set 0.34.0 --no-download

How: uv resolves `vllm==X` for CPython 3.12 / x86_64-manylinux_2_31 with the image's `pip freeze`
(h200-image-pip-freeze.txt) as preferences, so every package the image has is kept wherever its
version satisfies the requirements. The policy below (overrides, exclusions) is applied on top and
recorded in each list's header. A package is carried when the image lacks it or has another version.
Each carried wheel is downloaded (pip, exact version, --no-deps) into --cache to get its name,
size and sha256; its METADATA then says which requirement made an image version unusable.
Last, every Requires-Dist of every carried wheel is checked against (image + carried); anything
unmet that the policy does not explain stops the script.

Needs: uv (pip install uv) and network to PyPI. Python 3.12 for the target is assumed, not run.
"""

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version
from wheels import GLIBC_MAX, PIP_ENV, pip_for_h200  # this folder: the scripts run as scripts

HERE = Path(__file__).resolve().parent
FREEZE = HERE / "h200-image-pip-freeze.txt"
# The target interpreter, for evaluating markers (the H200 image's python).
TARGET_ENV = dict(
    default_environment(),
    python_version="3.12",
    python_full_version="3.12.3",
    implementation_name="cpython",
    platform_python_implementation="CPython",
    sys_platform="linux",
    platform_system="Linux",
    platform_machine="x86_64",
    os_name="posix",
)

# ---- policy -------------------------------------------------------------------------------
# Never carried (uv --excludes): the package and whatever only it needs drop out of the resolution.
EXCLUDE = {
    "torchaudio": "audio only; vLLM imports it lazily (ASR models); the image's 2.11.0 is left alone",
    "torchcodec": "audio/video decoding only, imported lazily (vllm.multimodal.media/video_decoders)",
    "pynvvideocodec": "video decoding only, imported lazily (vllm.multimodal.video_decoders.pynvvideocodec)",
    "tokenspeed-mla": "MLA-only kernels (DeepSeek-style attention); not used by Qwen3-MoE / Llama",
    "tilelang": "only vllm.tilelang_utils (mHC kernels) imports it at module level; the JIT monitor's "
    "try-import at the end of warm-up tolerates its absence; drops z3-solver (29 MB) too",
    "nvidia-cutlass-dsl-libs-cu12": "CUDA 12 flavour of the CuTe DSL (92 MB); with both flavours the DSL loads the "
    "newest the driver supports, cu13 on the H200 (driver 13.0), so cu12 is never loaded",
}
# Requirement replaced (uv --overrides). {name: (override requirement, why)}
OVERRIDE = {
    "0.34.0": {
        "flashinfer-python": (
            "flashinfer-python==0.7.4",
            "vLLM 0.34.0 pins 0.7.3, which is not on the index; 0.7.4 instead",
        ),
    },
    "0.33.0": {},
}
OVERRIDE_ALL = {
    # torch 2.14.0 pins these CUDA libraries; the image's builds define every symbol torch 2.14
    # imports (h200-image-probe.txt), so the image's versions stay (NCCL does not: it is carried).
    "cuda-toolkit": (
        "cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,nvrtc,nvtx]==13.0.2",
        "torch pins 13.0.3; the image's 13.0.2 libraries define all symbols torch needs",
    ),
    "nvidia-cudnn-cu13": (
        "nvidia-cudnn-cu13==9.19.0.56",
        "torch pins 9.24.0.43; image's 9.19 has every symbol; "
        "cuDNN is not used to serve text models (vllm-env.sh sets PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1)",
    ),
    "nvidia-cusparselt-cu13": ("nvidia-cusparselt-cu13==0.8.0", "torch pins 0.8.1; image's 0.8.0 has every symbol"),
    "numba": (
        "numba==0.68.0",
        "vLLM pins 0.65.0 (needs llvmlite 0.47 + numpy<2.5: ~76 MB of wheels); only the "
        "Kimi-K2.5 vision processor imports numba; the image's numba 0.68.0 stays",
    ),
    "humming-kernels": (
        None,
        "vLLM asks humming-kernels[cu13]: the extra pulls nvcc/cccl/nvvm (~100 MB) for "
        "humming's JIT, used only by quantized (AWQ/GPTQ/bitnet) GEMMs; the base package is kept",
    ),
}


def norm(name):
    return canonicalize_name(name)


def read_freeze(path):
    out = {}
    for line in open(path):
        line = line.split("#")[0].strip()
        m = re.match(r"([A-Za-z0-9_.\-]+)==([^\s;]+)", line)
        if m:
            out[norm(m.group(1))] = m.group(2)
    return out


def sha256(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def wheel_metadata(path):
    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        return Parser().parsestr(z.read(name).decode("utf-8", "replace"))


def requirements(meta, extras=()):
    """Requires-Dist of a wheel that apply on the target (extras: the ones asked for)."""
    out = []
    for r in meta.get_all("Requires-Dist") or []:
        req = Requirement(r)
        if req.marker is None:
            out.append(req)
            continue
        for extra in ("",) + tuple(extras):
            if req.marker.evaluate(dict(TARGET_ENV, extra=extra)):
                out.append(req)
                break
    return out


def uv():
    exe = shutil.which("uv")
    if exe:
        return exe
    try:
        import uv as uvmod  # pip install uv

        return uvmod.find_uv_bin()
    except ImportError:
        sys.exit("uv is needed: python3 -m pip install uv")


def pip_download(specs, dest):
    """pip download --no-deps the exact versions; returns {name: Path}."""
    dest.mkdir(parents=True, exist_ok=True)
    have = {}
    for p in dest.glob("*.whl"):
        n, v, _, _ = parse_wheel_filename(p.name)
        have[(norm(n), str(v))] = p
    todo = [f"{n}=={v}" for n, v in specs if (n, str(Version(v))) not in have]
    if todo:
        cmd = pip_for_h200("download", "-d", str(dest), *todo, abis=("cp312", "abi3", "none"))
        r = subprocess.run(cmd, env=PIP_ENV)
        if r.returncode:
            sys.exit(f"pip download failed for: {' '.join(todo)}")
        for p in dest.glob("*.whl"):
            n, v, _, _ = parse_wheel_filename(p.name)
            have[(norm(n), str(v))] = p
    out = {}
    for n, v in specs:
        p = have.get((n, str(Version(v))))
        if p is None:
            sys.exit(f"no wheel for {n}=={v} in {dest} after pip download")
        out[n] = p
    return out


def compile_set(version, prefs, work):
    """uv pip compile vllm==version with the policy; returns ({name: version}, {name: [via]})."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "req.txt").write_text(f"vllm=={version}\n")
    (work / "excludes.txt").write_text("".join(f"{n}\n" for n in EXCLUDE))
    over = []
    for name, (line, _why) in {**OVERRIDE_ALL, **OVERRIDE[version]}.items():
        if line is None:  # drop extras: take vLLM's own pin of it
            line = vllm_pin_without_extras(version, name)
        over.append(line)
    (work / "overrides.txt").write_text("".join(f"{x}\n" for x in over))
    out = work / "resolved.txt"
    out.write_text("".join(f"{n}=={v}\n" for n, v in sorted(prefs.items())))  # = preferences
    cmd = [
        uv(),
        "pip",
        "compile",
        str(work / "req.txt"),
        "--python-version",
        "3.12",
        "--python-platform",
        f"x86_64-manylinux_2_{GLIBC_MAX}",
        "--overrides",
        str(work / "overrides.txt"),
        "--excludes",
        str(work / "excludes.txt"),
        "--no-header",
        "--annotation-style",
        "line",
        "-q",
        "-o",
        str(out),
    ]
    py = sys.executable if sys.version_info[:2] == (3, 12) else shutil.which("python3.12")
    if py and subprocess.run([py, "-V"], capture_output=True).returncode == 0:
        cmd += ["--python", py]  # otherwise uv tries to download a 3.12 (it builds nothing here)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"uv pip compile failed for vllm=={version}:\n{r.stderr[-3000:]}")
    res, via = {}, {}
    for line in out.read_text().splitlines():
        m = re.match(r"([A-Za-z0-9_.\-]+)(\[[^\]]*\])?==([^\s;]+)\s*(?:#\s*via\s*(.*))?", line)
        if m:
            n = norm(m.group(1))
            res[n] = m.group(3)
            via[n] = [x.strip() for x in (m.group(4) or "").split(",") if x.strip()]
    return res, via


_VLLM_META = {}


def vllm_meta(version, cache):
    if version not in _VLLM_META:
        p = pip_download([("vllm", version)], cache)["vllm"]
        _VLLM_META[version] = wheel_metadata(p)
    return _VLLM_META[version]


def vllm_pin_without_extras(version, name):
    for req in requirements(vllm_meta(version, ARGS.cache)):
        if norm(req.name) == name:
            return f"{req.name}{req.specifier}"
    sys.exit(f"vllm {version} does not require {name}: fix OVERRIDE_ALL")


def resolve(version, image, base=None):
    """base: the 0.34 result, whose carried versions are preferred where the image's do not fit."""
    prefs = dict(image)
    if base:
        prefs.update({n: v for n, v in base["carried"].items()})
        # ...but the image's own version first where it would do for this set: try image-first, then merge
        res_img, _ = compile_set(version, dict(image), ARGS.work / f"{version}-image-prefs")
        for n, v in res_img.items():
            if image.get(n) == v:
                prefs[n] = v
    res, via = compile_set(version, prefs, ARGS.work / version)
    carried = {n: v for n, v in res.items() if image.get(n) != v}
    return {"resolved": res, "via": via, "carried": carried}


def why_lines(version, s, image, metas):
    """Reason per carried package, from the carried wheels' own requirements."""
    reasons = {}
    policy = {**OVERRIDE_ALL, **OVERRIDE[version]}
    for n in s["carried"]:
        if n in policy and policy[n][0] is not None:
            reasons[n] = policy[n][1]
            continue
        needers = []
        for m, meta in metas.items():
            extras = ("standard",) if m == "fastapi" else ()
            extras += tuple(x for m2 in [m] for x in (["image"] if m2 == "mistral-common" else []))
            for req in requirements(meta, extras):
                if norm(req.name) == n:
                    spec = str(req.specifier) or "any"
                    needers.append((m, spec))
        if n in image:
            bad = [
                (m, sp)
                for m, sp in needers
                if sp != "any" and not Requirement(f"x{sp}").specifier.contains(image[n], prereleases=True)
            ]
            src = bad or needers
            reasons[n] = f"image has {image[n]}; " + ", ".join(f"{m} needs {sp}" for m, sp in src[:4])
            if n in ("torch", "triton", "torchvision"):
                reasons[n] = f"image has {image[n]}; " + ", ".join(f"{m} needs {sp}" for m, sp in src[:2])
        else:
            src = needers or [(x, "") for x in s["via"].get(n, [])]
            reasons[n] = "new; " + ", ".join(f"{m} {sp}".strip() for m, sp in src[:4])
        if n in policy and policy[n][0] is None:
            reasons[n] += "; " + policy[n][1]
    reasons["vllm"] = f"vLLM {version}" + (
        "; installed beside flashinfer 0.7.4 (its 0.7.3 pin ignored: pip --no-deps)" if version == "0.34.0" else ""
    )
    reasons["nvidia-nccl-cu13"] = (
        "image has 2.28.9; torch 2.14.0 needs ==2.30.7 (11 symbols missing in 2.28.9, "
        "h200-image-probe.txt); lands in TREE/nvidia/nccl/lib = torch/lib/../../nvidia/nccl/lib (RPATH)"
    )
    return reasons


def check_env(version, s, image, metas):
    """Every requirement of every carried wheel against image + carried; returns unexplained failures."""
    env = dict(image)
    env.update(s["carried"])
    excluded = set(EXCLUDE)
    policy = {**OVERRIDE_ALL, **OVERRIDE[version]}
    bad, explained = [], []
    for m, meta in sorted(metas.items()):
        extras = {"fastapi": ("standard",), "mistral-common": ("image",)}.get(m, ())
        for req in requirements(meta, extras):
            n = norm(req.name)
            have = env.get(n)
            ok = have is not None and req.specifier.contains(have, prereleases=True)
            if ok:
                continue
            line = (
                f"{m} needs {req.name}{req.specifier or ''}{('[' + ','.join(req.extras) + ']') if req.extras else ''}: "
                f"{'absent' if have is None else have}"
            )
            if (
                n in excluded
                or n in policy
                or n.startswith("nvidia-cutlass-dsl-libs")
                or (n.startswith("nvidia-") and n in image)
            ):
                explained.append(line)
            else:
                bad.append(line)
    return bad, explained


def write_tsv(version, s, files, reasons, explained, image, base_files=None):
    path = HERE / f"wheels-vllm-{version}.tsv"
    total = sum(p.stat().st_size for p in files.values())
    rows = []
    for n in sorted(files, key=lambda n: files[n].name.lower()):
        p = files[n]
        tag = ""
        if base_files is not None:
            tag = "shared with 0.34.0; " if base_files.get(n) and base_files[n].name == p.name else "0.33 only; "
        rows.append(f"{p.name}\t{p.stat().st_size}\t{sha256(p)}\t{tag}{reasons[n]}")
    pol = {**OVERRIDE_ALL, **OVERRIDE[version]}
    head = [
        f"# vLLM {version} for the H200 image (CPython 3.12, x86_64, wheels up to manylinux_2_{GLIBC_MAX}); "
        f"made by resolve.py: uv resolution with the image's pip freeze as preferences.",
        f"# {len(rows)} wheels, {total:,} bytes; everything else comes from the image "
        f"({sum(1 for n, v in s['resolved'].items() if image.get(n) == v)} of the resolution's "
        f"{len(s['resolved'])} packages are the image's own versions).",
        "# left out (uv --excludes): " + "; ".join(f"{k}: {v}" for k, v in EXCLUDE.items()),
        "# overridden (uv --overrides): " + "; ".join(f"{k}: {v[1]}" for k, v in pol.items()),
        "# requirements of carried wheels left unmet on purpose: " + "; ".join(explained),
        "# kept from the image (its version satisfies the resolution): "
        + ", ".join(f"{n}=={v}" for n, v in sorted(s["resolved"].items()) if image.get(n) == v),
        "# wheel\tbytes\tsha256\twhy",
    ]
    path.write_text("\n".join(head + rows) + "\n")
    print(f"wrote {path.name}: {len(rows)} wheels, {total / 1e6:.1f} MB")


def main():
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", default="all", choices=["all", "0.34.0", "0.33.0"])
    ap.add_argument("--cache", type=Path, default=Path(os.path.expanduser("~/.cache/v034/wheels")))
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "vllm034-resolve")
    ap.add_argument("--no-download", action="store_true", help="print the resolution only")
    ARGS = ap.parse_args()
    image = read_freeze(FREEZE)
    sets = ["0.34.0", "0.33.0"] if ARGS.set == "all" else [ARGS.set]
    if "0.33.0" in sets and "0.34.0" not in sets:
        sets = ["0.34.0", "0.33.0"]  # 0.33 prefers what the 0.34 set already carries
    done = {}
    for version in sets:
        s = resolve(version, image, done.get("0.34.0", {}).get("s"))
        print(f"vllm {version}: {len(s['resolved'])} packages resolved, {len(s['carried'])} to carry")
        if ARGS.no_download:
            for n, v in sorted(s["carried"].items()):
                print(f"  {n}=={v}  (image: {image.get(n, '-')})")
            done[version] = {"s": s}
            continue
        files = pip_download(sorted(s["carried"].items()), ARGS.cache)
        metas = {n: wheel_metadata(p) for n, p in files.items()}
        bad, explained = check_env(version, s, image, metas)
        for line in bad:
            print(f"UNMET {line}")
        if bad:
            sys.exit(f"{len(bad)} requirement(s) unmet that the policy does not explain")
        reasons = why_lines(version, s, image, metas)
        base_files = done.get("0.34.0", {}).get("files") if version == "0.33.0" else None
        write_tsv(version, s, files, reasons, explained, image, base_files)
        done[version] = {"s": s, "files": files}


if __name__ == "__main__":
    main()
