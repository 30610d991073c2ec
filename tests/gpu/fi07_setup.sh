#!/usr/bin/env bash
# Stage and install FlashInfer 0.7.4 (+ CuTe DSL 4.8.1 cu13, apache-tvm-ffi) on a fresh lent H200, one call a folder.
#   bash tests/gpu/fi07_setup.sh .whl07/p1     # a call carrying .whl07/p1: copies it into /tmp/fi07stage
#   bash tests/gpu/fi07_setup.sh .whl07/p2     # next call (machine still warm: /tmp survives 30 s), and so on
#   bash tests/gpu/fi07_setup.sh --install     # with the last folder: reassemble, check sha256s, install, import
# Then: source /tmp/fi07/env.sh (PYTHONPATH=/tmp/fi07 plus CuTe DSL's dsl_packages, which its .pth would add
# in a site directory but not under --target) and run tests/gpu/seed_b12x.py.
# Each folder holds the whole manifest.txt ("sha <sha256> <file>" and "join <wheel> <part>..." lines).
# The image already has torch, numpy, cuda-bindings, cuda-pathfinder, nvidia-ml-py, protobuf, typing-extensions,
# click, einops, ninja, requests, tabulate, tqdm, packaging; FlashInfer's other needs (cuda-tile,
# nvidia-cudnn-frontend, nccl4py, nccl-extensions) are not imported on the b12x MoE path and are not carried.
# Local dry run: FI07_STAGE=... FI07_TARGET=... FI07_PIP_ARGS="--python-version 3.12 --platform
# manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --only-binary=:all:" FI07_CHECK=0.
set -euo pipefail
STAGE=${FI07_STAGE:-/tmp/fi07stage}
TARGET=${FI07_TARGET:-/tmp/fi07}
PY=${FI07_PYTHON:-python3}

sha_of() { sha256sum "$1" | cut -c1-64; }

# check FILE...: each file's sha256 against the manifest (a file the manifest does not name is an error)
check() {
  local f want got
  for f in "$@"; do
    want=$(awk -v n="$(basename "$f")" '$1 == "sha" && $3 == n {print $2}' "$STAGE/manifest.txt")
    got=$(sha_of "$f")
    [ -n "$want" ] || { echo "FAIL $(basename "$f"): not in manifest.txt"; return 1; }
    [ "$want" = "$got" ] || { echo "FAIL $(basename "$f"): sha256 $got, manifest $want"; return 1; }
    echo "ok   $(basename "$f") $(stat -c %s "$f") B"
  done
}

# the files the manifest names that are still missing from the stage (parts and plain wheels, not joined wheels)
missing() {
  local joined
  joined=$(awk '$1 == "join" {print $2}' "$STAGE/manifest.txt")
  awk '$1 == "sha" {print $3}' "$STAGE/manifest.txt" | while read -r f; do
    grep -qxF "$f" <<<"$joined" && continue
    [ -f "$STAGE/$f" ] || echo "$f"
  done
}

stage() {
  local src=$1
  [ -f "$src/manifest.txt" ] || { echo "FAIL $src has no manifest.txt (was it named in carry?)"; exit 1; }
  mkdir -p "$STAGE"
  cp "$src"/* "$STAGE/"
  local f files=()
  for f in "$src"/*; do [ "$(basename "$f")" = manifest.txt ] || files+=("$STAGE/$(basename "$f")"); done
  check "${files[@]}"
  local left
  left=$(missing)
  echo "staged $src into $STAGE ($(du -sb "$STAGE" | cut -f1) B); still missing: ${left:-nothing, run --install}" | tr '\n' ' '
  echo
}

install() {
  [ -f "$STAGE/manifest.txt" ] || { echo "FAIL nothing staged in $STAGE (machine went cold?)"; exit 1; }
  local left
  left=$(missing)
  [ -z "$left" ] || { echo "FAIL still missing in $STAGE:"; echo "$left"; exit 1; }
  local wheel parts
  while read -r _ wheel parts; do
    # shellcheck disable=SC2086  # parts is a word list
    (cd "$STAGE" && cat $parts >"$wheel.tmp" && mv "$wheel.tmp" "$wheel")
    echo "joined $wheel from $parts"
  done < <(awk '$1 == "join"' "$STAGE/manifest.txt")
  check "$STAGE"/*.whl
  rm -rf "$TARGET"
  # shellcheck disable=SC2086  # FI07_PIP_ARGS is a word list on purpose
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir ${FI07_PIP_ARGS:-} --target "$TARGET" \
    "$STAGE"/*.whl
  local dsl="$TARGET/nvidia_cutlass_dsl/dsl_packages"
  [ -d "$dsl/cutlass" ] || { echo "FAIL no $dsl/cutlass after the install"; exit 1; }
  # tvm_ffi would JIT-build its torch DLPack addon at import when torch lacks __dlpack_c_exchange_api__:
  # a compile that allocating workspaces does not need
  { echo "export PYTHONPATH=$TARGET:$dsl\${PYTHONPATH:+:\$PYTHONPATH}"
    echo "export TVM_FFI_DISABLE_TORCH_C_DLPACK=\${TVM_FFI_DISABLE_TORCH_C_DLPACK:-1}"; } >"$TARGET/env.sh"
  echo "installed into $TARGET ($(du -sb "$TARGET" | cut -f1) B); source $TARGET/env.sh"
  [ "${FI07_CHECK:-1}" = 0 ] && return 0
  # shellcheck disable=SC1091
  source "$TARGET/env.sh"
  timeout 300 "$PY" - <<'EOF'
import importlib.metadata as md
import inspect

import torch

for name in ("torch", "cuda-bindings", "cuda-pathfinder", "nvidia-ml-py", "protobuf", "typing_extensions", "numpy"):
    try:
        print(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name} MISSING")
import cutlass.cute as cute

print("cutlass DSL", md.version("nvidia-cutlass-dsl"), "FastDivmodDivisorV2:", hasattr(cute, "FastDivmodDivisorV2"))
import flashinfer

print("flashinfer", flashinfer.__version__)
from flashinfer.fused_moe.cute_dsl import b12x_moe
from flashinfer.fused_moe.cute_dsl.blackwell_sm12x import moe_dispatch

print("moe_dispatch", moe_dispatch.__file__)
shared = "shared_static_workspace" in inspect.signature(b12x_moe.B12xMoEWrapper).parameters
print("B12xMoEWrapper shared workspaces (flashinfer#4603):", shared)
if torch.cuda.is_available():
    props = torch.cuda.get_device_properties(0)
    cut = moe_dispatch._get_static_compact_cutover_pairs("fp4", quant_mode="nvfp4", num_experts=256,
        intermediate_size=512, hidden_size=2048, activation="silu", num_topk=8, capacity_tokens=8192)  # fmt: skip
    print(f"{props.name}, {props.multi_processor_count} SMs, cc {props.major}.{props.minor}; seed cutover {cut} pairs")
EOF
}

case "${1:-}" in
  --install) install ;;
  "" | -h | --help) sed -n '2,/^set /{/^#/p}' "$0" ;;
  *) stage "${1%/}" ;;
esac
