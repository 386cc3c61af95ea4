"""An engine host in the caller's thread: EngineHost's interface, with no process between the driver and
the engine. No isolation (a crash here is the driver's) and no start-up cost: for engines that cannot crash
the driver, such as the fake engine in the fast test tier (tests/unit/conftest.py). Every real engine runs in
an EngineHost, and tests/process/test_host_contract.py holds the two to the same records."""

from __future__ import annotations

import copy
import os
import time
from typing import Any

from throttle_sweep.cluster.host import (
    EngineProcessDied,
    Lifetime,
    StartCount,
    Task,
    close_quietly,
    lifetime_key,
    put_to_sleep,
    run_task,
)
from throttle_sweep.engines.base import Engine
from throttle_sweep.measurement.cost import Price
from throttle_sweep.measurement.workload import WorkloadSpec


class InThreadHost:
    """Measures in the caller's thread what an engine process would measure (see the module's docstring)."""

    def __init__(self, engine: Engine, spec: WorkloadSpec, price: Price, *, name: str) -> None:
        self.engine = copy.deepcopy(engine)  # as the process gets its own pickled copy
        self.spec, self.price, self.name = spec, price, name
        self.pid = os.getpid()
        self.key: str | None = None
        self.runs = 0
        self.used_at = 0.0
        self.awake = False
        self.environment: dict[str, Any] = {}
        self._life: Lifetime | None = None
        self._starts = StartCount()
        self._ready = False
        self._closed = False

    @property
    def alive(self) -> bool:
        return not self._closed

    def wait_ready(self, timeout: float | None = None) -> None:
        if self._closed:
            raise EngineProcessDied(f"engine host {self.name} was shut down")
        if not self._ready:
            if hasattr(self.engine, "preload"):
                self.engine.preload()
            self.environment = self.engine.environment()
            self._ready = True

    def measure(self, task: Task) -> dict[str, Any]:
        self.wait_ready()
        self.used_at = time.monotonic()
        self._life = run_task(self.engine, self.spec, self.price, task, self._life, self._starts)
        record = task.record
        if record.get("engine_lifetime", {}).get("live"):
            self.key, self.runs = lifetime_key(task.arm, task.flags), record["engine_lifetime"]["replicate"] + 1
        else:
            self.key, self.runs = None, 0
        self.awake = self.key is not None
        return record

    def sleep(self) -> float | None:
        try:
            slept = put_to_sleep(self._life)
        except Exception:  # noqa: BLE001 - as in the process: an engine that cannot sleep is shut down
            if self._life is not None:
                close_quietly(self._life, {})
            self._life, slept = None, None
        self.awake = False
        if slept is None:
            self.key, self.runs = None, 0
        return slept

    def release(self) -> None:
        if self._life is not None:
            close_quietly(self._life, {})
        self._life = None
        self.key, self.runs, self.awake = None, 0, False

    def close(self, grace_s: float = 5.0) -> None:
        self.release()
        self._closed = True

