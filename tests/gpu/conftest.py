"""GPU tests: run on a machine with a CUDA GPU with ``pytest -m gpu tests/gpu``; skipped elsewhere."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the device machine: pytest -m gpu tests/gpu)")
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(skip)
