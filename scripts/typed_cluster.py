"""Try a GPU-type sweep without GPUs: a local Ray cluster of two nodes that carry two pretend GPU types
(Ray's `accelerator_type:A` and `:B` resources), the real CPU engine on one thread on A and on two on B, and
throttle_sweep run against it with the arguments given. Ends every Ray process it started.

    python scripts/typed_cluster.py +space=batching study.objective=goodput "cost.prices={A: 1.0, B: 3.0}" ...
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile


def main(args: list[str]) -> int:
    from ray.cluster_utils import Cluster

    temp = tempfile.mkdtemp(prefix="ts-types-", dir="/tmp")  # Ray's socket paths must stay short
    os.makedirs(f"{temp}/ray")
    os.environ["RAY_TMPDIR"] = temp
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "resources": {"accelerator_type:A": 1}, "include_dashboard": False,
        "temp_dir": f"{temp}/ray", "env_vars": {"OMP_NUM_THREADS": "1"}})
    try:
        cluster.add_node(num_cpus=2, resources={"accelerator_type:B": 1}, env_vars={"OMP_NUM_THREADS": "2"})
        cluster.wait_for_nodes()
        print(f"typed_cluster: type A (1 thread) on the head, type B (2 threads) on a worker: {cluster.address} "
              f"(Ray's files: {temp})", flush=True)
        return subprocess.call([sys.executable, "-m", "throttle_sweep", *args, "ray.enabled=true",
                                f"ray.address={cluster.address}"])
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
