"""How many engine slots a cluster gives, and how many survive when nodes die (no Ray needed)."""

from __future__ import annotations

import socket

import pytest

from throttle_sweep.cluster.ray_pool import ClusterError, SlotShape, hostable_slots, slot_shape

CONF = {"slots": None, "cpu_slots": 2, "max_slots": 8, "gpus_per_slot": None, "cpus_per_slot": 1.0}


@pytest.mark.parametrize(("resources", "tp", "conf", "count", "gpus"), [
    ({"CPU": 2.0}, 1, {}, 2, 0.0),  # CPU-only: the configured CPU slots
    ({"CPU": 8.0, "GPU": 4.0}, 1, {}, 4, 1.0),  # one slot per GPU
    ({"CPU": 8.0, "GPU": 4.0}, 2, {}, 2, 2.0),  # tensor_parallel_size=2: two GPUs a slot
    ({"CPU": 8.0, "GPU": 3.0}, 2, {}, 1, 2.0),  # a GPU left over is not a slot
    ({"CPU": 64.0, "GPU": 16.0}, 1, {}, 8, 1.0),  # capped by max_slots
    ({"CPU": 8.0, "GPU": 4.0}, 1, {"slots": 3}, 3, 1.0),  # asked for
])
def test_slot_count_follows_gpus_tensor_parallel_and_caps(resources, tp, conf, count, gpus):
    shape = slot_shape({**CONF, **conf}, resources, tp)
    assert (shape.count, shape.num_gpus) == (count, gpus)


def test_no_slot_is_a_clear_error():
    with pytest.raises(ClusterError, match="no engine slots"):
        slot_shape({**CONF, "gpus_per_slot": 2.0}, {"CPU": 4.0, "GPU": 1.0}, 1)


def test_dead_nodes_host_nothing():
    shape = SlotShape(4, 1.0, 1.0, "")
    nodes = [{"Alive": True, "Resources": {"GPU": 2.0, "CPU": 2.0}},
             {"Alive": False, "Resources": {"GPU": 2.0, "CPU": 2.0}},
             {"Alive": True, "Resources": {"GPU": 4.0, "CPU": 1.0}}]  # CPU-bound: one slot
    assert hostable_slots(nodes, shape) == 3


def test_a_ray_address_where_nothing_listens_gets_a_clear_error_in_seconds(tmp_path):
    import time

    import pytest

    from tests.helpers import compose_cfg
    from throttle_sweep.cluster.ray_runtime import ClusterError, connect

    with socket.socket() as probe:  # a loopback port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cfg = compose_cfg("ray.enabled=true", f"ray.address=127.0.0.1:{port}", tmp_path=tmp_path)
    began = time.monotonic()
    with pytest.raises(ClusterError, match=rf"ray.address='127.0.0.1:{port}': no Ray cluster answered there .*"
                                           "ray start --head"):
        connect(dict(cfg.ray), tmp_path, lambda _: None)
    assert time.monotonic() - began < 10


@pytest.mark.parametrize(("engine", "gpus"), [
    ({}, 1), ({"tensor_parallel_size": None}, 1), ({"tensor_parallel_size": 2}, 2),
    ({"tensor_parallel_size": 2, "pipeline_parallel_size": 2}, 4),  # vLLM's world: tp x pp GPUs on one node
    ({"pipeline_parallel_size": 3}, 3),
    ({"tensor_parallel_size": 2, "data_parallel_size": 2}, 4),  # data parallel replicas hold GPUs of their own
])
def test_a_slot_holds_every_gpu_of_its_engines_world(engine, gpus):
    """A slot's engine uses tensor x pipeline parallel GPUs; a slot with fewer would make vLLM look for the
    rest outside the slot (its Ray executor, when the world is larger than the GPUs it sees)."""
    from throttle_sweep.cluster.ray_pool import engine_world

    assert engine_world([("engine", engine)]) == gpus
    assert slot_shape(CONF, {"CPU": 8.0, "GPU": 12.0}, engine_world([("engine", engine)])).num_gpus == gpus


def test_a_space_that_pairs_tensor_and_pipeline_parallel_gets_slots_for_the_largest_pair():
    """The sweep's starts vary one knob at a time from the base, but the search may pair tp=2 with pp=2."""
    from throttle_sweep.cluster.ray_pool import engine_world

    starts = [("baseline", {"tensor_parallel_size": 1}), ("space.tensor_parallel_size=2", {"tensor_parallel_size": 2}),
              ("space.pipeline_parallel_size=2", {"pipeline_parallel_size": 2})]
    assert engine_world(starts) == 4


def test_vllms_ray_executor_inside_a_slot_is_refused_before_any_slot_starts():
    from throttle_sweep.cluster.ray_pool import engine_world

    with pytest.raises(ClusterError, match="engine.distributed_executor_backend"):
        engine_world([("engine", {"tensor_parallel_size": 2, "distributed_executor_backend": "ray"})])


@pytest.mark.parametrize(("placements", "gpus", "shares"), [
    ([{"node_id": "a"}, {"node_id": "a"}], 0.0, True),  # CPU slots on one node share its cores and memory bus
    ([{"node_id": "a"}, {"node_id": "b"}], 0.0, False),
    ([{"node_id": "a"}, {"node_id": "a"}], 1.0, False),  # a GPU each: the measured work is on the GPU
    ([{"node_id": "a"}], 0.0, False),  # one slot shares with nobody
    ([{"node_id": "a"}, {}], 0.0, True),  # a slot not placed yet (a new actor) may land beside the other
])
def test_ray_cpu_slots_on_one_node_share_the_machine(placements, gpus, shares):
    """Where they share a machine, confirmations run alone, as local slots do."""
    from throttle_sweep.cluster.ray_pool import share_a_machine

    assert share_a_machine(dict(enumerate(placements)), SlotShape(len(placements), gpus, 1.0, "")) is shares


def test_a_space_that_reaches_vllms_ray_executor_is_refused_before_ray_starts(tmp_path, monkeypatch):
    """The refusal and the GPU count cover every set of flags the sweep may start, not only `engine`."""
    from rich.console import Console

    from tests.helpers import compose_cfg
    from throttle_sweep.cluster import ray_pool as cluster
    from throttle_sweep.commands import sweep as sweep_cmd

    monkeypatch.setattr(cluster, "connect", lambda *a, **k: pytest.fail("Ray was started"))
    cfg = compose_cfg("backend=fake", "+space=batching", "ray.enabled=true", "plots=false",
                      "+baseline.distributed_executor_backend=ray", tmp_path=tmp_path)
    with pytest.raises(ClusterError, match="baseline.distributed_executor_backend=ray"):
        sweep_cmd.run(cfg, Console(quiet=True))
