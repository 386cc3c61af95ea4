"""A slot's engines, kept warm: one process per engine (engines/host.py), reused while the same flags come
back, so a comparison's interleaved order alternates between live engines instead of restarting vLLM for
every replicate. The baseline's engine stays up across comparisons; the least recently used engine makes
way for new flags.

The restart policy (`compare.restart`) says when an engine lifetime ends even though the flags are the same:
`never`, `per_replicate` (a fresh engine every time, as before warm engines), or `every_k` (after
`compare.restart_every` replicates), so the variance between lifetimes can be sampled when it matters."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from throttle_sweep.cost import Price
from throttle_sweep.engines.base import Engine
from throttle_sweep.engines.flags import flags_key
from throttle_sweep.engines.host import EngineHost, EngineProcessDied, Task
from throttle_sweep.errors import ConfigError
from throttle_sweep.measure import failed_record, record_header
from throttle_sweep.workload import WorkloadSpec

RESTART_POLICIES = ("never", "per_replicate", "every_k")


def check_restart(policy: str, every: int | None) -> None:
    if policy not in RESTART_POLICIES:
        raise ConfigError(f"compare.restart must be one of {', '.join(RESTART_POLICIES)}, but got {policy!r}")
    if policy == "every_k" and (not isinstance(every, int) or every < 1):
        raise ConfigError(f"compare.restart=every_k needs compare.restart_every >= 1, but got {every!r}")


class WarmSlot:
    """Measures replicates on warm engines, each in its own process. `measure` has the signature the pools
    expect; `close` ends every engine process."""

    def __init__(self, engine: Engine, spec: WorkloadSpec, price: Price, *, run_id: str,
                 environment: Mapping[str, Any] | None = None, restart: str = "never", restart_every: int | None = None,
                 engines: int = 2, lifetime_warmup: bool = True, name: str = "local-0") -> None:
        check_restart(restart, restart_every)
        if engines < 1:
            raise ConfigError(f"compare.engines_per_slot must be >= 1, but got {engines}")
        self.engine, self.spec, self.price, self.run_id = engine, spec, price, run_id
        self.environment = dict(environment) if environment is not None else None
        self.restart, self.restart_every, self.engines = restart, restart_every, engines
        self.lifetime_warmup, self.name = lifetime_warmup, name
        self.hosts: list[EngineHost] = []
        self.runs = 0  # replicates handed out by this slot: the machine's drift clock on the fake engine
        self.started = 0

    def warm_up(self) -> None:
        """Start the engine processes now (they import vLLM while the driver does other work)."""
        while len(self.hosts) < self.engines:
            self.hosts.append(self._new_host())

    def measure(self, flags: Mapping[str, Any], arm: str, position: int, context: Mapping[str, Any]
                ) -> dict[str, Any]:
        header = record_header(self.engine, flags, self.spec, self.price, run_id=self.run_id, arm=arm,
                               position=position, environment=self._environment(), context=context)
        host = self._host_for(flags)
        fresh = self.restart == "per_replicate" or (self.restart == "every_k" and host.runs >= self.restart_every)
        task = Task(flags, header, fresh, self.runs, self.lifetime_warmup)
        self.runs += 1
        try:
            return host.measure(task)
        except EngineProcessDied as exc:
            self.hosts.remove(host)
            host.close(grace_s=1.0)
            return failed_record(header, str(exc), stage="run", engine_process=host.pid)

    def _host_for(self, flags: Mapping[str, Any]) -> EngineHost:
        """The process whose live engine has these flags; else an idle process, a new one while there is
        room, or the least recently used one (its engine makes way)."""
        for dead in [h for h in self.hosts if not h.alive]:
            self.hosts.remove(dead)
            dead.close(grace_s=0.1)
        key = flags_key(flags)
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
        return EngineHost(self.engine, self.spec, self.price, name=f"{self.name}.{self.started}")

    def _environment(self) -> dict[str, Any]:
        if self.environment is None:
            self.environment = self.engine.environment()
        return self.environment

    def close(self) -> None:
        for host in self.hosts:
            host.close()
        self.hosts.clear()
