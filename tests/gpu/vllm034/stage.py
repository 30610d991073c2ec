#!/usr/bin/env python3
"""Pack the vLLM 0.34.0 set (and the 0.33.0 difference) for the lent H200, in folders of <= 48 MB.

Run here, from the project checkout (downloads missing wheels with pip; about 45 min on 2 cores,
almost all of it xz):
    python3 tests/gpu/vllm034/stage.py                 # both sets -> .stage034/c01.., .stage033/c01..
    python3 tests/gpu/vllm034/stage.py --set 0.34.0    # only the 0.34 set
Needs `/.stage034/` and `/.stage033/` in .git/info/exclude (it refuses to write into a folder git
would carry otherwise).

What it does, per set:
1. checks every wheel of wheels-vllm-<set>.tsv (sha256; missing ones are downloaded with pip);
2. installs them with `pip install --no-deps --no-compile --target TREE` for CPython 3.12 manylinux;
3. prunes the few files listed in PRUNE (unreachable on an H200; see there), points the scripts in
   TREE/bin at the device's python, and hardlinks identical files (tar then stores them once);
4. 0.34: tars TREE (sorted, fixed owner and mtime), compresses it as one xz stream and splits it into
   parts of PART bytes, one part per folder c01..cNN. 0.33: the same, but only for the files that differ
   from the 0.34 tree; the others are listed in reuse-0.33.0.txt.xz and hardlinked on the device from
   /tmp/site034 (so 0.33 needs the 0.34 set installed on the same machine first);
5. writes manifest-<set>.txt (sha256 and folder of every part, sha256 of the whole stream, file count and
   bytes of the tree, the sys.path entries its .pth files add) and install-on-device.sh into c01.
"""

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from wheels import PIP_ENV, pip_for_h200  # this folder: the scripts run as scripts

HERE = Path(__file__).resolve().parent
CAP = 48_000_000  # bytes per folder: with the ~12 MB checkout a call stays under 64 MiB
PART = CAP  # bytes per part (c01: less, it also holds the manifest, the script and lists)
MTIME = "2026-01-01 00:00:00Z"
DEVICE_PY = "/opt/torch/.venv/bin/python3"
SETS = {
    "0.34.0": {"out": ".stage034", "site": "/tmp/site034", "base": None},
    "0.33.0": {"out": ".stage033", "site": "/tmp/site033", "base": "0.34.0"},
}
# Files left out of the tree although their wheel ships them. Each is unreachable with this image (sm_90,
# driver 13.0, cuda-bindings 13.3.1, torch 2.14) serving through the Python API server; [xz -9 size saved].
PRUNE = {
    "triton/backends/nvidia/bin/ptxas-blackwell": "Triton uses it only for arch >= 100 (backends/nvidia/compiler.py get_ptxas) [11 MB]",
    "triton/backends/nvidia/lib/cupti-blackwell": "Proton profiler's CUPTI for arch >= 100 only (triton/profiler/profile.py) [8 MB]",
    "triton/backends/nvidia/lib/cupti/*_static.a": "static archives: nothing links against them at run time (Proton dlopens libcupti.so) [4 MB]",
    "vllm/vllm-rs": "Rust front end, run only with VLLM_USE_RUST_FRONTEND=1 or VLLM_USE_RUST_BENCH=1 (vllm/envs.py) [16 MB]",
    "nccl/*/lib/cu12": "CUDA 12 builds of nccl-extensions' EP/M2N libraries: nccl/_extensions/_runtime.py loads lib/cu<major of "
    "cuda.bindings>, and the image's cuda-bindings is 13.3.1",
    "cuda/core/cu12": "CUDA 12 build of cuda.core: cuda/core/__init__.py imports .cu<major of cuda.bindings> = cu13",
    "nvidia_cutlass_dsl/cu13/lib/stubs/aarch64-*": "aarch64 / QNX stubs of the CuTe DSL runtime",
    "torch_c_dlpack_ext/libtorch_c_dlpack_addon_torch2[4-9]-*": "addons for torch 2.4-2.9: the loader takes libtorch_c_dlpack_addon_torch<major><minor>, none for 2.14",
}


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def sha256(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def read_tsv(version):
    rows = []
    for line in open(HERE / f"wheels-vllm-{version}.tsv"):
        if line.startswith("#") or not line.strip():
            continue
        name, size, sha, why = line.rstrip("\n").split("\t", 3)
        rows.append((name, int(size), sha))
    return rows


def ensure_wheels(rows, cache):
    cache.mkdir(parents=True, exist_ok=True)
    for name, size, sha in rows:
        p = cache / name
        if p.exists() and p.stat().st_size == size and sha256(p) == sha:
            continue
        dist, version = name.split("-")[:2]
        plat = name[: -len(".whl")].split("-")[-1]
        platforms = [] if plat == "any" else plat.split(".")
        cmd = pip_for_h200("download", "-d", str(cache), f"{dist}=={version}", platforms=platforms)
        subprocess.run(cmd, check=True, env=PIP_ENV)
        if not p.exists() or sha256(p) != sha:
            sys.exit(f"downloaded {dist}=={version} but {name} is missing or its sha256 differs from the list")


def install_tree(rows, cache, tree):
    if tree.exists():
        shutil.rmtree(tree)
    wheels = [str(cache / name) for name, _, _ in rows]
    cmd = pip_for_h200("install", "--no-compile", "--no-index", "--target", str(tree), *wheels)
    subprocess.run(cmd, check=True, env=PIP_ENV)


def postprocess(tree, prune=True):
    """Prune, fix script shebangs, drop caches, hardlink duplicates. Returns (pruned, linked bytes)."""
    pruned = []
    if prune:
        for pattern in PRUNE:
            for p in sorted(tree.glob(pattern)):
                size = sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else p.stat().st_size
                shutil.rmtree(p) if p.is_dir() else p.unlink()
                pruned.append((str(p.relative_to(tree)), size))
    for d in list(tree.rglob("__pycache__")):
        shutil.rmtree(d)
    for p in (tree / "bin").glob("*") if (tree / "bin").is_dir() else []:
        if p.is_file():
            b = p.read_bytes()
            if b.startswith(b"#!") and b"python" in b.split(b"\n", 1)[0]:
                p.write_bytes(b"#!" + DEVICE_PY.encode() + b"\n" + b.split(b"\n", 1)[1])
    # identical files -> hardlinks (the tar stores a link; every file stays read-only in use)
    by_size = {}
    for p in tree.rglob("*"):
        if p.is_file() and not p.is_symlink() and p.stat().st_size >= 1024:
            by_size.setdefault(p.stat().st_size, []).append(p)
    linked = 0
    for size, ps in by_size.items():
        if len(ps) < 2:
            continue
        first = {}
        for p in sorted(ps):
            h = sha256(p)
            if h in first:
                if p.stat().st_ino != first[h].stat().st_ino:
                    p.unlink()
                    os.link(first[h], p)
                    linked += size
            else:
                first[h] = p
    return pruned, linked


def pth_paths(tree):
    """The sys.path entries TREE's .pth files add (PYTHONPATH does not process .pth files), relative to TREE."""
    code = (
        "import sys, site; t = sys.argv[1]; sys.path.insert(0, t); before = list(sys.path); "
        "site.addsitedir(t); print('\\n'.join(p for p in sys.path if p not in before))"
    )
    r = subprocess.run([sys.executable, "-c", code, str(tree)], capture_output=True, text=True, check=True)
    out = []
    for p in r.stdout.split():
        rel = os.path.relpath(p, tree)
        if rel.startswith(".."):
            sys.exit(f"a .pth file in {tree} adds {p}, outside the tree")
        out.append(rel)
    return out


def file_table(tree):
    """{relpath: (size, sha256, mode, inode)} of every regular file."""
    out = {}
    for p in sorted(tree.rglob("*")):
        if p.is_file() and not p.is_symlink():
            st = p.stat()
            out[str(p.relative_to(tree))] = (st.st_size, sha256(p), st.st_mode & 0o777, st.st_ino)
        elif p.is_symlink():
            sys.exit(f"symlink in the tree: {p}")
    return out


def tree_totals(table):
    """(files, bytes) as `find -type f` counts them on the device (hardlinks count once per path)."""
    return len(table), sum(v[0] for v in table.values())


def pack(tree, names, stem, out_dir, xz_opts, extra_c01):
    """tar (names, relative to tree) | xz | split -> out_dir/cNN/stem.partNN. Returns manifest lines."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    with tempfile.NamedTemporaryFile("wb", delete=False, suffix=".list") as lf:
        lf.write(b"\0".join(n.encode() for n in names) + b"\0")
    tar = subprocess.Popen(
        [
            "tar",
            "--format=gnu",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            f"--mtime={MTIME}",
            "-cf",
            "-",
            "-C",
            str(tree),
            "--no-recursion",
            "--null",
            "-T",
            lf.name,
        ],
        stdout=subprocess.PIPE,
    )
    xz = subprocess.Popen(["xz", "-c", *xz_opts.split()], stdin=tar.stdout, stdout=subprocess.PIPE)
    tar.stdout.close()
    whole = hashlib.sha256()
    parts, total, i = [], 0, 0
    first = CAP - 64_000 - sum(Path(src).stat().st_size for src, _ in extra_c01)  # c01 also holds these + manifest
    t0 = time.time()
    buf = bytearray()
    while True:
        chunk = xz.stdout.read(1 << 20)
        if chunk:
            buf += chunk
        while len(buf) >= (first if i == 0 else PART) or (not chunk and buf):
            size = first if i == 0 else PART
            i += 1
            piece = bytes(buf[:size])
            del buf[:size]
            d = out_dir / f"c{i:02d}"
            d.mkdir()
            name = f"{stem}.part{i:02d}"
            (d / name).write_bytes(piece)
            whole.update(piece)
            total += len(piece)
            parts.append((name, f"c{i:02d}", len(piece), hashlib.sha256(piece).hexdigest()))
            log(f"  {name}: {total / 1e6:.0f} MB so far, {time.time() - t0:.0f} s")
        if not chunk:
            break
    if xz.wait() or tar.wait():
        sys.exit("tar | xz failed")
    os.unlink(lf.name)
    for src, name in extra_c01:
        shutil.copy(src, out_dir / "c01" / name)
    lines = [f"stream {stem} {total} {whole.hexdigest()}"]
    lines += [f"part {n} {f} {s} {h}" for n, f, s, h in parts]
    return lines, total, time.time() - t0


def check_exclude(out):
    r = subprocess.run(["git", "check-ignore", "-q", out + "/x"], capture_output=True)
    if r.returncode != 0:
        sys.exit(
            f"{out}/ is not ignored by git: add '/{out}/' to .git/info/exclude first "
            "(a folder git carries would travel with every device call)"
        )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", default="all", choices=["all", "0.34.0", "0.33.0"])
    ap.add_argument("--cache", type=Path, default=Path(os.path.expanduser("~/.cache/v034/wheels")))
    ap.add_argument("--work", type=Path, default=Path(os.path.expanduser("~/.cache/v034/stage-work")))
    ap.add_argument(
        "--xz",
        default="-6 -T2",
        help="xz options (default: -6 -T2: 8 MiB dictionary, "
        "blocks of 24 MiB, so the device decompresses with several threads)",
    )
    ap.add_argument("--no-prune", action="store_true", help="keep the files listed in PRUNE")
    ap.add_argument(
        "--script-only",
        action="store_true",
        help="only copy install-on-device.sh into the c01 folders again (after editing it; the parts stay as they are)",
    )
    ap.add_argument(
        "--out-root",
        type=Path,
        default=Path("."),
        help="where .stage034/ and .stage033/ go (default: here, the checkout; elsewhere for a trial run)",
    )
    a = ap.parse_args()
    sets = ["0.34.0", "0.33.0"] if a.set == "all" else [a.set]
    if a.script_only:
        for version in sets:
            c01 = a.out_root / SETS[version]["out"] / "c01"
            shutil.copy(HERE / "install-on-device.sh", c01 / "install-on-device.sh")
            size = sum(f.stat().st_size for f in c01.iterdir())
            print(f"{c01}: install-on-device.sh copied; folder {size:,} B" + (" OVER THE CAP" if size > CAP else ""))
        return
    if a.out_root == Path("."):
        for version in sets:
            check_exclude(SETS[version]["out"])
    a.work.mkdir(parents=True, exist_ok=True)
    built = {}
    for version in sets:  # first every tree (so cpu_check.py can start on them), then the packing
        rows = read_tsv(version)
        wheel_bytes = sum(s for _, s, _ in rows)
        log(f"vLLM {version}: {len(rows)} wheels, {wheel_bytes / 1e6:.1f} MB; checking the cache")
        ensure_wheels(rows, a.cache)
        tree = a.work / f"tree-{version}"
        log(f"installing into {tree}")
        install_tree(rows, a.cache, tree)
        pruned, linked = postprocess(tree, prune=not a.no_prune)
        pypaths = pth_paths(tree)
        table = file_table(tree)
        nfiles, nbytes = tree_totals(table)
        log(
            f"tree: {nfiles} files, {nbytes / 1e6:.1f} MB; pruned {sum(s for _, s in pruned) / 1e6:.1f} MB; "
            f"{linked / 1e6:.1f} MB hardlinked; .pth paths {pypaths}"
        )
        (a.work / f"files-{version}.tsv").write_text(
            "".join(f"{k}\t{v[0]}\t{v[1]}\t{v[2]:o}\n" for k, v in table.items())
        )
        built[version] = (rows, wheel_bytes, tree, pruned, pypaths, table, nfiles, nbytes)
    for version in sets:
        cfg = SETS[version]
        rows, wheel_bytes, tree, pruned, pypaths, table, nfiles, nbytes = built[version]
        stem = f"vllm-{version}.tar.xz" if cfg["base"] is None else f"vllm-{version}-over-{cfg['base']}.tar.xz"
        extra = [(HERE / "install-on-device.sh", "install-on-device.sh")]
        head = [
            f"set {version}",
            f"site {cfg['site']}",
            f"device_python {DEVICE_PY}",
            f"wheels {len(rows)} {wheel_bytes}",
        ]
        head += [f"pypath {p}" for p in pypaths]
        head += [f"dist {n.split('-')[0]} {n.split('-')[1]}" for n, _, _ in rows]
        head += [f"pruned {rel} {size}" for rel, size in pruned]
        if cfg["base"] is None:
            names = sorted(set(str(p.relative_to(tree)) for p in tree.rglob("*")))
            head.append(f"files {nfiles} {nbytes}")
        else:
            base = cfg["base"]
            base_tree = a.work / f"tree-{base}"
            base_table = {}
            for line in open(a.work / f"files-{base}.tsv"):
                k, size, h, mode = line.rstrip("\n").split("\t")
                base_table[k] = (int(size), h, int(mode, 8))
            if not base_tree.is_dir():
                sys.exit(f"the {base} tree is not in {a.work}: run with --set all")
            reuse = sorted(k for k, v in table.items() if base_table.get(k) == (v[0], v[1], v[2]))
            rset = set(reuse)
            new_files = [k for k in table if k not in rset]
            # directories that hold new files (tar makes missing parents itself, but keep modes exact)
            dirs = set()
            for k in new_files:
                parent = os.path.dirname(k)
                while parent and parent not in dirs:
                    dirs.add(parent)
                    parent = os.path.dirname(parent)
            names = sorted(dirs | set(new_files))
            reuse_bytes = sum(table[k][0] for k in reuse)
            rlist = a.work / f"reuse-{version}.txt"
            rlist.write_text("".join(f"{k}\n" for k in reuse))
            subprocess.run(["xz", "-9", "-f", "-k", str(rlist)], check=True)
            extra.append((Path(str(rlist) + ".xz"), f"reuse-{version}.txt.xz"))
            head.append(f"files {nfiles} {nbytes}")
            head.append(f"base {base} {SETS[base]['site']}")
            head.append(f"reuse reuse-{version}.txt.xz {len(reuse)} {reuse_bytes} {sha256(str(rlist) + '.xz')}")
            log(
                f"{len(reuse)} files ({reuse_bytes / 1e6:.1f} MB) are the same in the {base} tree; "
                f"packing the other {len(new_files)} ({(nbytes - reuse_bytes) / 1e6:.1f} MB)"
            )
        out_dir = a.out_root / cfg["out"]
        log(f"tar | xz {a.xz} -> {out_dir}/")
        lines, total, secs = pack(tree, names, stem, out_dir, a.xz, extra)
        manifest = head + [f"xz {a.xz}"] + lines
        (out_dir / "c01" / f"manifest-{version}.txt").write_text("\n".join(manifest) + "\n")
        folders = sorted(out_dir.iterdir())
        sizes = [sum(f.stat().st_size for f in d.iterdir()) for d in folders]
        if max(sizes) > CAP:
            sys.exit(f"a folder is {max(sizes)} bytes, over {CAP}")
        packed = nbytes if cfg["base"] is None else nbytes - reuse_bytes
        log(
            f"vLLM {version}: {len(folders)} folders in {out_dir}/, {total / 1e6:.1f} MB of xz "
            f"({secs / 60:.1f} min); wheels {wheel_bytes / 1e6:.1f} MB -> xz/wheels {total / wheel_bytes:.3f}; "
            f"packed tree {packed / 1e6:.1f} MB -> xz/tree {total / packed:.3f}; largest folder {max(sizes):,} B"
        )


if __name__ == "__main__":
    main()
