"""A goodput sweep over GPU types on a local Ray cluster whose two nodes carry two pretend types (Ray's
`accelerator_type:<type>` resources): one slot per type, each configuration measured on its own type's node,
and the answer names the cheaper type. The fake engine runs at each type's speed (fake.type_speed)."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile

import pytest
from rich.console import Console

from tests.helpers import GOODPUT_TYPED, compose_cfg
from throttle_sweep.commands import sweep as sweep_cmd
from throttle_sweep.ray_runtime import ClusterError
from throttle_sweep.records import read_records

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def typed_cluster():
    """A head of type A and a worker of type B, two CPUs each, no GPUs; torn down afterwards."""
    from ray.cluster_utils import Cluster

    temp = tempfile.mkdtemp(prefix="ts-ty-", dir="/tmp")
    os.makedirs(f"{temp}/ray")
    old = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = temp
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"accelerator_type:A": 1},
                                                      "include_dashboard": False, "temp_dir": f"{temp}/ray"})
    c.add_node(num_cpus=2, resources={"accelerator_type:B": 1})
    c.wait_for_nodes()
    try:
        yield c
    finally:
        with contextlib.suppress(Exception):
            c.shutdown()
        if old is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = old


def test_each_type_runs_on_its_own_node_and_the_cheaper_type_is_named(typed_cluster, tmp_path):
    cfg = compose_cfg(*GOODPUT_TYPED, "cost.prices={A: 1.0, B: 2.5}", f"ray.address={typed_cluster.address}",
                      tmp_path=tmp_path)
    console = Console(record=True, width=250)
    code = sweep_cmd.run(cfg, console)
    said = console.export_text()
    summary = json.loads((tmp_path / "g" / "summary.json").read_text())
    assert code == 0 and summary["winner"]["params"]["gpu_type"] == "B", said
    records = read_records(tmp_path / "g" / "replicates.jsonl")
    nodes = {}
    for r in records:
        gpu_type = r["params"]["gpu_type"]
        assert r["placement"]["gpu_type"] == gpu_type and r["environment"]["device_name"] == gpu_type
        nodes.setdefault(gpu_type, set()).add(r["placement"]["node_id"])
    # one node per type, the two apart: the head is A, the worker B
    assert len(nodes["A"]) == len(nodes["B"]) == 1 and nodes["A"] != nodes["B"]
    assert nodes["A"] == {typed_cluster.head_node.node_id}
    assert "ray: one slot per GPU type: A@" in said


def test_a_priced_type_the_cluster_lacks_is_refused_before_any_engine_starts(typed_cluster, tmp_path):
    cfg = compose_cfg(*GOODPUT_TYPED, "cost.prices={A: 1.0, H100: 2.5}", f"ray.address={typed_cluster.address}",
                      tmp_path=tmp_path)
    with pytest.raises(ClusterError, match="H100 that no node of this Ray cluster has .its types: A, B"):
        sweep_cmd.run(cfg, Console(quiet=True))
    assert not (tmp_path / "g" / "replicates.jsonl").exists() or not read_records(tmp_path / "g" / "replicates.jsonl")
