#!/usr/bin/env bash
# Install a stage set made by tests/gpu/vllm034/stage.py on the lent H200 (no network needed).
# After every folder of the set was copied flat into $STAGE (mkdir -p /tmp/stage && cp .stage034/cNN/* /tmp/stage/):
#   bash /tmp/stage/install-on-device.sh                    # vLLM 0.34.0 -> /tmp/site034
#   SET=0.33.0 bash /tmp/stage/install-on-device.sh         # vLLM 0.33.0 -> /tmp/site033 (needs the 0.34.0
#                                                           #   set too: installs it first when it is not yet)
# then: source /tmp/site034/vllm-env.sh   (PYTHONPATH, PATH; the image's python, torch's CUDA libraries)
# Idempotent: once installed it returns at once (with SMOKE=force it reruns the smoke test).
# Knobs: STAGE=/tmp/stage  SET=0.34.0|0.33.0  PY=/opt/torch/.venv/bin/python3
#        SMOKE=1 (imports + a CUDA op) | 2 (also a Triton kernel) | 0 (none) | force (rerun on an installed set)
# Every problem is one line starting with an upper-case word (MISSING, BAD, ...) that says what to resend.
set -uo pipefail
STAGE=${STAGE:-/tmp/stage}
SET=${SET:-0.34.0}
SMOKE=${SMOKE:-1}
PY=${PY:-/opt/torch/.venv/bin/python3}
[ -x "$PY" ] || PY=$(command -v python3)
T0=$(date +%s.%N)
el() { awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1fs", b - a}'; }
say() { echo "[$(el)] $*"; }
case "$SET" in 0.34.0) DEF_SITE=/tmp/site034; FOLDERS=.stage034;; 0.33.0) DEF_SITE=/tmp/site033; FOLDERS=.stage033;;
  *) echo "BAD SET=$SET: 0.34.0 or 0.33.0"; exit 2;; esac
MAN="$STAGE/manifest-$SET.txt"
SITE=$( [ -f "$MAN" ] && awk '$1=="site" {print $2}' "$MAN" || echo "$DEF_SITE")
field() { awk -v k="$1" '$1==k {$1=""; sub(/^ /, ""); print; exit}' "$MAN"; }

smoke() {  # $1: site
  [ "$SMOKE" = 0 ] && return 0
  say "smoke test of vLLM $SET with $PY ..."
  ( source "$1/vllm-env.sh"
    SITE="$1" SET="$SET" SMOKE="$SMOKE" timeout 900 "$PY" - <<'PYEOF'
import importlib, importlib.metadata as md, os, sys, time
site, version, level = os.environ["SITE"], os.environ["SET"], os.environ["SMOKE"]
t_all, fails = time.time(), []
def step(label, fn):
    t = time.time()
    try:
        out = fn()
        print(f"  ok   {label} ({time.time() - t:.1f}s){': ' + str(out) if out not in (None, '') else ''}", flush=True)
        return True
    except BaseException as e:
        fails.append(label)
        print(f"  FAIL {label} ({time.time() - t:.1f}s): {type(e).__name__}: {str(e)[:400]}", flush=True)
        return False
def torch_info():
    import torch
    assert torch.__file__.startswith(site), f"torch from {torch.__file__}, not {site}"
    return f"{torch.__version__} cuda {torch.version.cuda}"
def cuda_info():
    import torch
    assert torch.cuda.is_available(), "torch.cuda.is_available() is False"
    x = torch.ones(1024, 1024, device="cuda", dtype=torch.bfloat16)
    y = (x @ x).float().sum().item()
    assert y == 1024.0 ** 3, y
    return f"{torch.cuda.get_device_name(0)} sm_{''.join(map(str, torch.cuda.get_device_capability(0)))}, bf16 matmul ok"
def nccl_info():
    import torch
    v = torch.cuda.nccl.version()
    libs = sorted({l.split()[-1] for l in open("/proc/self/maps") if "libnccl.so" in l})
    assert tuple(v[:2]) == (2, 30), f"NCCL {v}"
    assert libs and all(l.startswith(site) for l in libs), f"libnccl loaded from {libs}"
    return f"NCCL {'.'.join(map(str, v))} from {libs[0]}"
def cudnn_info():
    import torch
    c = torch._C._cudnn
    return f"cuDNN runtime {c.getRuntimeVersion()} (torch built with {c.getCompileVersion()})"
def dists():
    want = [l.split()[1:3] for l in open(os.environ.get("MAN_FILE", "/dev/null")) if l.startswith("dist ")]
    bad = [f"{n} {md.version(n)} != {v}" for n, v in want if md.version(n) != v]
    assert not bad, "; ".join(bad[:8])
    return f"{len(want)} carried distributions resolve to the set's versions"
def triton_kernel():
    import torch, triton, triton.language as tl
    @triton.jit
    def add(x, y, o, n, B: tl.constexpr):
        i = tl.program_id(0) * B + tl.arange(0, B)
        tl.store(o + i, tl.load(x + i, mask=i < n) + tl.load(y + i, mask=i < n), mask=i < n)
    x = torch.arange(4096, device="cuda", dtype=torch.float32)
    o = torch.empty_like(x)
    add[(4,)](x, x, o, 4096, B=1024)
    assert torch.equal(o, 2 * x)
    return f"triton {triton.__version__} compiled and ran a kernel"
step("torch", torch_info)
step("torch.cuda", cuda_info)
step("nccl", nccl_info)
step("cudnn", cudnn_info)
step("dist versions", dists)
if level in ("2", "force2"):
    step("triton kernel", triton_kernel)
mods = ["triton", "flashinfer", "vllm", "vllm.entrypoints.openai.api_server", "vllm.v1.worker.gpu_worker",
        "vllm.v1.worker.gpu.model_runner", "vllm.v1.worker.extensible_kv_cache", "vllm.utils.vmm_driver",
        "vllm.model_executor.models.qwen3_moe", "vllm.model_executor.models.llama"]
for m in mods:
    if version == "0.33.0" and m in ("vllm.v1.worker.extensible_kv_cache", "vllm.utils.vmm_driver"):
        print(f"  --   {m}: not part of vLLM 0.33.0")
        continue
    step(m, lambda m=m: getattr(importlib.import_module(m), "__version__", ""))
print(f"SMOKE {'OK' if not fails else 'FAILED: ' + ', '.join(fails)} (vLLM {version}, {time.time() - t_all:.0f}s)")
sys.exit(1 if fails else 0)
PYEOF
  )
}

# ---- 0. already installed? ------------------------------------------------------------------
if [ -f "$SITE/.stage-ok" ] && [ -f "$SITE/vllm-env.sh" ]; then
  if [ ! -f "$MAN" ] || [ "$(cat "$SITE/.stage-ok")" = "$(field stream | awk '{print $3}')" ]; then
    say "vLLM $SET already installed in $SITE: source $SITE/vllm-env.sh"
    if [[ "$SMOKE" == force* ]]; then MAN_FILE=$SITE/.stage-manifest; export MAN_FILE; smoke "$SITE"; exit $?; fi
    exit 0
  fi
  say "$SITE holds another build of vLLM $SET: reinstalling"
fi
[ -f "$MAN" ] || { echo "MISSING $MAN: copy folder c01 of $FOLDERS into $STAGE"; exit 1; }
say "installing vLLM $SET from $STAGE into $SITE"

# ---- 1. the base set first (0.33 reuses the 0.34 tree's files) --------------------------------
BASE_SITE=
if read -r _ BASE BASE_SITE < <(grep '^base ' "$MAN"); then
  if [ ! -f "$BASE_SITE/.stage-ok" ]; then
    say "vLLM $SET reuses files of the $BASE tree, which is not installed: installing it first"
    SET=$BASE SMOKE=0 STAGE=$STAGE PY=$PY bash "$0" || { echo "BASE $BASE failed to install (see above); vLLM $SET needs it"; exit 1; }
  fi
fi

# ---- 2. every part there and intact? ----------------------------------------------------------
read -r _ STEM SBYTES SSHA < <(grep '^stream ' "$MAN")
mapfile -t PARTS < <(awk '$1=="part" {print $2}' "$MAN")
bad=0
declare -A HAVE
while read -r h f; do HAVE["${f##*/}"]=$h; done < <(
  for p in "${PARTS[@]}"; do [ -f "$STAGE/$p" ] && echo "$STAGE/$p"; done | xargs -r -P 16 -n 1 sha256sum)
while read -r _ p folder size sha; do
  if [ ! -f "$STAGE/$p" ]; then echo "MISSING $p: resend folder $folder of $FOLDERS"; bad=1
  elif [ "$(stat -c %s "$STAGE/$p")" != "$size" ]; then echo "BAD $p: $(stat -c %s "$STAGE/$p") bytes, expected $size: resend folder $folder of $FOLDERS"; bad=1
  elif [ "${HAVE[$p]:-}" != "$sha" ]; then echo "BAD $p: sha256 differs: resend folder $folder of $FOLDERS"; bad=1
  fi
done < <(grep '^part ' "$MAN")
if read -r _ RLIST RCOUNT RBYTES RSHA < <(grep '^reuse ' "$MAN"); then
  if [ ! -f "$STAGE/$RLIST" ]; then echo "MISSING $RLIST: resend folder c01 of $FOLDERS"; bad=1
  elif [ "$(sha256sum "$STAGE/$RLIST" | cut -d' ' -f1)" != "$RSHA" ]; then echo "BAD $RLIST: sha256 differs: resend folder c01 of $FOLDERS"; bad=1; fi
fi
[ "$bad" = 0 ] || { echo "STOPPED: resend the folders named above, then run this again"; exit 1; }
say "${#PARTS[@]} parts verified ($SBYTES bytes)"

# ---- 3. unpack into SITE.partial, then move into place ----------------------------------------
read -r _ NFILES NBYTES < <(grep '^files ' "$MAN")
free=$(df -PB1 "$(dirname "$SITE")" | awk 'NR==2 {print $4}')
[ "$free" -gt $((NBYTES + 1000000000)) ] || { echo "NO SPACE: $free bytes free under $(dirname "$SITE"), need $NBYTES + 1 GB"; exit 1; }
rm -rf "$SITE.partial" "$SITE"
mkdir -p "$SITE.partial"
( cd "$STAGE" && cat "${PARTS[@]}" ) | tee >(sha256sum | cut -d' ' -f1 > "$SITE.partial.sha") | xz -d -T16 | tar -x -C "$SITE.partial"
rc=("${PIPESTATUS[@]}")
for _ in $(seq 100); do [ -s "$SITE.partial.sha" ] && break; sleep 0.1; done
if [ "${rc[0]}${rc[1]}${rc[2]}${rc[3]}" != 0000 ]; then echo "UNPACK FAILED (cat/tee/xz/tar exit ${rc[*]}): rerun; if it fails again resend all folders of $FOLDERS"; exit 1; fi
if [ "$(cat "$SITE.partial.sha")" != "$SSHA" ]; then echo "BAD stream sha256 after unpacking: resend all folders of $FOLDERS"; exit 1; fi
rm -f "$SITE.partial.sha"
say "unpacked $STEM"
if [ -n "${RLIST:-}" ]; then
  xz -dc "$STAGE/$RLIST" | "$PY" -c '
import os, sys
base, site = sys.argv[1], sys.argv[2]
n = 0
for line in sys.stdin:
    rel = line.rstrip("\n")
    src, dst = os.path.join(base, rel), os.path.join(site, rel)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    try:
        os.link(src, dst)
    except FileNotFoundError:
        sys.exit(f"MISSING {src} in the base tree: reinstall it (rm -rf {base}) and rerun")
    n += 1
print(f"linked {n} files from {base}")' "$BASE_SITE" "$SITE.partial" || exit 1
  say "reused $RCOUNT files of $BASE_SITE"
fi
read -r gotn gotb < <(find "$SITE.partial" -type f -printf '%s\n' | awk '{n++; b+=$1} END {printf "%d %d\n", n, b}')
if [ "$gotn" != "$NFILES" ] || [ "$gotb" != "$NBYTES" ]; then
  echo "BAD tree: $gotn files / $gotb bytes, expected $NFILES / $NBYTES: rerun (rm -rf $SITE.partial)"; exit 1
fi
mv "$SITE.partial" "$SITE"
cp "$MAN" "$SITE/.stage-manifest"

# ---- 4. environment: PYTHONPATH does not process .pth files, so their entries are listed -------
PP="$SITE"
while read -r _ rel; do
  [ -d "$SITE/$rel" ] || { echo "BAD manifest: pypath $rel is not a directory in $SITE"; exit 1; }
  PP="$PP:$SITE/$rel"
done < <(grep '^pypath ' "$MAN")
devpp=$("$PY" -c 'import sys, site; t = sys.argv[1]; sys.path.insert(0, t); b = list(sys.path); site.addsitedir(t); print(":".join([t] + [p for p in sys.path if p not in b]))' "$SITE" 2>/dev/null)
[ "$devpp" = "$PP" ] || echo "NOTE .pth files add '$devpp' here, the manifest says '$PP' (using the manifest's)"
cat > "$SITE/vllm-env.sh" <<EOF
# vLLM $SET from the stage set; made by install-on-device.sh. torch's CUDA libraries (cuBLAS, cuDNN, ...)
# come from the image's venv ($PY); NCCL 2.30.7 from $SITE/nvidia/nccl/lib (torch's RPATH).
export PYTHONPATH=$PP\${PYTHONPATH:+:\$PYTHONPATH}
export PATH=$SITE/bin:\$PATH
# torch 2.14 was built against cuDNN 9.24, the image has 9.19 (every symbol present; text models use no cuDNN)
export PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1
EOF
echo "$SSHA" > "$SITE/.stage-ok"
say "installed vLLM $SET in $SITE: source $SITE/vllm-env.sh"
MAN_FILE=$SITE/.stage-manifest; export MAN_FILE
smoke "$SITE"
