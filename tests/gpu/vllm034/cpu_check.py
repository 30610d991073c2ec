#!/usr/bin/env python3
"""Check here, on a CPU machine, that a staged tree will import on the H200 before device time is spent.

    python3 tests/gpu/vllm034/cpu_check.py --setup      # once: a Python 3.12 venv replicating the H200 image
    python3 tests/gpu/vllm034/cpu_check.py              # both sets; writes cpu-check-<set>.txt beside this file

The replica: a Python 3.12 venv holding every package of h200-image-pip-freeze.txt at the image's version
(pip --no-deps; torch 2.11, the CUDA 13 libraries, NCCL 2.28.9, ...), the stand-in for /opt/torch/.venv.
The staged tree (stage.py's work folder, after pruning, i.e. exactly what is packed) goes first on
PYTHONPATH, as vllm-env.sh puts it on the device. Checks:
  1. NCCL: the carried libnccl.so.2 defines the 11 symbols torch 2.14 needs that the image's 2.28.9 lacks
     (nm -D), and torch's RUNPATH reaches it.
  2. native libraries: every ELF file of the tree, its NEEDED entries resolved (tree, RUNPATH, the image's
     CUDA libraries, the system); then each is dlopen'ed (RTLD_NOW: every symbol bound) after `import torch`
     in the replica, with stub libcuda.so.1 / libnvidia-ml.so.1 made here (no driver on this machine).
  3. imports, each in a fresh interpreter, twice: as this machine is (vLLM picks its CPU/unspecified
     platform) and as a simulated H200 (a fake pynvml reporting one sm_90 GPU, so vLLM takes its CUDA
     platform and CUDA-only import branches; torch.cuda stays unavailable).
  4. `python -X importtime -c "import vllm.entrypoints.openai.api_server"` (simulated H200): every
     top-level package imported, where it came from (tree / image / stdlib), and whether that
     distribution's requirements hold in image + tree.
  5. a few run-time paths that import more: vLLM's JIT monitor activation (imports cutlass.cute and tries
     tilelang), the engine config for the Qwen3-MoE test model (EngineArgs.create_engine_config).
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
FREEZE = HERE / "h200-image-pip-freeze.txt"
PROBE = HERE / "h200-image-probe.txt"
MODEL_CONFIG = ROOT / "tests/data/vllm-h200/model-config.json"
SYSTEM_LIBS = {  # glibc, the C++ runtime and the driver: on the device outside any venv
    "libc.so.6",
    "libm.so.6",
    "libdl.so.2",
    "libpthread.so.0",
    "librt.so.1",
    "ld-linux-x86-64.so.2",
    "libstdc++.so.6",
    "libgcc_s.so.1",
    "libutil.so.1",
    "libcuda.so.1",
    "libnvidia-ml.so.1",
    "libz.so.1",
}
IMPORTS = [
    "torch",
    "triton",
    "flashinfer",
    "vllm",
    "vllm.entrypoints.openai.api_server",
    "vllm.v1.worker.gpu_worker",
    "vllm.v1.worker.gpu.model_runner",
    "vllm.v1.worker.extensible_kv_cache",
    "vllm.utils.vmm_driver",
    "vllm.model_executor.models.qwen3_moe",
    "vllm.model_executor.models.llama",
    "vllm.model_executor.layers.fused_moe",
    "vllm.v1.engine.core",
    "vllm.v1.core.kv_cache_planning",
    "vllm.v1.attention.backends.flash_attn",
    "vllm.v1.attention.backends.flashinfer",
    "vllm.v1.sample.ops.topk_topp_sampler",
    "vllm.compilation.backends",
    "vllm.vllm_flash_attn",
    "vllm._custom_ops",
    "vllm.model_executor.layers.fused_moe.fused_moe",
    "vllm.entrypoints.cli.main",
    "transformers",
    "cutlass.cute",
    "quack",
    "xgrammar",
    "llguidance",
    "outlines_core",
    "mistral_common",
]
NOT_IN_033 = {"vllm.v1.worker.extensible_kv_cache", "vllm.utils.vmm_driver"}
LEFT_OUT = [
    "tilelang",
    "z3",
    "numba",
    "llvmlite",
    "torchaudio",
    "torchcodec",
    "PyNvVideoCodec",
    "tokenspeed_mla",
    "tokenspeed_triton",
]

# A stand-in for NVML: one H200 (sm_90, 141 GiB), driver 580.159.04 / CUDA 13.0; plus the answers torch and Triton
# give about such a GPU before any CUDA context exists.
FAKE_NVML = textwrap.dedent("""
    import importlib.abc, importlib.util, sys, types
    class NVMLError(Exception):
        pass
    class _Mem:
        total, free, used = 150_754_820_096, 150_000_000_000, 754_820_096
    class _Pci:
        busId = b"00000000:18:00.0"; bus = 0x18; device = 0; domain = 0
    def _fill(m):
        m.NVMLError = NVMLError
        m.NVMLError_NotSupported = type("NVMLError_NotSupported", (NVMLError,), {})
        m.NVML_P2P_STATUS_OK = 0
        m.NVML_P2P_CAPS_INDEX_NVLINK = 3
        m.NVML_P2P_CAPS_INDEX_READ = 0
        m.nvmlInit = lambda *a: None
        m.nvmlShutdown = lambda *a: None
        m.nvmlDeviceGetCount = lambda: 1
        m.nvmlDeviceGetHandleByIndex = lambda i: i
        m.nvmlDeviceGetHandleByUUID = lambda u: 0
        m.nvmlDeviceGetIndex = lambda h: 0
        m.nvmlDeviceGetCudaComputeCapability = lambda h: (9, 0)
        m.nvmlDeviceGetName = lambda h: "NVIDIA H200"
        m.nvmlDeviceGetMemoryInfo = lambda h: _Mem()
        m.nvmlDeviceGetUUID = lambda h: "GPU-00000000-0000-0000-0000-000000000000"
        m.nvmlDeviceGetPciInfo = lambda h: _Pci()
        m.nvmlDeviceGetP2PStatus = lambda a, b, c: 0
        m.nvmlDeviceGetNumaNodeId = lambda h: 0
        m.nvmlDeviceGetCpuAffinity = lambda h, n: [0xFFFF]
        m.nvmlSystemGetConfComputeState = lambda: types.SimpleNamespace(ccFeature=0, devToolsMode=0, environment=0)
        m.nvmlSystemGetDriverVersion = lambda: "580.159.04"
        m.nvmlSystemGetCudaDriverVersion = lambda: 13000
        m.nvmlSystemGetCudaDriverVersion_v2 = lambda: 13000
    class _FakeNvml(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        names = ("pynvml", "vllm.third_party.pynvml")  # vLLM imports its vendored copy (vllm.utils.import_utils)
        def find_spec(self, name, path=None, target=None):
            return importlib.util.spec_from_loader(name, self) if name in self.names else None
        def create_module(self, spec):
            return None
        def exec_module(self, module):
            _fill(module)
    sys.meta_path.insert(0, _FakeNvml())
    # What a GPU would answer without a CUDA context: Triton's CUDA driver is active (else vLLM swaps Triton
    # for a placeholder), torch sees one sm_90 device. Anything that needs a context still fails.
    import torch
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda.get_device_capability = lambda device=None: (9, 0)
    torch.cuda.get_device_name = lambda device=None: "NVIDIA H200"
    import triton.backends.nvidia.driver as _tdrv
    _tdrv.CudaDriver.is_active = staticmethod(lambda: True)
""")


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def venv_python(venv):
    return str(venv / "bin" / "python")


def setup(venv, stubs):
    py312 = shutil.which("python3.12")
    for cand in [py312, os.path.expanduser("~/.pyenv/versions/3.12.1/bin/python3.12")]:
        if cand and subprocess.run([cand, "-V"], capture_output=True).returncode == 0:
            py312 = cand
            break
    else:
        sys.exit("no Python 3.12 here (pyenv install 3.12)")
    if not (venv / "bin" / "python").exists():
        subprocess.run([py312, "-m", "venv", str(venv)], check=True)
    reqs = [ln.strip() for ln in open(FREEZE) if ln.strip() and not ln.startswith(("pip==", "#"))]
    log(f"installing the image's {len(reqs)} packages into {venv} (pip --no-deps; several GB)")
    subprocess.run(
        [venv_python(venv), "-m", "pip", "install", "-q", "--no-deps", "--only-binary=:all:", *reqs],
        check=True,
        env=dict(os.environ, PIP_CONSTRAINT=""),
    )


def elf_files(tree):
    out = []
    for p in sorted(tree.rglob("*")):
        if p.is_file() and not p.is_symlink() and p.stat().st_size > 64:
            with open(p, "rb") as f:
                if f.read(4) == b"\x7fELF":
                    out.append(p)
    return out


def readelf_dynamic(p):
    r = subprocess.run(["readelf", "-d", str(p)], capture_output=True, text=True)
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", r.stdout)
    runpath = re.findall(r"\((?:RUNPATH|RPATH)\)\s+Library (?:runpath|rpath): \[(.+?)\]", r.stdout)
    soname = re.findall(r"\(SONAME\)\s+Library soname: \[(.+?)\]", r.stdout)
    return needed, (runpath[0].split(":") if runpath else []), (soname[0] if soname else None)


def image_cuda_libs():
    libs = set()
    for line in open(PROBE):
        m = re.match(r"\s+nvidia/\S+/(lib[^/\s]+) \d+", line)
        if m:
            libs.add(m.group(1))
    return libs


def make_stubs(tree, stubs):
    """libcuda.so.1 and libnvidia-ml.so.1 exporting every cu*/nvml* symbol the tree's libraries import."""
    stubs.mkdir(parents=True, exist_ok=True)
    want = {"libcuda.so.1": set(), "libnvidia-ml.so.1": set()}
    for p in elf_files(tree):
        needed, _, _ = readelf_dynamic(p)
        r = subprocess.run(["nm", "-D", "--undefined-only", str(p)], capture_output=True, text=True)
        syms = {ln.split()[-1].split("@")[0] for ln in r.stdout.splitlines() if ln.strip()}
        if "libcuda.so.1" in needed:
            want["libcuda.so.1"] |= {s for s in syms if re.match(r"cu[A-Z]", s)}
        if "libnvidia-ml.so.1" in needed:
            want["libnvidia-ml.so.1"] |= {s for s in syms if s.startswith("nvml")}
    want["libcuda.so.1"] |= {
        "cuInit",
        "cuDriverGetVersion",
        "cuGetProcAddress",
        "cuGetProcAddress_v2",
        "cuDeviceGetCount",
        "cuGetErrorString",
        "cuGetErrorName",
    }
    for lib, syms in want.items():
        src = stubs / (lib + ".c")
        # 34 = CUDA_ERROR_STUB_LIBRARY; NVML: 999 = NVML_ERROR_UNKNOWN
        code = 34 if "cuda" in lib else 999
        src.write_text("".join(f"int {s}(void) {{ return {code}; }}\n" for s in sorted(syms)))
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(stubs / lib), f"-Wl,-soname,{lib}", str(src)], check=True)
    return {k: len(v) for k, v in want.items()}


def env_for(tree, venv, stubs, pypaths):
    env = dict(os.environ)
    for k in ("PYTHONPATH", "PYTHONHOME", "PIP_CONSTRAINT", "VIRTUAL_ENV"):
        env.pop(k, None)
    env["PYTHONPATH"] = ":".join([str(tree)] + [str(tree / p) for p in pypaths])
    env["LD_LIBRARY_PATH"] = str(stubs)
    env["PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK"] = "1"
    env["PATH"] = f"{tree}/bin:{venv}/bin:{env['PATH']}"
    env["HF_HUB_OFFLINE"] = "1"
    env["VLLM_CACHE_ROOT"] = str(stubs.parent / "vcache")
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # keep the tree as packed
    return env


def run_py(venv, env, code, timeout=600, args=(), pre=""):
    t = time.time()
    r = subprocess.run(
        [venv_python(venv), *args, "-c", pre + code], env=env, capture_output=True, text=True, timeout=timeout
    )
    return r, time.time() - t


def check_nccl(tree, venv, rep):
    need = [ln.split()[1] for ln in open(PROBE) if ln.strip().startswith("MISSING nccl")]
    lib = tree / "nvidia/nccl/lib/libnccl.so.2"
    r = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True)
    have = {ln.split()[-1].split("@")[0] for ln in r.stdout.splitlines() if ln.strip()}
    img = next(venv.glob("lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2"))
    r2 = subprocess.run(["nm", "-D", "--defined-only", str(img)], capture_output=True, text=True)
    have_img = {ln.split()[-1].split("@")[0] for ln in r2.stdout.splitlines() if ln.strip()}
    miss = [s for s in need if s not in have]
    rep(
        f"NCCL: the carried {lib.relative_to(tree)} defines {len(need) - len(miss)}/{len(need)} of the symbols "
        f"the image's 2.28.9 lacks ({', '.join(need)}); the replica's 2.28.9 defines "
        f"{sum(s in have_img for s in need)} of them" + (f"; MISSING {miss}" if miss else "")
    )
    _, runpath, _ = readelf_dynamic(tree / "torch/lib/libtorch_cuda.so")
    hits = [
        rp
        for rp in runpath
        if (tree / "torch/lib" / rp.replace("$ORIGIN/", "") / "libnccl.so.2").resolve() == lib.resolve()
    ]
    rep(
        f"NCCL: libtorch_cuda.so RUNPATH {':'.join(runpath)}; entry {hits[0] if hits else 'NONE'} reaches the carried "
        "libnccl.so.2"
        if hits
        else "FAIL: no RUNPATH entry of libtorch_cuda.so reaches the carried NCCL"
    )
    return not miss and bool(hits)


def check_native(tree, venv, stubs, pypaths, rep):
    elfs = elf_files(tree)
    sonames, dirs_of = {}, {}
    for p in elfs:
        sonames.setdefault(p.name, p)
    cuda = image_cuda_libs()
    unknown = {}
    for p in elfs:
        needed, runpath, soname = readelf_dynamic(p)
        if soname:
            sonames.setdefault(soname, p)
        dirs_of[p] = (needed, runpath)
    for p, (needed, runpath) in dirs_of.items():
        for n in needed:
            hit = any((Path(rp.replace("$ORIGIN", str(p.parent))) / n).exists() for rp in runpath)
            if hit or n in sonames or n in cuda or n in SYSTEM_LIBS or n.startswith("libpython"):
                continue
            unknown.setdefault(n, []).append(str(p.relative_to(tree)))
    rep(
        f"native: {len(elfs)} ELF files in the tree; NEEDED entries not found in the tree, its RUNPATHs, the "
        f"image's CUDA libraries or glibc/libstdc++/driver: {len(unknown)}"
    )
    for n, users in sorted(unknown.items()):
        rep(f"  NEEDED {n} by {', '.join(users[:3])}{' ...' if len(users) > 3 else ''}")
    # dlopen every library after `import torch`, one interpreter per top-level folder
    groups = {}
    for p in elfs:
        rel = p.relative_to(tree)
        if rel.parts[0] == "bin" or ".so" not in p.name:
            continue
        groups.setdefault(rel.parts[0], []).append(str(p))
    fails = []
    code = textwrap.dedent("""
        import ctypes, json, sys, torch
        out = []
        for p in json.loads(sys.argv[1]):
            try:
                ctypes.CDLL(p, mode=ctypes.RTLD_LOCAL)
            except OSError as e:
                out.append((p, str(e)[:300]))
        print(json.dumps(out))
    """)
    env = env_for(tree, venv, stubs, pypaths)
    n = 0
    for top, ps in sorted(groups.items()):
        r = subprocess.run(
            [venv_python(venv), "-c", code, json.dumps(ps)], env=env, capture_output=True, text=True, timeout=900
        )
        n += len(ps)
        if r.returncode:
            fails.append((top, f"interpreter died: {r.stderr.strip()[-300:]}"))
            continue
        fails += json.loads(r.stdout.strip().splitlines()[-1])
    expected = [  # (path regex, why a lone dlopen of it fails although its package works)
        (r"nvidia_cutlass_dsl/.*/stubs/aarch64", "aarch64 / QNX stub, never loaded on x86_64"),
        (
            r"torch_c_dlpack_ext/libtorch_c_dlpack_addon_torch2[4-9]-",
            "addon for torch 2.4-2.9; the loader picks the "
            "one matching the running torch (2.14: none needed, torch has the DLPack exchange API)",
        ),
        (
            r"cuda/core/cu1[23]/_tensor_bridge",
            "needs libtorch's AOTI C shim, which cuda.core binds only when a torch "
            "tensor is bridged (same in the image's cuda-core 1.2.0)",
        ),
        (
            r"xgrammar/libxgrammar_bindings.so",
            "finds libtvm_ffi.so because `import tvm_ffi` loads it first (xgrammar's own import passes)",
        ),
    ]
    unexpected = []
    rep(f"native: dlopen(RTLD_NOW) of {n} shared libraries after `import torch` in the replica: {len(fails)} failed")
    for p, e in fails:
        rel = os.path.relpath(p, tree) if p.startswith("/") else p
        why = next((w for rx, w in expected if re.search(rx, rel)), None)
        if why is None:
            unexpected.append(rel)
        rep(
            f"  {'expected' if why else 'DLOPEN FAILED'} {rel}: {e.split(': ', 1)[-1][:160]}"
            + (f" ({why})" if why else "")
        )
    rep(f"native: {len(unexpected)} unexpected dlopen failures")
    return unknown, fails


def check_imports(tree, venv, stubs, pypaths, version, rep, simulated, jobs=3):
    from concurrent.futures import ThreadPoolExecutor

    env = env_for(tree, venv, stubs, pypaths)
    pre = FAKE_NVML if simulated else ""
    mods = [m for m in IMPORTS if not (version == "0.33.0" and m in NOT_IN_033)]

    def one(m):
        code = (
            f"import importlib, sys; mod = importlib.import_module({m!r}); "
            f"print(str(getattr(mod, '__version__', '')) + '|' + str(getattr(mod, '__file__', '')))"
        )
        return run_py(venv, env, code, pre=pre)

    with ThreadPoolExecutor(jobs) as ex:
        results = list(ex.map(one, mods))
    fails = []
    for m, (r, secs) in zip(mods, results, strict=True):
        if r.returncode:
            last = [ln for ln in r.stderr.strip().splitlines() if ln.strip()][-1:] or ["?"]
            fails.append(m)
            rep(f"  FAIL {m} ({secs:.1f}s): {last[0][:300]}")
        else:
            out = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
            ver, _, f = out.partition("|")
            where = "tree" if f.startswith(str(tree)) else ("image" if str(venv) in f else f)
            rep(f"  ok   {m} ({secs:.1f}s, {jobs} in parallel) {ver} [{where}]")
    return fails


IMPORTTIME_SCRIPT = textwrap.dedent("""
    import importlib.metadata as md, json, os, sys, sysconfig
    import vllm.entrypoints.openai.api_server  # noqa
    stdlib = sysconfig.get_paths()["stdlib"]
    tops = {}
    for name, mod in list(sys.modules.items()):
        top = name.split(".")[0]
        f = getattr(mod, "__file__", None) or (list(getattr(mod, "__path__", []) or [None])[0])
        if top in tops and tops[top]:
            continue
        tops[top] = f
    pd = md.packages_distributions()
    out = {}
    for top, f in tops.items():
        if f is None or f.startswith(stdlib) and "site-packages" not in f:
            where = "builtin/stdlib"
        elif f.startswith(os.environ["TREE"]):
            where = "tree"
        else:
            where = "image"
        dists = pd.get(top, [])
        out[top] = [where, f, [(d, md.version(d)) for d in dists]]
    print("JSON" + json.dumps(out))
""")


def check_importtime(tree, venv, stubs, pypaths, version, rep):
    env = env_for(tree, venv, stubs, pypaths)
    env["TREE"] = str(tree)
    r, secs = run_py(venv, env, IMPORTTIME_SCRIPT, args=("-X", "importtime"), pre=FAKE_NVML)
    if r.returncode:
        rep(f"importtime: FAIL ({secs:.1f}s): {r.stderr.strip().splitlines()[-1][:300]}")
        return None
    data = json.loads(next(ln for ln in r.stdout.splitlines() if ln.startswith("JSON"))[4:])
    cum = {}
    for line in r.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)", line)
        if m and "." not in m.group(4):
            cum[m.group(4)] = max(cum.get(m.group(4), 0), int(m.group(2)))
    by = {"tree": [], "image": [], "builtin/stdlib": []}
    for top, (where, _f, dists) in sorted(data.items()):
        by[where].append((top, dists))
    rep(
        f"importtime (simulated H200): `import vllm.entrypoints.openai.api_server` took {secs:.1f}s, "
        f"{len(data)} top-level modules: {len(by['tree'])} from the tree, {len(by['image'])} from the image, "
        f"{len(by['builtin/stdlib'])} builtin/stdlib"
    )

    def fmt(xs):
        return ", ".join(f"{t}" + (f" ({'/'.join(d + ' ' + v for d, v in ds)})" if ds else "") for t, ds in xs)

    rep(f"  from the tree: {fmt(by['tree'])}")
    rep(f"  from the image: {fmt(by['image'])}")
    slow = sorted(((v, k) for k, v in cum.items() if k in data and data[k][0] != "builtin/stdlib"), reverse=True)[:12]
    rep("  slowest top-level imports (cumulative): " + ", ".join(f"{k} {v / 1e6:.2f}s" for v, k in slow))
    left = [m for m in LEFT_OUT if m in data]
    rep(f"  left-out packages imported: {left or 'none'}")
    return data


def check_requirements(tree, venv, stubs, pypaths, data, rep):
    """Requires-Dist of every distribution imported, against what image + tree provide."""
    env = env_for(tree, venv, stubs, pypaths)
    dists = sorted({d for where, f, ds in data.values() for d, v in ds})
    code = textwrap.dedent("""
        import importlib.metadata as md, json, sys
        from packaging.requirements import Requirement
        bad = []
        for d in json.loads(sys.argv[1]):
            try:
                reqs = md.requires(d) or []
            except md.PackageNotFoundError:
                continue  # vendored inside another distribution (setuptools/_vendor: jaraco, more_itertools)
            for r in reqs:
                req = Requirement(r)
                if req.marker and not req.marker.evaluate({"extra": ""}):
                    continue
                try:
                    have = md.version(req.name)
                except md.PackageNotFoundError:
                    have = None
                if have is None or not req.specifier.contains(have, prereleases=True):
                    bad.append(f"{d} {md.version(d)} needs {req.name}{req.specifier}: {have or 'absent'}")
        print(json.dumps(bad))
    """)
    r = subprocess.run([venv_python(venv), "-c", code, json.dumps(dists)], env=env, capture_output=True, text=True)
    if r.returncode:
        rep(f"requirements: FAIL {r.stderr.strip()[-300:]}")
        return
    bad = json.loads(r.stdout.strip().splitlines()[-1])
    rep(f"requirements of the {len(dists)} distributions imported by the API server, in image + tree: {len(bad)} unmet")
    for b in bad:
        rep(f"  UNMET {b}")


RUNTIME_SCRIPT = textwrap.dedent("""
    import json, os, sys, time, tempfile, shutil, torch
    t = time.time()
    from vllm.utils import jit_monitor
    jit_monitor.activate(mode="warn")
    print(f"ok jit_monitor.activate ({time.time() - t:.1f}s): cutedsl hook {jit_monitor._cutedsl_hook_installed}, "
          f"tilelang hook {jit_monitor._tilelang_hook_installed}", flush=True)
    from vllm.engine.arg_utils import EngineArgs
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.selector import get_attn_backend
    from vllm.model_executor.model_loader.utils import get_model_architecture
    llama = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
             "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
             "head_dim": 128, "vocab_size": 128256, "max_position_embeddings": 131072, "rope_theta": 500000.0,
             "rms_norm_eps": 1e-05, "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    for label, conf in [("Qwen3-MoE test model", json.load(open(os.environ["MODEL_CONFIG"]))), ("Llama 32x4096", llama)]:
        d = tempfile.mkdtemp()
        json.dump(conf, open(os.path.join(d, "config.json"), "w"))
        t = time.time()
        cfg = EngineArgs(model=d, load_format="dummy", skip_tokenizer_init=True, kv_cache_dtype="fp8",
                         max_model_len=32768, max_num_batched_tokens=8192, max_num_seqs=8,
                         gpu_memory_utilization=0.92).create_engine_config()
        cc = cfg.compilation_config
        print(f"ok create_engine_config {label} ({time.time() - t:.1f}s): {cfg.model_config.architecture}, "
              f"dtype {cfg.model_config.dtype}, kv {cfg.cache_config.cache_dtype}, compile mode {cc.mode}, "
              f"cudagraph {cc.cudagraph_mode}, platform "
              f"{type(__import__('vllm.platforms', fromlist=['x']).current_platform).__name__}", flush=True)
        with set_current_vllm_config(cfg):
            t = time.time()
            cls, arch = get_model_architecture(cfg.model_config)
            print(f"ok model class ({time.time() - t:.1f}s): {cls.__module__}.{cls.__name__}", flush=True)
            t = time.time()
            try:
                b = get_attn_backend(128, torch.bfloat16, "fp8", num_heads=conf["num_attention_heads"])
                print(f"ok attention backend for sm_90 + fp8 KV ({time.time() - t:.1f}s): {b.get_name()}", flush=True)
            except Exception as e:
                print(f"ok attention backend: not decidable without a GPU here: {type(e).__name__}: {str(e)[:200]}",
                      flush=True)
""")


def check_runtime_paths(tree, venv, stubs, pypaths, rep):
    env = env_for(tree, venv, stubs, pypaths)
    env["MODEL_CONFIG"] = str(MODEL_CONFIG)
    r, secs = run_py(venv, env, RUNTIME_SCRIPT, pre=FAKE_NVML)
    for line in r.stdout.splitlines():
        if line.startswith("ok "):
            rep(f"  {line}")
    if r.returncode:
        tail = [ln for ln in r.stderr.strip().splitlines() if ln.strip()][-3:]
        rep(f"  STOPPED ({secs:.1f}s): {' | '.join(x.strip()[:250] for x in tail)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", default="all", choices=["all", "0.34.0", "0.33.0"])
    ap.add_argument("--venv", type=Path, default=Path(os.path.expanduser("~/.cache/v034/imgvenv")))
    ap.add_argument(
        "--work",
        type=Path,
        default=Path(os.path.expanduser("~/.cache/v034/stage-work")),
        help="stage.py's work folder (holds tree-<set>)",
    )
    ap.add_argument("--setup", action="store_true", help="create the replica venv first")
    ap.add_argument("--skip", default="", help="comma list of: native,imports,plain,importtime,runtime")
    a = ap.parse_args()
    stubs = a.work / "stubs"
    if a.setup:
        setup(a.venv, stubs)
    skip = set(filter(None, a.skip.split(",")))
    sets = ["0.34.0", "0.33.0"] if a.set == "all" else [a.set]
    for version in sets:
        tree = a.work / f"tree-{version}"
        if not tree.is_dir():
            sys.exit(f"no {tree}: run stage.py first")
        lines = []

        def rep(s, lines=lines):
            lines.append(s)
            print(s, flush=True)

        pypaths = []
        r = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys, site; t = sys.argv[1]; sys.path.insert(0, t); "
                "b = list(sys.path); site.addsitedir(t); print('\\n'.join(p for p in sys.path if p not in b))",
                str(tree),
            ],
            capture_output=True,
            text=True,
        )
        pypaths = [os.path.relpath(p, tree) for p in r.stdout.split()]
        rep(
            f"# cpu_check.py, vLLM {version}: tree {tree} (as packed), replica venv {a.venv} "
            f"(Python {subprocess.run([venv_python(a.venv), '-V'], capture_output=True, text=True).stdout.split()[-1]}), "
            f"PYTHONPATH tree + {pypaths}, {time.strftime('%Y-%m-%d')}"
        )
        n = make_stubs(tree, stubs)
        rep(
            f"stubs: libcuda.so.1 ({n['libcuda.so.1']} symbols), libnvidia-ml.so.1 ({n['libnvidia-ml.so.1']}) "
            "on LD_LIBRARY_PATH (this machine has no driver)"
        )
        check_nccl(tree, a.venv, rep)
        if "native" not in skip:
            check_native(tree, a.venv, stubs, pypaths, rep)
        if "imports" not in skip:
            rep("imports, simulated H200 (fake NVML: 1 x sm_90), one fresh interpreter each:")
            f1 = check_imports(tree, a.venv, stubs, pypaths, version, rep, simulated=True)
            f2 = []
            if "plain" not in skip:
                rep("imports, this machine as it is (no GPU: vLLM's CPU/unspecified platform):")
                f2 = check_imports(tree, a.venv, stubs, pypaths, version, rep, simulated=False)
            rep(f"imports: {len(f1)} failed simulated, {len(f2)} failed plain")
        data = None
        if "importtime" not in skip:
            data = check_importtime(tree, a.venv, stubs, pypaths, version, rep)
            if data:
                check_requirements(tree, a.venv, stubs, pypaths, data, rep)
        if "runtime" not in skip:
            rep("run-time paths (simulated H200):")
            check_runtime_paths(tree, a.venv, stubs, pypaths, rep)
        (HERE / f"cpu-check-{version}.txt").write_text("\n".join(lines) + "\n")
        log(f"wrote cpu-check-{version}.txt")


if __name__ == "__main__":
    main()
