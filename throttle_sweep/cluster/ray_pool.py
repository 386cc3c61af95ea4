"""Engine slots on Ray: one actor per slot, owning its GPU(s) (or CPU share) and the engine on it.

The driver keeps the study and the records (one writer); actors only measure and return records. A slot
whose actor dies is replaced. When the node under it died too, the replicate is marked as an
infrastructure loss (the candidate is not to blame) and the slot is retired if the surviving nodes cannot
host it. Joining or starting Ray, locked down, and ending what a killed driver left: ray_runtime.py.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from throttle_sweep.cluster.pool import HeldRecords, Job
from throttle_sweep.cluster.ray_runtime import ClusterError, connect
from throttle_sweep.cluster.slot import WarmSlot
from throttle_sweep.engines import Engine
from throttle_sweep.engines.flags import PARALLEL, flags_key
from throttle_sweep.measurement.cost import Price
from throttle_sweep.measurement.replicate import failed_record, now_iso, record_header
from throttle_sweep.measurement.workload import WorkloadSpec

MAX_REPLACEMENTS = 5  # a slot whose actor keeps dying (a broken node, an engine that cannot start) is retired


@dataclass(frozen=True)
class SlotShape:
    count: int
    num_gpus: float
    num_cpus: float
    why: str


def slot_shape(ray_conf: Mapping[str, Any], resources: Mapping[str, float], engine_gpus: int) -> SlotShape:
    """How many slots, and what each one holds: GPUs / the GPUs of one engine (`engine_world`) when the
    cluster has GPUs, else the configured CPU slots; `slots` overrides the count and `max_slots` caps it."""
    gpus = float(resources.get("GPU", 0))
    per_gpu = ray_conf.get("gpus_per_slot")
    if per_gpu is None:
        per_gpu = float(engine_gpus) if gpus > 0 else 0.0
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


def engine_world(starts: Sequence[tuple[str, Mapping[str, Any]]]) -> int:
    """How many GPUs a slot needs for the largest engine among `starts` (where each set of flags the sweep
    may start comes from, and the flags):
    the largest tensor x pipeline x data parallel size (a space may pair them), all on the slot's node.
    vLLM's multiprocess executor (its default on one node) runs them as children of the engine process, so
    they inherit the GPUs Ray gave the slot's actor. Its Ray executor would place its workers with Ray,
    outside the slot: refused."""
    for source, flags in starts:
        if flags.get("distributed_executor_backend") == "ray":
            raise ClusterError(f"{source}.distributed_executor_backend=ray: a slot's engine runs in a child process "
                               "of its Ray actor, which holds the slot's GPUs; vLLM's Ray executor would place its "
                               "workers outside them. Leave it unset (vLLM's multiprocess workers use the slot's GPUs)")
    world = 1
    for key in PARALLEL:
        world *= max((int(f.get(key) or 1) for _, f in starts), default=1)
    return world


def share_a_machine(placements: Mapping[int, Mapping[str, Any]], shape: SlotShape) -> bool:
    """Do these slots share one machine's cores and memory bus (CPU slots, all on one node)? Then a
    neighbour's load could follow a comparison's arms, and confirmations run alone, as local slots' do."""
    nodes = {p.get("node_id") for p in placements.values()} - {None}  # a slot not placed yet may share one
    return len(placements) > 1 and shape.num_gpus == 0 and len(nodes) <= 1


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
    """Lives in a Ray worker process and owns the slot's warm engines (slot.py), each in a child process on
    the same node and GPU: an engine that crashes fails its replicate, and the actor replaces it."""

    def __init__(self, engine: Engine, spec: WorkloadSpec, price: Price, run_id: str, slot: int,
                 warm: dict[str, Any], gpu_type: str | None = None) -> None:
        self.slot, self.gpu_type = slot, gpu_type
        if gpu_type is not None and hasattr(engine, "on_gpu_type"):  # the fake engine's pretend types
            engine = engine.on_gpu_type(gpu_type)
        self.engines = WarmSlot(engine, spec, price, run_id=run_id, name=f"ray-{slot}", **warm)
        self.engines.warm_up()  # the engine processes import vLLM while the other slots are placed

    def where(self) -> dict[str, Any]:

        import ray

        ctx = ray.get_runtime_context()
        return {"slot": f"ray-{self.slot}", "node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address(),
                "host": socket.gethostname(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()], "pid": os.getpid(),
                "actor_id": ctx.get_actor_id(), **({"gpu_type": self.gpu_type} if self.gpu_type else {})}

    def measure(self, flags: Mapping[str, Any], arm: str, position: int, context: Mapping[str, Any],
                workload: Mapping[str, Any] | None = None) -> dict[str, Any]:
        where = self.where()
        return self.engines.measure(flags, arm, position, {**context, "slot": where["slot"], "placement": where},
                                    workload=workload)


@dataclass
class Pending:
    """A replicate handed to a slot's actor: when, and by when it must answer."""

    job: Job
    slot: int
    ping: Any  # a no-op call queued on the actor just before the replicate: did the actor live to take it?
    submitted: float  # time.monotonic()
    submitted_at: str  # wall clock, for the record
    deadline: float


class RayPool(HeldRecords):
    """The slots of a Ray cluster. `wait` returns finished replicates; a replicate whose actor died, or that
    did not answer by its deadline, comes back as a failed record (with `infrastructure: true` when the slot,
    not the flags, is to blame), never as an exception and never as a hang.

    A replicate's deadline follows from what the same flags took before in this run (`job_timeout_factor`
    times it, at least a minute), or `job_timeout_s` for flags not yet seen. A slot whose actor is lost gets
    a new actor without waiting for it to be placed: its next replicate waits for it under the same deadline,
    so no slot ever blocks the others."""

    def __init__(self, *, make_actor: Callable[[int], Any], shape: SlotShape,
                 header: Callable[[Job, Mapping[str, Any]], dict[str, Any]],
                 say: Callable[[str], None] = lambda _: None,
                 start_timeout_s: float = 300.0, job_timeout_s: float = 1800.0, job_timeout_factor: float = 10.0,
                 can_host: Callable[[int, list[dict[str, Any]]], bool] | None = None) -> None:
        """`can_host(slot, nodes)`: can the nodes alive host this slot again (slots that differ: one per GPU
        type); default, whether they hold one more slot of the shape."""
        import ray

        super().__init__()
        self._ray, self._make_actor, self.shape, self._header, self.say = ray, make_actor, shape, header, say
        self.job_timeout_s, self.job_timeout_factor, self._can_host = job_timeout_s, job_timeout_factor, can_host
        self.actors = {slot: make_actor(slot) for slot in range(shape.count)}
        self.placement: dict[int, dict[str, Any]] = {}
        # what each slot's records said of its machine: a lost replicate's record says the same, and the driver
        # never imports the engine's code to find out (vLLM: seconds, and a GB of memory)
        self.environments: dict[int, dict[str, Any]] = {}
        self.pending: dict[Any, Pending] = {}
        self.took: dict[str, float] = {}  # flags -> the longest replicate (start + work) seen with them
        self.replaced = 0
        self.replacements: dict[int, int] = {}
        refs = {self.actors[slot].where.remote(): slot for slot in self.actors}
        ready, not_ready = ray.wait(list(refs), num_returns=len(refs), timeout=start_timeout_s)
        for ref in ready:
            self.placement[refs[ref]] = ray.get(ref)
        self.nodes = {slot: p.get("node_id") for slot, p in self.placement.items()}  # kept across replacements
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

    @property
    def shares_machine(self) -> bool:
        # a slot whose actor is being replaced keeps the node it was last seen on
        return share_a_machine({slot: {"node_id": self.nodes.get(slot)} for slot in self.actors}, self.shape)

    def timeout_for(self, job: Job) -> float:
        """A replicate's deadline; a run at an arrival rate also gets its arrivals' span (requests / rate), and
        takes its history from runs of the same flags on the same slot at the same rate only."""
        took = self.took.get(took_key(job))
        wl = job.workload or {}
        span = wl["num_requests"] / wl["rate"] if wl.get("rate") and wl.get("num_requests") else 0.0
        return span + (self.job_timeout_s if took is None else max(60.0, self.job_timeout_factor * took))

    def submit(self, job: Job) -> None:
        actor = self.actors[job.slot]
        ping = actor.where.remote()  # an actor runs its calls in order: this one answers before the replicate
        ref = actor.measure.remote(dict(job.flags), job.arm, job.position, dict(job.context),
                                   **({"workload": dict(job.workload)} if job.workload else {}))
        now = time.monotonic()
        self.pending[ref] = Pending(job, job.slot, ping, now, now_iso(), now + self.timeout_for(job))

    def wait(self) -> list[tuple[Job, dict[str, Any]]]:
        ray = self._ray
        while True:
            timeout = max(0.0, min(p.deadline for p in self.pending.values()) - time.monotonic())
            # short slices: between them Python runs its signal handlers (Ctrl-C, SIGTERM), which a long
            # ray.wait with a timeout would hold back until it returns
            ready, rest = ray.wait(list(self.pending), num_returns=1, timeout=min(timeout, 0.5))
            if ready:
                break
            expired = [ref for ref, p in self.pending.items() if p.deadline <= time.monotonic()]
            if expired:
                before = len(self._held)
                for ref in expired:
                    self._held.append(self._expired(ref))
                return self._held[before:]
        if rest:  # take every other replicate that is done too
            more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
            ready += more
        before = len(self._held)
        for ref in ready:
            pending = self.pending[ref]
            try:
                record = ray.get(ref)
            except ray.exceptions.RayError as exc:  # the actor (or its node) died under the replicate
                self.pending.pop(ref)
                record = self._lost(pending, exc)
            else:
                self.placement[pending.slot] = record.get("placement") or self.placement.get(pending.slot, {})
                self.nodes[pending.slot] = self.placement[pending.slot].get("node_id") or self.nodes.get(pending.slot)
                if record.get("environment"):
                    self.environments[pending.slot] = record["environment"]
                key = took_key(pending.job)
                took = sum(record.get(k) or 0 for k in ("engine_start_s", "engine_warmup_s", "wall_s"))
                self.took[key] = max(self.took.get(key, 0.0), took)
            self._held.append((pending.job, record))  # held before it leaves `pending`: a Ctrl-C loses neither
            self.pending.pop(ref, None)
        return self._held[before:]

    def drain(self) -> list[dict[str, Any]]:
        """The records of replicates that are done and not yet written by the driver: returned by `wait` but
        not `written`, or finished on an actor and not yet collected (a sweep stopping mid-batch writes them).
        A replicate whose actor died meanwhile is not waited for."""
        if self._ray.is_initialized():  # (after ray.shutdown a Ray call would start a new Ray)
            self._collect_finished()
        return self._take_held()

    def _collect_finished(self) -> None:
        """Hold what the actors have finished and `wait` has not collected, without waiting for the rest."""
        if not self.pending:
            return
        ready, _ = self._ray.wait(list(self.pending), num_returns=len(self.pending), timeout=0)
        held = {id(job) for job, _ in self._held}
        for ref in ready:
            pending = self.pending.pop(ref)
            if id(pending.job) in held:  # (held by a `wait` that a Ctrl-C cut before it let go of `pending`)
                continue
            with contextlib.suppress(Exception):  # a lost actor's replicate measured nothing to keep
                self._held.append((pending.job, self._ray.get(ref, timeout=5)))

    def _expired(self, ref: Any) -> tuple[Job, dict[str, Any]]:
        pending = self.pending.pop(ref)
        waited = time.monotonic() - pending.submitted
        where = self.placement.get(pending.slot, {})
        why = (f"no answer from slot {pending.slot} within {waited:.0f}s (the engine hung, or its node "
               f"{where.get('node_ip', '?')} cannot be reached); its actor was ended")
        record = failed_record(self._lost_header(pending), why, failed_at="run", infrastructure=True)
        placed, _ = self._ray.wait([pending.ping], timeout=0)
        if not placed:  # the actor never answered the ping: it cannot be placed or started
            self._end_actor(pending.slot)
            self.say(f"slot {pending.slot}: retired, its actor never started ({len(self.actors)} slots left)")
        else:  # the actor took the replicate and the engine hung under it
            self._replace(pending.slot, node_alive=True)
        return pending.job, record

    def _lost_header(self, pending: Pending) -> dict[str, Any]:
        header = {**self._header(pending.job, self.environments.get(pending.slot, {})), "slot": f"ray-{pending.slot}",
                  "placement": self.placement.get(pending.slot, {})}
        header["started_at"] = pending.submitted_at  # the driver handed it over then; the slot kept nothing
        return header

    def _lost(self, pending: Pending, exc: Exception) -> dict[str, Any]:
        """The actor under a replicate died: say why in a record, then replace or retire the slot. It is always
        the slot's loss (infrastructure): the actor runs no engine itself (its engine processes are its
        children, and an engine that dies there comes back as the flags' failed record), so the actor's own
        death is something else's doing: a kill, its node, Ray's memory monitor."""
        slot, where = pending.slot, self.placement.get(pending.slot, {})
        node_alive = self._node_alive(where.get("node_id"), exc)
        said = str(exc).strip().splitlines() or [type(exc).__name__]
        cause = next((line.strip() for line in said if "died because" in line or "killed" in line), said[0])
        header = self._lost_header(pending)
        if not node_alive:
            node = f"{where.get('node_ip')} ({str(where.get('node_id'))[:8]})"
            record = failed_record(header, f"node {node} died under slot {slot} ({cause})", failed_at="run",
                                   infrastructure=True)
        elif isinstance(exc, self._ray.exceptions.OutOfMemoryError) or "memory monitor" in str(exc):
            record = failed_record(header, f"Ray's memory monitor killed slot {slot}'s actor process, which may "
                                   f"not be this replicate's doing ({cause})", failed_at="run", infrastructure=True)
        elif self._died_idle(pending):
            record = failed_record(header, f"slot {slot}'s actor process was already dead when this replicate "
                                   f"was handed to it ({cause})", failed_at="run", infrastructure=True)
        else:
            record = failed_record(header, f"slot {slot}'s actor process died mid-replicate ({cause}); it runs no "
                                   "engine itself, so this is the slot's loss, not the flags'", failed_at="run",
                                   infrastructure=True)
        self._replace(slot, node_alive=node_alive)
        return record

    def _died_idle(self, pending: Pending) -> bool:
        """Was the actor dead before the replicate reached it? Ray's error reads the same either way, so the
        ping queued just before the replicate tells: it failed too only if the actor died before it."""
        try:
            self._ray.get(pending.ping, timeout=5)
        except Exception:  # noqa: BLE001 - any failure of the ping means the actor never took the replicate
            return True
        return False

    def _end_actor(self, slot: int) -> None:
        with contextlib.suppress(Exception):  # an actor already gone is what we want
            self._ray.kill(self.actors.pop(slot), no_restart=True)
        self.placement.pop(slot, None)

    def _replace(self, slot: int, *, node_alive: bool) -> None:
        """End the slot's actor and start a new one (not waited for), or retire the slot when the surviving
        nodes cannot host it."""
        self._end_actor(slot)
        self.nodes[slot] = None  # a new actor may land anywhere: unknown until it says
        self.replacements[slot] = self.replacements.get(slot, 0) + 1
        if self.replacements[slot] > MAX_REPLACEMENTS:
            self.say(f"slot {slot}: retired after {MAX_REPLACEMENTS} new actors ({len(self.actors)} slots left)")
        elif node_alive or (self._can_host(slot, self._ray.nodes()) if self._can_host else
                            len(self.actors) < hostable_slots(self._ray.nodes(), self.shape)):
            self.actors[slot] = self._make_actor(slot)
            self.replaced += 1
            self.say(f"slot {slot}: a new actor is starting")
        else:
            self.say(f"slot {slot}: retired, the surviving nodes cannot host it ({len(self.actors)} slots left)")

    def _node_alive(self, node_id: str | None, exc: Exception) -> bool:
        """Did the node under a dead actor survive? Ray says so in the error, or the GCS knows by then."""
        if "node has died" in str(exc) or "node died" in str(exc):
            return False
        return not any(n["NodeID"] == node_id and not n["Alive"] for n in self._ray.nodes())

    def close(self) -> None:
        """End every actor. What they finished first stays for `drain` (a stopping run writes it)."""
        self._collect_finished()
        for actor in self.actors.values():
            with contextlib.suppress(Exception):  # an actor already gone is what we want
                self._ray.kill(actor, no_restart=True)
        self.actors.clear()
        self.pending.clear()



def took_key(job: Job) -> str:
    """Whose history sets a replicate's deadline: its flags; a run at an arrival rate, also its slot and rate."""
    if not job.workload:
        return flags_key(job.flags)
    return f"{job.slot}|{flags_key(job.flags)}|{job.workload.get('rate')}"


def make_ray_pool(ray_conf: Mapping[str, Any], engine: Engine, spec: WorkloadSpec, price: Price, *,
                  engine_flags: Mapping[str, Any], warm: Mapping[str, Any], run_id: str, out: Path,
                  say: Callable[[str], None], starts: Sequence[tuple[str, Mapping[str, Any]]] = ()
                  ) -> tuple[RayPool, Callable[[], None]]:
    """`ray_conf`: the ray config group; `engine_flags`: the engine group; `warm`: how a slot keeps its
    engines warm (settings.sections.warm_engines_from). `starts`: the flags the sweep may start an engine with
    (the baseline, the space's extremes): a slot holds the GPUs of the largest of them."""
    import ray

    world = engine_world([("engine", dict(engine_flags)), *starts])  # checked before Ray starts
    stop = connect(ray_conf, out, say)
    try:
        shape = slot_shape(ray_conf, ray.cluster_resources(), world)
        remote = ray.remote(num_cpus=shape.num_cpus, num_gpus=shape.num_gpus, max_restarts=0)(SlotActor)

        def header(job: Job, environment: Mapping[str, Any]) -> dict[str, Any]:
            return record_header(engine, job.flags, spec, price, run_id=run_id, arm=job.arm, position=job.position,
                                 environment=environment or {"engine": engine.name}, context=job.context)

        pool = RayPool(make_actor=lambda slot: remote.remote(engine, spec, price, run_id, slot, warm),
                       shape=shape, header=header, say=say, start_timeout_s=ray_conf["start_timeout_s"],
                       job_timeout_s=ray_conf["job_timeout_s"], job_timeout_factor=ray_conf["job_timeout_factor"])
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
