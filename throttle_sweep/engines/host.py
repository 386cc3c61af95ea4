"""A warm engine: one child process that owns one engine at a time and measures replicate after replicate
on it, so vLLM starts once per lifetime instead of once per replicate, and a crash (a segfault, an
out-of-memory kill) takes down this process, never the driver.

The child imports vLLM once (about 15 s on a small CPU); later engines in the same process start as fast as
in the driver (about 1.6 s here). A lifetime ends when the flags change, the restart policy says so, or a
replicate fails (the engine's state is then unknown). The child ends itself when its parent goes, however
the parent went (SIGKILL included): it watches its parent's pid."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from throttle_sweep.cost import Price
from throttle_sweep.engines.base import Engine, EngineSession
from throttle_sweep.engines.flags import flags_key
from throttle_sweep.errors import EngineStartError
from throttle_sweep.workload import WorkloadSpec

PARENT_POLL_S = 0.2  # how soon an orphaned engine process notices and ends itself


@dataclass(frozen=True)
class Task:
    """What the parent asks of its engine process for one replicate."""

    flags: Mapping[str, Any]
    record: dict[str, Any]  # the record's header, filled in by the child
    fresh: bool  # start a new lifetime even if the flags are the same
    run_index: int  # the slot's replicate count (the fake engine's drift follows it)
    lifetime_warmup: bool  # a new lifetime runs the workload once, unmeasured, before the first replicate


class EngineProcessDied(Exception):
    pass


class EngineHost:
    """The parent's handle on one engine process."""

    def __init__(self, engine: Engine, spec: WorkloadSpec, price: Price, *, name: str) -> None:
        ctx = multiprocessing.get_context("spawn")  # a clean process: no copies of the driver's threads or locks
        self.name = name
        self._conn, child = ctx.Pipe()
        self.process = ctx.Process(target=serve, args=(child, engine, spec, price, os.getpid()), daemon=True,
                                   name=f"throttle-sweep-engine-{name}")
        self.process.start()
        child.close()
        self.pid = self.process.pid
        self.key: str | None = None  # the flags of the live engine, if any
        self.runs = 0  # replicates on the live engine
        self.used_at = 0.0
        self._ready = False

    @property
    def alive(self) -> bool:
        return self.process.is_alive()

    def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until the process has imported the engine's code (raises EngineProcessDied if it could not)."""
        if self._ready:
            return
        if not self._conn.poll(timeout):
            raise EngineProcessDied(f"engine process {self.name} was not ready within {timeout:g}s")
        self._receive()
        self._ready = True

    def measure(self, task: Task) -> dict[str, Any]:
        """Run one replicate in the process. Raises EngineProcessDied if the process is gone."""
        self.wait_ready()
        self.used_at = time.monotonic()
        try:
            self._conn.send(task)
        except (BrokenPipeError, OSError) as exc:
            raise EngineProcessDied(self._death(f"{type(exc).__name__}")) from exc
        record = self._receive()
        if record.get("engine_lifetime", {}).get("live"):
            self.key, self.runs = flags_key(task.flags), record["engine_lifetime"]["replicate"] + 1
        else:  # the lifetime ended with this replicate (a failure): the next one starts a new engine
            self.key, self.runs = None, 0
        return record

    def _receive(self) -> Any:
        try:
            kind, payload = self._conn.recv()
        except (EOFError, OSError) as exc:
            raise EngineProcessDied(self._death("no answer")) from exc
        if kind == "error":
            raise EngineProcessDied(f"engine process {self.name} could not start: {payload}")
        return payload

    def _death(self, what: str) -> str:
        self.process.join(5)
        code = self.process.exitcode
        if code is not None and code < 0:
            how = f"killed by {signal.Signals(-code).name}"
        else:
            how = f"exit code {code}" if code is not None else "still running but not answering"
        self.key = None
        return f"the engine process (pid {self.pid}) died ({how}; {what})"

    def close(self, grace_s: float = 5.0) -> None:
        """Shut the engine down and end the process: politely, then SIGTERM, then SIGKILL."""
        with contextlib.suppress(Exception):
            self._conn.send(None)
        self.process.join(grace_s)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(grace_s)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self._conn.close()
        self.key = None


# ---- the child's side ----

@dataclass
class Lifetime:
    session: EngineSession
    key: str
    id: str
    start_s: float
    warmup_s: float = 0.0
    runs: int = 0


def serve(conn: Any, engine: Engine, spec: WorkloadSpec, price: Price, parent_pid: int) -> None:
    """The engine process's loop: one replicate per task until told to stop or orphaned."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the driver's to handle, not ours
    end_with_parent(parent_pid)
    try:
        if hasattr(engine, "preload"):
            engine.preload()
    except Exception as exc:  # noqa: BLE001 - said to the parent, which fails the replicate
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", os.getpid()))
    life: Lifetime | None = None
    try:
        while True:
            try:
                task = conn.recv()
            except (EOFError, OSError):
                break
            if task is None:
                break
            life = run_task(engine, spec, price, task, life)
            conn.send(("record", task.record))
    finally:
        if life is not None:
            with contextlib.suppress(Exception):
                life.session.close()


def run_task(engine: Engine, spec: WorkloadSpec, price: Price, task: Task, life: Lifetime | None
             ) -> Lifetime | None:
    """Measure `task` on the live engine, or on a new one; return the lifetime that goes on (None: ended)."""
    from throttle_sweep.measure import _now_iso, measure_on

    record, key = task.record, flags_key(task.flags)
    if life is not None and (task.fresh or life.key != key):
        close_quietly(life, record)
        life = None
    if life is None:
        try:
            session = engine.start(task.flags)
        except EngineStartError as exc:
            record.update(status="failed", reason=str(exc), stage="start", ended_at=_now_iso())
            return None
        except Exception as exc:  # noqa: BLE001 - an engine bug fails the replicate, not the process
            record.update(status="failed", reason=f"{type(exc).__name__}: {exc}", stage="start", ended_at=_now_iso())
            return None
        life = Lifetime(session, key, uuid.uuid4().hex[:12], session.start_seconds)
        record["engine_start_s"] = session.start_seconds
        if task.lifetime_warmup:  # the first replicate of an engine runs slow: run it, and keep nothing
            began = session.now()  # the engine's clock (virtual on the fake engine)
            session.begin_replicate(task.run_index)
            warm = measure_on(session, task.flags, spec, price, {})
            life.warmup_s = session.now() - began
            record["engine_warmup_s"] = life.warmup_s
            if warm["status"] != "ok":
                record.update(status="failed", reason=f"the engine's warm-up run failed: {warm['reason']}",
                              stage=warm.get("stage", "run"), ended_at=_now_iso())
                close_quietly(life, record)
                return None
    else:
        record["engine_start_s"] = 0.0  # started for an earlier replicate
    life.session.begin_replicate(task.run_index)
    measure_on(life.session, task.flags, spec, price, record)
    live = record["status"] == "ok"
    record["engine_lifetime"] = {"id": life.id, "replicate": life.runs, "pid": os.getpid(), "start_s": life.start_s,
                                 "warmup_s": life.warmup_s, "live": live}
    record["ended_at"] = _now_iso()
    life.runs += 1
    if not live:  # the engine's state after a failed replicate is unknown: the next one starts afresh
        close_quietly(life, record)
        return None
    return life


def close_quietly(life: Lifetime, record: dict[str, Any]) -> None:
    try:
        life.session.close()
    except Exception as exc:  # noqa: BLE001 - a failed shutdown is worth a note, not a crash
        record["shutdown_error"] = f"{type(exc).__name__}: {exc}"


def end_with_parent(parent_pid: int) -> None:
    """End this process as soon as its parent is gone (a SIGKILLed driver runs no cleanup)."""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        os._exit(0)

    threading.Thread(target=watch, name="end-with-parent", daemon=True).start()
