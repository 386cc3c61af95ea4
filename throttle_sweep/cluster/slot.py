"""A slot's engines, kept warm: one process per engine (cluster/host.py), reused while the same flags come
back, so a comparison's interleaved order alternates between live engines instead of restarting vLLM for
every replicate. The baseline's engine stays up across comparisons; the least recently used engine makes
way for new flags.

The restart policy (`compare.restart`) says when an engine lifetime ends even though the flags are the same:
`never`, `per_replicate` (a new engine for every replicate, started in a process that stays up, so vLLM is
imported once), or `every_k` (after `compare.restart_every` replicates). Engine instances differ in speed
(benchmarks/warm_engines.py measured it on the real engine), so with `never` a comparison's two arms differ
by their engines as well as by their flags; `per_replicate` makes that difference part of the noise the
interval sees."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from throttle_sweep.cluster.host import ENGINE_WARMUPS, EngineHost, EngineProcessDied, Task, lifetime_key
from throttle_sweep.engines.base import Engine
from throttle_sweep.engines.flags import flags_key
from throttle_sweep.errors import ConfigError, refused_for_memory
from throttle_sweep.measurement.cost import Price
from throttle_sweep.measurement.replicate import failed_record, record_header
from throttle_sweep.measurement.workload import WorkloadSpec
from throttle_sweep.store.records import is_ok

RESTART_POLICIES = ("never", "per_replicate", "every_k")
SIZED_BY = ("kv_cache_memory_bytes", "num_gpu_blocks_override")  # flags that size the KV cache whatever else runs


def check_restart(policy: str, every: int | None, warmup: str = "first") -> None:
    if policy not in RESTART_POLICIES:
        raise ConfigError(f"compare.restart must be one of {', '.join(RESTART_POLICIES)}, but got {policy!r}")
    if warmup not in ENGINE_WARMUPS:
        raise ConfigError(f"compare.engine_warmup must be one of {', '.join(ENGINE_WARMUPS)}, but got {warmup!r}")
    if policy == "every_k" and (not isinstance(every, int) or every < 1):
        raise ConfigError(f"compare.restart=every_k needs compare.restart_every >= 1, but got {every!r}")


class WarmSlot:
    """Measures replicates on warm engines, each in its own process. `measure` has the signature the pools
    expect; `close` ends every engine process."""

    make_host: Callable[..., EngineHost] = EngineHost  # (the fast tests measure the fake engine in-thread)

    def __init__(self, engine: Engine, spec: WorkloadSpec, price: Price, *, run_id: str,
                 environment: Mapping[str, Any] | None = None, restart: str = "per_replicate",
                 restart_every: int | None = None,
                 engines: int = 2, engine_warmup: str = "first", name: str = "local-0") -> None:
        check_restart(restart, restart_every, engine_warmup)
        if engines < 1:
            raise ConfigError(f"compare.engines_per_slot must be >= 1, but got {engines}")
        self.engine, self.spec, self.price, self.run_id = engine, spec, price, run_id
        self.environment = dict(environment) if environment is not None else None
        self.restart, self.restart_every, self.engines = restart, restart_every, engines
        self.engine_warmup, self.name = engine_warmup, name
        self.hosts: list[EngineHost] = []
        self.closed = False  # closed by the driver's thread: a replicate still asked for gets no new engine
        self._hosts_lock = threading.Lock()  # the slot's thread picks a host while the driver's thread may close
        self.runs = 0  # replicates handed out by this slot: the machine's drift clock on the fake engine
        self.kv_pins: dict[str, dict[str, Any]] = {}  # flags -> what gives them their KV capacity alone (GPU)
        self.pins_fit = True  # False once a start did not fit beside sleeping engines: then made alone
        self.started = 0

    def warm_up(self) -> None:
        """Start the engine processes now (they import vLLM while the driver does other work). With a new
        engine for every replicate, one process serves both arms."""
        while len(self.hosts) < (1 if self.restart == "per_replicate" else self.engines):
            self.hosts.append(self._new_host())

    def measure(self, flags: Mapping[str, Any], arm: str, position: int, context: Mapping[str, Any], *,
                workload: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """One replicate; `workload`: fields of the workload this run changes (mode=capacity: the rate)."""
        spec = replace(self.spec, **workload) if workload else self.spec
        with self._hosts_lock:
            host = None if self.closed else self._host_for(arm, flags)
        if host is None:  # shutting down (Ctrl-C): no engine process is started for it
            header = record_header(self.engine, flags, spec, self.price, run_id=self.run_id, arm=arm,
                                   position=position, environment=self.environment or {"engine": self.engine.name},
                                   context=context)
            return failed_record(header, "the slot was shut down", failed_at="start", infrastructure=True)
        try:
            host.wait_ready()
        except EngineProcessDied as exc:  # it never got to these flags: the slot's failure, not theirs
            # what is known of the machine, never read here: the driver does not import the engine's code
            known = self.environment or {"engine": self.engine.name}
            header = record_header(self.engine, flags, spec, self.price, run_id=self.run_id, arm=arm,
                                   position=position, environment=known, context=context)
            return {**self._lost(host, header, exc), "infrastructure": True}
        if self.environment is None:  # read where the engine runs (a Ray actor need not import vLLM itself)
            self.environment = host.environment
        header = record_header(self.engine, flags, spec, self.price, run_id=self.run_id, arm=arm,
                               position=position, environment=self.environment, context=context)
        same = host.key == lifetime_key(arm, flags)
        pin, alone = self._kv_pin(flags, starts=not same) if self.sleeps else (None, False)
        record = self._measure_on(host, flags, arm, dict(header), context, same=same, pin=pin, alone=alone,
                                  workload=workload)
        refused = record["status"] == "failed" and record.get("failed_at") == "start" \
            and not record.get("infrastructure") and not self.closed and host in self.hosts
        if refused and self.sleeps and not alone and (pin is not None or refused_for_memory(record.get("reason"))):
            # no room beside the sleeping engines (the pinned capacity did not fit, or vLLM found less free
            # memory than gpu_memory_utilization asks): the GPU's doing, not the flags'. Once more with the GPU
            # to itself; on this slot, starts beside sleepers are made alone from now on
            self.pins_fit = False
            why = record.get("reason")
            record = self._measure_on(host, flags, arm, dict(header), context, same=False, pin=pin, alone=True,
                                      workload=workload)
            record["kv_pin"]["refused_beside_sleepers"] = why
            refused = record["status"] == "failed" and record.get("failed_at") == "start" \
                and not record.get("infrastructure") and not self.closed
        if refused and refused_for_memory(record.get("reason")):
            record["infrastructure"] = True  # alone, yet short of memory: something outside the slot holds it
        if self.closed and record["status"] == "failed":  # cut short by the slot's own shutdown
            record["infrastructure"] = True
        return record

    def _measure_on(self, host: EngineHost, flags: Mapping[str, Any], arm: str, header: dict[str, Any],
                    context: Mapping[str, Any], *, same: bool, pin: dict[str, Any] | None, alone: bool,
                    workload: Mapping[str, Any] | None = None) -> dict[str, Any]:
        if self.sleeps:  # the engine starts with sleep mode on; the record keeps the arm's flags
            header["engine_flags"] = self.engine.engine_flags({**flags, **(pin or {}), "enable_sleep_mode": True})
            if pin is not None or alone:
                header["kv_pin"] = {"solo": alone, **({"flags": pin} if pin else {})}
            for other in [h for h in self.hosts if h is not host and (h.key if alone else h.awake)]:
                try:  # its engine makes room on the GPU: asleep (it wakes for its next replicate), or shut down
                    other.release() if alone else other.sleep()
                except EngineProcessDied:
                    if other in self.hosts:
                        self.hosts.remove(other)
                    other.close(grace_s=1.0)
        runs = (host.runs if same else 0) + 1  # on this engine, with this replicate
        # an engine that will not be used again is shut down at once: it holds no memory while idle
        keep = self.restart == "never" or (self.restart == "every_k" and runs < self.restart_every)
        # a probe is one run that only counts preemptions (deterministic): it needs no warm engine, and it
        # warms the engine for a comparison that may follow on the same flags
        warmup = self.engine_warmup if context.get("stage") != "probe" else "none"
        task = Task(flags, header, self.runs, warmup, arm, keep=keep, sleep_mode=self.sleeps, pin=pin,
                    workload=workload)
        self.runs += 1
        try:
            record = host.measure(task)
        except EngineProcessDied as exc:
            return self._lost(host, header, exc)
        if alone and pin is None and is_ok(record) and (got := record["engine_lifetime"].get("kv_pin")):
            self.kv_pins[flags_key(flags)] = got
        return record

    def _kv_pin(self, flags: Mapping[str, Any], *, starts: bool) -> tuple[dict[str, Any] | None, bool]:
        """For an engine about to start on a GPU that other engines share asleep: the flags that give it the
        KV capacity these flags had alone, and whether this start must itself be alone to find it out. An
        engine asleep still holds some memory (its CUDA context, graph pools), which a new engine's memory
        profile may count against its KV cache; a start with a pin gets the same capacity beside it."""
        if not starts:  # a live engine
            return None, False
        if any(flags.get(k) for k in SIZED_BY):  # the user sized the KV cache: no pin, alone once none fits
            return None, not self.pins_fit
        pin = self.kv_pins.get(flags_key(flags))
        # alone with no pin yet, to find it out; with one, beside the sleeping engines unless pins do not fit
        return (dict(pin), not self.pins_fit) if pin is not None else (None, True)

    def _lost(self, host: EngineHost, header: dict[str, Any], exc: EngineProcessDied) -> dict[str, Any]:
        """The engine's process died: the replicate fails, and the next one gets a new process."""
        if host in self.hosts:  # (the driver's thread may have closed the slot meanwhile)
            self.hosts.remove(host)
        host.close(grace_s=1.0)
        # a replicate cut short by the slot's own shutdown says nothing of the flags
        extra = {"infrastructure": True} if self.closed else {}
        return failed_record(header, str(exc), failed_at="run", engine_process=host.pid, **extra)

    @property
    def sleeps(self) -> bool:
        """On a GPU two engines cannot both hold the memory: the idle one sleeps (vLLM's sleep mode)."""
        return (self.engines > 1 and self.restart != "per_replicate"  # a single engine at a time needs no sleep
                and (self.environment or {}).get("device") in ("cuda", "fake-gpu"))

    def _host_for(self, arm: str, flags: Mapping[str, Any]) -> EngineHost:
        """The process whose live engine serves this arm with these flags; else an idle process, a new one
        while there is room, or the least recently used one (its engine makes way). The arm is part of the
        key, so that the two arms of a comparison always run on two engines, even with the same flags (A/A)."""
        for dead in [h for h in self.hosts if not h.alive]:
            self.hosts.remove(dead)
            dead.close(grace_s=0.1)
        key = lifetime_key(arm, flags)
        for host in self.hosts:
            if host.key == key:
                return host
        idle = [h for h in self.hosts if h.key is None]
        if idle:
            return idle[0]
        if len(self.hosts) < self.engines:
            self.hosts.append(self._new_host())
            return self.hosts[-1]
        return min(self.hosts, key=lambda h: h.used_at)

    def _new_host(self) -> EngineHost:
        self.started += 1
        return self.make_host(self.engine, self.spec, self.price, name=f"{self.name}.{self.started}")

    def close(self) -> None:
        with self._hosts_lock:
            self.closed = True
            hosts, self.hosts = list(self.hosts), []
        for host in hosts:
            host.close()
