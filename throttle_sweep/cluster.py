"""Engine slots on Ray: one actor per slot, owning its GPU(s) (or CPU share) and the engine on it.

The driver keeps the study and the records (one writer); actors only measure and return records. A slot
whose actor dies is replaced. When the node under it died too, the replicate is marked as an
infrastructure loss (the candidate is not to blame) and the slot is retired if the surviving nodes cannot
host it. A private local Ray is started bound to 127.0.0.1, without the dashboard UI or usage stats, in
its own temp dir, and stopped at the end; its process ids are written down so that a later run of the
same study can end any that a SIGKILLed driver left behind.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from throttle_sweep.cost import Price
from throttle_sweep.engines import FakeKnobs, make_engine
from throttle_sweep.errors import ThrottleSweepError
from throttle_sweep.measure import failed_record, measure_replicate, record_header
from throttle_sweep.pool import Job
from throttle_sweep.workload import WorkloadSpec

LEFTOVERS = "ray-local.json"


class ClusterError(ThrottleSweepError):
    """Ray could not give the sweep the slots it needs."""


@dataclass(frozen=True)
class SlotShape:
    count: int
    num_gpus: float
    num_cpus: float
    why: str


def slot_shape(ray_conf: Mapping[str, Any], resources: Mapping[str, float], tensor_parallel: int) -> SlotShape:
    """How many slots, and what each one holds: GPUs / tensor_parallel_size when the cluster has GPUs,
    else the configured CPU slots; `slots` overrides the count and `max_slots` caps it."""
    gpus = float(resources.get("GPU", 0))
    per_gpu = ray_conf.get("gpus_per_slot")
    if per_gpu is None:
        per_gpu = float(tensor_parallel) if gpus > 0 else 0.0
    if per_gpu < 0 or ray_conf["cpus_per_slot"] < 0:
        raise ClusterError("ray.gpus_per_slot and ray.cpus_per_slot must be >= 0")
    if ray_conf.get("slots") is not None:
        count, why = int(ray_conf["slots"]), "ray.slots"
    elif per_gpu > 0:
        count, why = int(gpus // per_gpu), f"{gpus:g} GPUs / {per_gpu:g} per slot"
    else:
        count, why = int(ray_conf["cpu_slots"]), "ray.cpu_slots (no GPUs in the cluster)"
    if count > ray_conf["max_slots"]:
        count, why = int(ray_conf["max_slots"]), f"{why}, capped by ray.max_slots"
    if count < 1:
        raise ClusterError(f"no engine slots: {why} gives {count}; the cluster has {dict(resources)}")
    return SlotShape(count, per_gpu, float(ray_conf["cpus_per_slot"]), why)


def hostable_slots(nodes: list[dict[str, Any]], shape: SlotShape) -> int:
    """How many slots of this shape the nodes still alive could hold."""
    total = 0
    for node in nodes:
        if not node.get("Alive"):
            continue
        res = node.get("Resources", {})
        fits = [math.floor(res.get("GPU", 0) / shape.num_gpus + 1e-9)] if shape.num_gpus else []
        fits += [math.floor(res.get("CPU", 0) / shape.num_cpus + 1e-9)] if shape.num_cpus else []
        total += min(fits) if fits else 1
    return total


class SlotActor:
    """Lives in a Ray worker process: builds the engine there and measures one replicate at a time."""

    def __init__(self, backend: str, knobs: dict[str, Any] | None, spec: WorkloadSpec, price: Price,
                 run_id: str, slot: int) -> None:
        self.engine = make_engine(backend, fake_knobs=FakeKnobs(**knobs) if knobs is not None else None)
        self.spec, self.price, self.run_id, self.slot = spec, price, run_id, slot
        self.environment: dict[str, Any] | None = None  # read once, at the first replicate

    def where(self) -> dict[str, Any]:
        import socket

        import ray

        ctx = ray.get_runtime_context()
        return {"slot": f"ray-{self.slot}", "node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address(),
                "host": socket.gethostname(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()], "pid": os.getpid(),
                "actor_id": ctx.get_actor_id()}

    def measure(self, flags: Mapping[str, Any], arm: str, position: int, context: Mapping[str, Any]
                ) -> dict[str, Any]:
        where = self.where()
        if self.environment is None:
            self.environment = self.engine.environment()
        return measure_replicate(self.engine, flags, self.spec, self.price, run_id=self.run_id, arm=arm,
                                 position=position, environment=self.environment,
                                 context={**context, "slot": where["slot"], "placement": where})


class RayPool:
    """The slots of a Ray cluster. `wait` returns finished replicates; a replicate whose actor died comes
    back as a failed record (with `infrastructure: true` when its node died), never as an exception."""

    def __init__(self, *, make_actor: Callable[[int], Any], shape: SlotShape,
                 header: Callable[[Job], dict[str, Any]], say: Callable[[str], None] = lambda _: None,
                 start_timeout_s: float = 300.0) -> None:
        import ray

        self._ray, self._make_actor, self.shape, self._header, self.say = ray, make_actor, shape, header, say
        self.start_timeout_s = start_timeout_s
        self.actors = {slot: make_actor(slot) for slot in range(shape.count)}
        self.placement: dict[int, dict[str, Any]] = {}
        self.pending: dict[Any, tuple[Job, int]] = {}
        self.replaced = 0
        refs = {self.actors[slot].where.remote(): slot for slot in self.actors}
        ready, not_ready = ray.wait(list(refs), num_returns=len(refs), timeout=start_timeout_s)
        for ref in ready:
            self.placement[refs[ref]] = ray.get(ref)
        if not_ready:
            self.close()
            raise ClusterError(f"only {len(ready)} of {shape.count} engine slots could be placed within "
                               f"{start_timeout_s:g}s (each needs {shape.num_gpus:g} GPU, {shape.num_cpus:g} CPU; "
                               f"the cluster has {ray.cluster_resources()}); lower ray.slots or ray.cpus_per_slot")

    @property
    def slots(self) -> list[int]:
        return sorted(self.actors)

    @property
    def size(self) -> int:
        return len(self.actors)

    def submit(self, job: Job) -> None:
        ref = self.actors[job.slot].measure.remote(dict(job.flags), job.arm, job.position, dict(job.context))
        self.pending[ref] = (job, job.slot)

    def wait(self) -> list[tuple[Job, dict[str, Any]]]:
        ray = self._ray
        ready, rest = ray.wait(list(self.pending), num_returns=1)
        if rest:  # take every other replicate that is done too
            more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
            ready += more
        done = []
        for ref in ready:
            job, slot = self.pending.pop(ref)
            try:
                record = ray.get(ref)
            except ray.exceptions.RayError as exc:  # the actor (or its node) died under the replicate
                record = self._lost(job, slot, exc)
            done.append((job, record))
        return done

    def _lost(self, job: Job, slot: int, exc: Exception) -> dict[str, Any]:
        """The actor under `job` died: say why in a record, then replace or retire the slot."""
        where = self.placement.get(slot, {})
        node_alive = self._node_alive(where.get("node_id"), exc)
        said = str(exc).strip().splitlines() or [type(exc).__name__]
        cause = next((line.strip() for line in said if "died because" in line or "killed" in line), said[0])
        header = {**self._header(job), "slot": f"ray-{slot}", "placement": where}
        if node_alive:
            record = failed_record(header, f"the engine's process died mid-replicate ({cause})", stage="run")
        else:
            node = f"{where.get('node_ip')} ({str(where.get('node_id'))[:8]})"
            record = failed_record(header, f"node {node} died under slot {slot} ({cause})", stage="run",
                                   infrastructure=True)
        with contextlib.suppress(Exception):
            self._ray.kill(self.actors.pop(slot), no_restart=True)
        self.placement.pop(slot, None)
        if (node_alive or len(self.actors) < hostable_slots(self._ray.nodes(), self.shape)) and self._place(slot):
            self.replaced += 1
            self.say(f"slot {slot}: actor replaced on node {self.placement[slot]['node_ip']} "
                     f"(gpus {self.placement[slot]['gpu_ids']})")
        else:
            self.say(f"slot {slot}: retired, the surviving nodes cannot host it ({len(self.actors)} slots left)")
        return record

    def _place(self, slot: int) -> bool:
        """A new actor for `slot`, waited for until placed (False, and none kept, if it cannot be)."""
        actor = self._make_actor(slot)
        ref = actor.where.remote()
        ready, _ = self._ray.wait([ref], timeout=self.start_timeout_s)
        if not ready:
            self._ray.kill(actor, no_restart=True)
            return False
        try:
            self.placement[slot] = self._ray.get(ref)
        except self._ray.exceptions.RayActorError:
            return False
        self.actors[slot] = actor
        return True

    def _node_alive(self, node_id: str | None, exc: Exception) -> bool:
        """Did the node under a dead actor survive? Ray says so in the error, or the GCS knows by then."""
        if "node has died" in str(exc) or "node died" in str(exc):
            return False
        return not any(n["NodeID"] == node_id and not n["Alive"] for n in self._ray.nodes())

    def close(self) -> None:
        for actor in self.actors.values():
            with contextlib.suppress(Exception):  # an actor already gone is what we want
                self._ray.kill(actor, no_restart=True)
        self.actors.clear()
        self.pending.clear()


# ---- joining or starting Ray -------------------------------------------------------------------------------
def connect(ray_conf: Mapping[str, Any], out: Path, say: Callable[[str], None]) -> Callable[[], None]:
    """Join `ray.address` (or RAY_ADDRESS, as under `ray job submit`), or start a private local Ray.
    Returns the function that disconnects (joined) or stops (private) it."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():
        return lambda: None  # the caller's own Ray (a library user, a test): theirs to stop
    address = ray_conf.get("address") or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=False, configure_logging=False, namespace="throttle_sweep")
        say(f"ray: joined the cluster at {address} ({ray.cluster_resources().get('GPU', 0):g} GPUs, "
            f"{ray.cluster_resources().get('CPU', 0):g} CPUs)")
        return ray.shutdown
    end_leftovers(out, say)
    temp = tempfile.mkdtemp(prefix="ts-ray-", dir="/tmp")  # short: Ray's socket paths must stay < 108 chars
    need_cpus = ray_conf["cpu_slots"] * ray_conf["cpus_per_slot"] if ray_conf.get("slots") is None \
        else ray_conf["slots"] * ray_conf["cpus_per_slot"]
    ray.init(address="local", num_cpus=max(os.cpu_count() or 1, math.ceil(need_cpus)), include_dashboard=False,
             _temp_dir=temp, _node_ip_address="127.0.0.1", log_to_driver=False, configure_logging=False,
             namespace="throttle_sweep")
    write_leftovers(out, temp)
    say(f"ray: started a private local Ray in {temp}")

    def stop() -> None:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
        (out / LEFTOVERS).unlink(missing_ok=True)

    return stop


def write_leftovers(out: Path, temp: str) -> None:
    """Note the private Ray's processes, so a run after a SIGKILL can end those still alive."""
    import psutil

    procs = [{"pid": p.pid, "create_time": p.create_time()} for p in psutil.Process().children(recursive=True)]
    out.mkdir(parents=True, exist_ok=True)
    (out / LEFTOVERS).write_text(json.dumps({"temp_dir": temp, "processes": procs}))


def end_leftovers(out: Path, say: Callable[[str], None]) -> int:
    """End the processes of a private Ray that a killed driver of this study left running."""
    import psutil

    path = out / LEFTOVERS
    if not path.exists():
        return 0
    info = json.loads(path.read_text())
    ended = 0
    for proc in info.get("processes", []):
        try:
            p = psutil.Process(proc["pid"])
            if abs(p.create_time() - proc["create_time"]) < 1e-3:  # the same process, not a reused pid
                p.kill()
                ended += 1
        except psutil.Error:
            pass
    shutil.rmtree(info.get("temp_dir", ""), ignore_errors=True)
    path.unlink()
    if ended:
        say(f"ray: ended {ended} processes left by an earlier run of this study that was killed")
    return ended


def make_ray_pool(cfg: DictConfig, engine: Any, spec: WorkloadSpec, price: Price, *, run_id: str, out: Path,
                  say: Callable[[str], None]) -> tuple[RayPool, Callable[[], None]]:
    import ray

    from throttle_sweep.settings import plain

    ray_conf = plain(cfg.ray)
    stop = connect(ray_conf, out, say)
    try:
        tensor_parallel = int((plain(cfg.engine) or {}).get("tensor_parallel_size") or 1)
        shape = slot_shape(ray_conf, ray.cluster_resources(), tensor_parallel)
        knobs = plain(cfg.fake) if cfg.backend == "fake" else None
        remote = ray.remote(num_cpus=shape.num_cpus, num_gpus=shape.num_gpus, max_restarts=0)(SlotActor)
        environment = engine.environment()

        def header(job: Job) -> dict[str, Any]:
            return record_header(engine, job.flags, spec, price, run_id=run_id, arm=job.arm, position=job.position,
                                 environment=environment, context=job.context)

        pool = RayPool(make_actor=lambda slot: remote.remote(cfg.backend, knobs, spec, price, run_id, slot),
                       shape=shape, header=header, say=say, start_timeout_s=ray_conf["start_timeout_s"])
    except BaseException:
        stop()
        raise
    say(f"ray: {shape.count} slots ({shape.why}): " + ", ".join(
        f"{slot}@{p['node_ip']}" + (f"/gpu{','.join(p['gpu_ids'])}" if p["gpu_ids"] else "")
        for slot, p in sorted(pool.placement.items())))

    def close() -> None:
        pool.close()
        stop()

    return pool, close
