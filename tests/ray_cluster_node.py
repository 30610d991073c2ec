"""Ray's own multi-node test cluster (``ray.cluster_utils.Cluster``) on this machine, in a process of its own.

    python tests/ray_cluster_node.py SPEC.json      # prints {"address": ...} on one line, then waits for stdin

SPEC is a list of nodes: ``{"temp_dir": ..., "num_cpus": 1, "num_gpus": 0, "resources": {...}, "env_vars":
{...}}``; each node gets its own Ray temporary folder (its own "disk"), and its own raylet environment
(``env_vars``), which every worker process it starts inherits: a node can stand for another host (another
``VLLM_HOST_IP``, a clock knob). The cluster lives until stdin closes; then every Ray process it started is
stopped. A separate process keeps Ray's state, signal handlers and exit hooks out of pytest's.
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    from ray.cluster_utils import Cluster

    nodes = json.loads(open(sys.argv[1]).read())
    cluster = Cluster()
    for spec in nodes:
        cluster.add_node(include_dashboard=False, **spec)
    print(json.dumps({"address": cluster.address}), flush=True)
    sys.stdin.read()  # until the test closes it
    cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
