"""A real ``torch.distributed`` (gloo) program on Ray actors, one rank per node, traced with ``memtrace.start``.

    python tests/distributed/gloo_program.py --address ADDR --run-dir DIR [--no-carry | --drop-collector] [--world 2]

The driver starts memtrace's collector on its node and gives the actors memtrace's switches through
``memtrace.capture.ray_gather.runtime_env()`` (``--no-carry``: it does not, as a program unaware of
memtrace would; ``--drop-collector``: it kills the collector before the ranks stop recording, as a driver
that dies would). Rank ``r`` is placed on the node holding the custom resource ``node<r>``. Each rank
records ``init_process_group``, ``all_reduce`` and ``barrier`` in a session that a second call stops; its
reply (printed as one JSON line by the driver) holds the all-reduced value, its node, pid, the session's
path and the true time (this process's clock, never skewed) right after the barrier.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

import ray


@ray.remote(num_cpus=1)
class Rank:
    def record(self, rank: int, world: int, init_method: str) -> None:
        """Start this rank's session and run the collectives inside phases (the session stays open)."""
        import memtrace
        import torch
        import torch.distributed as dist

        self.rank = rank
        self.session = memtrace.start(rank=rank, world_size=world, sidecar=False)
        with memtrace.phase("init_process_group"):
            dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
        with memtrace.phase("all_reduce"):
            t = torch.full((1024,), float(rank + 1))
            dist.all_reduce(t)
        with memtrace.phase("barrier"):
            dist.barrier()
        self.after_barrier_us = time.time_ns() // 1000
        self.sum = float(t[0])
        dist.destroy_process_group()

    def finish(self) -> dict:
        """Stop the session (its file is complete, then handed over) and say what happened."""
        import memtrace

        path = str(self.session.path)
        memtrace.stop()
        return {
            "rank": self.rank,
            "sum": self.sum,
            "node_id": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
            "path": path,
            "after_barrier_true_us": self.after_barrier_us,
            "memtrace_env": sorted(k for k in os.environ if k.startswith("MEMTRACE")),
        }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--address", required=True)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--no-carry", action="store_true")
    p.add_argument("--drop-collector", action="store_true")
    args = p.parse_args()
    from memtrace.capture import ray_gather

    ray.init(address=args.address, logging_level="warning")
    os.environ["MEMTRACE_DIR"] = os.path.abspath(args.run_dir)
    env: dict = {}
    collector = None
    if not args.no_carry:
        collector = ray_gather.start_collector()
        env = ray_gather.runtime_env()
    init_method = f"tcp://127.0.0.1:{_free_port()}"
    actors = [Rank.options(resources={f"node{r}": 0.01}, runtime_env=env).remote() for r in range(args.world)]
    ray.get([a.record.remote(r, args.world, init_method) for r, a in enumerate(actors)], timeout=300)
    if (
        args.drop_collector and not args.no_carry
    ):  # the driver's side goes away before the workers hand their traces over
        ray.kill(collector)
    results = ray.get([a.finish.remote() for a in actors], timeout=300)
    print(json.dumps({"driver_node_id": ray.get_runtime_context().get_node_id(), "ranks": results}), flush=True)
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
