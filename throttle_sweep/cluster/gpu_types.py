"""GPU types: one Ray slot per type priced in `cost.prices`, placed on a node that carries Ray's
`accelerator_type:<type>` resource (Ray sets it on GPU nodes; a node started with `--resources` can carry a
pretend one). A goodput sweep sends each configuration's runs to the slot of its type, one run at a time, so
runs on different hardware interleave in time; their costs are compared as absolute costs, unpaired.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from throttle_sweep.cluster.pool import Job
from throttle_sweep.cluster.ray_pool import SlotActor, SlotShape, engine_world
from throttle_sweep.cluster.ray_runtime import ClusterError, connect
from throttle_sweep.engines import Engine
from throttle_sweep.measurement.cost import Price
from throttle_sweep.measurement.replicate import record_header
from throttle_sweep.measurement.workload import WorkloadSpec

TYPE_RESOURCE = "accelerator_type:"
PLACE = 0.001  # of a type's resource a slot asks for: only where it lands, not how many there are


def cluster_types(resources: Mapping[str, float]) -> list[str]:
    """The accelerator types Ray reports in a cluster's resources."""
    return sorted(k[len(TYPE_RESOURCE):] for k in resources if k.startswith(TYPE_RESOURCE))


def check_types(priced: Sequence[str], resources: Mapping[str, float]) -> None:
    """Every priced type must be on some node: refused by name before any engine starts."""
    there = cluster_types(resources)
    missing = [t for t in priced if t not in there]
    if missing:
        raise ClusterError(f"cost.prices names GPU type(s) {', '.join(missing)} that no node of this Ray cluster "
                           f"has (its types: {', '.join(there) or 'none'}; a node has type T when Ray reports the "
                           f"resource '{TYPE_RESOURCE}T'): price only the types the cluster has")


def hosts(node: Mapping[str, Any], gpu_type: str, shape: SlotShape) -> bool:
    """Can this node host a slot of this type: alive, of the type, with the slot's GPUs and CPUs?"""
    res = node.get("Resources", {})
    return bool(node.get("Alive")) and res.get(f"{TYPE_RESOURCE}{gpu_type}", 0) >= PLACE and \
        res.get("GPU", 0) >= shape.num_gpus and res.get("CPU", 0) >= shape.num_cpus


def check_room(types: Sequence[str], nodes: list[dict[str, Any]], shape: SlotShape) -> None:
    """Each type needs a node that holds a whole slot (the space's largest engine): refused by type, before
    any engine starts (Ray would wait for it until ray.start_timeout_s)."""
    short = [t for t in types if not any(hosts(n, t, shape) for n in nodes)]
    if short:
        raise ClusterError(f"no node of GPU type(s) {', '.join(short)} has room for a slot of {shape.num_gpus:g} GPUs "
                           f"and {shape.num_cpus:g} CPUs (the largest engine the space and baseline may start: "
                           "tensor x pipeline x data parallel size; ray.cpus_per_slot): narrow the space, or price "
                           "only types whose nodes hold it")


class TypedSlot:
    """A slot of one GPU type, measured as a local WarmSlot is (`measure(..., workload=)`): each run goes to
    its Ray actor and is waited for, under the Ray pool's deadlines and loss handling. A run the slot lost
    comes back as a record with `infrastructure: true` (the caller runs it again); a slot the pool retired (no
    node of its type is left) raises ClusterError."""

    def __init__(self, pool: Any, slot: int, gpu_type: str) -> None:
        self.pool, self.slot, self.gpu_type = pool, slot, gpu_type

    def measure(self, flags: Mapping[str, Any], arm: str, position: int, context: Mapping[str, Any], *,
                workload: Mapping[str, Any] | None = None) -> dict[str, Any]:
        if self.slot not in self.pool.slots:
            raise ClusterError(f"the slot of GPU type {self.gpu_type} is gone (no node of that type can host it "
                               "now); every run so far is kept: run the same command again once the cluster has "
                               "one, or price the types it has")
        job = Job(self.slot, dict(flags), arm, position, {**context, "gpu_type": self.gpu_type}, workload)
        self.pool.submit(job)
        while True:
            for done, record in self.pool.wait():
                self.pool.written(done)  # the caller writes it at once (capacity/runs.py)
                if done is job:
                    return record


def make_typed_slots(ray_conf: Mapping[str, Any], engine: Engine, spec: WorkloadSpec, prices: Mapping[str, Price],
                     *, engine_flags: Mapping[str, Any], warm: Mapping[str, Any], run_id: str,
                     out: Path, say: Callable[[str], None], starts: Sequence[tuple[str, Mapping[str, Any]]] = ()
                     ) -> tuple[dict[str, TypedSlot], Callable[[], None]]:
    """{type: its slot}, each charging its type's price, and the function that ends them (and a private Ray)."""
    import ray

    types = list(prices)

    from throttle_sweep.cluster.ray_pool import RayPool

    world = engine_world([("engine", dict(engine_flags)), *starts])
    stop = connect(ray_conf, out, say)
    try:
        resources = ray.cluster_resources()
        check_types(types, resources)
        per_gpu = ray_conf.get("gpus_per_slot")
        if per_gpu is None:
            per_gpu = float(world) if resources.get("GPU", 0) > 0 else 0.0
        shape = SlotShape(len(types), float(per_gpu), float(ray_conf["cpus_per_slot"]), "one slot per priced GPU type")
        check_room(types, ray.nodes(), shape)
        remote = ray.remote(num_cpus=shape.num_cpus, num_gpus=shape.num_gpus, max_restarts=0)(SlotActor)

        def make_actor(slot: int) -> Any:
            placed = remote.options(resources={f"{TYPE_RESOURCE}{types[slot]}": PLACE})
            return placed.remote(engine, spec, prices[types[slot]], run_id, slot, dict(warm), types[slot])

        def header(job: Job, environment: Mapping[str, Any]) -> dict[str, Any]:
            run_spec = replace(spec, **job.workload) if job.workload else spec
            price = prices[job.context["gpu_type"]]
            return record_header(engine, job.flags, run_spec, price, run_id=run_id, arm=job.arm,
                                 position=job.position, environment=environment or {"engine": engine.name},
                                 context=job.context)

        pool = RayPool(make_actor=make_actor, shape=shape, header=header, say=say,
                       start_timeout_s=ray_conf["start_timeout_s"], job_timeout_s=ray_conf["job_timeout_s"],
                       job_timeout_factor=ray_conf["job_timeout_factor"],
                       can_host=lambda slot, nodes: any(hosts(n, types[slot], shape) for n in nodes))
    except BaseException:
        stop()
        raise
    say("ray: one slot per GPU type: " + ", ".join(
        f"{types[slot]}@{p['node_ip']}" + (f"/gpu{','.join(p['gpu_ids'])}" if p["gpu_ids"] else "")
        for slot, p in sorted(pool.placement.items())))

    def close() -> None:
        pool.close()
        stop()

    return {t: TypedSlot(pool, slot, t) for slot, t in enumerate(types)}, close
