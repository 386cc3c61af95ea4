"""An engine process: one child process that owns one engine at a time and measures replicates on it. vLLM
is imported once per process; an engine serves as many replicates as the restart policy allows (one, by
default: see slot.py); and a crash (a segfault, an out-of-memory kill) takes down this process, never the
driver.

The child imports vLLM once (seconds on a small CPU); later engines in the same process start as fast as in
the driver (benchmarks/warm_engines.py). A lifetime ends when the flags change, the restart policy says so, or a
replicate fails (the engine's state is then unknown). The child ends itself when its parent goes, however
the parent went (SIGKILL included): it watches its parent's pid."""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import signal
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from throttle_sweep.engines.base import Engine, EngineSession
from throttle_sweep.engines.flags import flags_key
from throttle_sweep.errors import EngineStartError
from throttle_sweep.measurement.cost import Price
from throttle_sweep.measurement.energy import meter_for
from throttle_sweep.measurement.replicate import measure_on, now_iso
from throttle_sweep.measurement.workload import WorkloadSpec
from throttle_sweep.store.records import is_ok

PARENT_POLL_S = 0.2  # how soon an orphaned engine process notices and ends itself
ENGINE_WARMUPS = ("first", "every", "none")


class StartCount:
    """How many engines a host has started (engine_warmup=first warms its first one)."""

    def __init__(self) -> None:
        self.engines = 0


def warmup_work(spec: WorkloadSpec) -> WorkloadSpec:
    """An engine's warm-up run: every request of the work (every batch size it reaches), each with the short
    warm-up output: it warms what makes a first run slow, not the clock (the whole work would double the first
    run's cost)."""
    return replace(spec, output_len=min(spec.output_len, spec.warmup_output_len))


PROCESS_STARTS = StartCount()  # in an engine process: the engines it has started


@dataclass(frozen=True)
class Task:
    """What the parent asks of its engine process for one replicate."""

    flags: Mapping[str, Any]
    record: dict[str, Any]  # the record's header, filled in by the child
    run_index: int  # the slot's replicate count (the fake engine's drift follows it)
    warmup: str  # a new engine runs the workload once, unmeasured: first (the process's first engine) | every | none
    arm: str = ""  # part of the lifetime's key: the two arms of a comparison never share an engine
    keep: bool = True  # keep the engine up after the replicate (False: a new engine for every replicate)
    sleep_mode: bool = False  # start the engine able to sleep (a GPU slot keeping two engines)
    pin: Mapping[str, Any] | None = None  # flags for a new engine only: the KV capacity these flags had alone
    workload: Mapping[str, Any] | None = None  # fields of the workload this run changes (mode=capacity: the rate)


SLEEP = "sleep"  # the parent asks the process to put its engine to sleep (a GPU engine making room for another)
RELEASE = "release"  # the parent asks the process to shut its engine down (the next start must be alone)


def lifetime_key(arm: str, flags: Mapping[str, Any]) -> str:
    """What an engine lifetime serves: one arm with one set of flags (A/A arms never share an engine)."""
    return f"{arm}:{flags_key(flags)}"


class EngineProcessDied(Exception):
    pass


class EngineHost:
    """The parent's handle on one engine process."""

    def __init__(self, engine: Engine, spec: WorkloadSpec, price: Price, *, name: str) -> None:
        ctx = multiprocessing.get_context("spawn")  # a clean process: no copies of the driver's threads or locks
        self.name = name
        self._conn, child = ctx.Pipe()
        # not a daemon: vLLM's multi-GPU executor starts worker processes of its own, which a daemon may not;
        # so the process is ended at exit here (before multiprocessing would wait for it), and by its watcher
        self.process = ctx.Process(target=serve, args=(child, engine, spec, price, os.getpid()), daemon=False,
                                   name=f"throttle-sweep-engine-{name}")
        self.process.start()
        child.close()
        atexit.register(self.close, grace_s=1.0)
        self.pid = self.process.pid
        self.key: str | None = None  # the flags of the live engine, if any
        self.runs = 0  # replicates on the live engine
        self.used_at = 0.0
        self.awake = False  # its engine holds device memory
        self._ready = False
        self._closed = False
        # a slot's thread may be reading while the driver's thread closes (Ctrl-C with several local slots):
        # the pipe is closed by whichever comes last, never under a read
        self._lock = threading.Lock()
        self._readers = 0
        self.environment: dict[str, Any] = {}  # the engine's machine, as the process sees it (once ready)

    @property
    def alive(self) -> bool:
        return self.process.is_alive()

    def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until the process has imported the engine's code (raises EngineProcessDied if it could not)."""
        if self._ready:
            return
        if not self._conn.poll(timeout):
            raise EngineProcessDied(f"engine process {self.name} was not ready within {timeout:g}s")
        self.environment = self._receive("ready", "while it imported the engine's code")
        self._ready = True

    def measure(self, task: Task) -> dict[str, Any]:
        """Run one replicate in the process. Raises EngineProcessDied if the process is gone."""
        self.wait_ready()
        self.used_at = time.monotonic()
        try:
            self._conn.send(task)
        except (BrokenPipeError, OSError) as exc:
            raise EngineProcessDied(self._death("before this replicate reached it")) from exc
        record = self._receive("record")
        if record.get("engine_lifetime", {}).get("live"):
            self.key, self.runs = lifetime_key(task.arm, task.flags), record["engine_lifetime"]["replicate"] + 1
        else:  # the lifetime ended with this replicate (a failure): the next one starts a new engine
            self.key, self.runs = None, 0
        self.awake = self.key is not None
        return record

    def sleep(self) -> float | None:
        """Put the live engine to sleep; returns the seconds it took, or None when the engine could not sleep
        and was shut down instead (the next replicate starts a new one). Raises EngineProcessDied."""
        try:
            self._conn.send(SLEEP)
        except (BrokenPipeError, OSError) as exc:
            raise EngineProcessDied(self._death("while idle")) from exc
        seconds = self._receive("slept", "while it put its engine to sleep")
        self.awake = False
        if seconds is None:
            self.key, self.runs = None, 0
        return seconds

    def release(self) -> None:
        """Shut the live engine down, keeping the process (and its imports). Raises EngineProcessDied."""
        try:
            self._conn.send(RELEASE)
        except (BrokenPipeError, OSError) as exc:
            raise EngineProcessDied(self._death("while idle")) from exc
        self._receive("released", "while it shut its engine down")
        self.key, self.runs, self.awake = None, 0, False

    def _receive(self, expected: str, when: str = "mid-replicate") -> Any:
        with self._lock:
            if self._closed:
                raise EngineProcessDied(f"engine process {self.name} was shut down {when}")
            self._readers += 1
        try:
            kind, payload = self._conn.recv()
        except (EOFError, OSError) as exc:
            raise EngineProcessDied(self._death(when)) from exc
        finally:
            with self._lock:
                self._readers -= 1
                if self._closed and not self._readers:
                    self._conn.close()
        if kind == "error":
            raise EngineProcessDied(f"engine process {self.name} could not start: {payload}")
        if kind != expected:  # an answer left over from an interrupted call: this process cannot be trusted
            self.close(grace_s=1.0)
            raise EngineProcessDied(f"engine process {self.name} answered {kind!r} where {expected!r} was due "
                                    "(an earlier call was interrupted); it was ended")
        return payload

    def _death(self, when: str) -> str:
        self.process.join(5)
        code = self.process.exitcode
        if code is not None and code < 0:
            how = f"killed by {signal.Signals(-code).name}"
        else:
            how = f"exit code {code}" if code is not None else "still running but not answering"
        self.key = None
        return f"the engine's process died {when} (pid {self.pid}, {how})"

    def close(self, grace_s: float = 5.0) -> None:
        """Shut the engine down and end the process: politely, then SIGTERM, then SIGKILL. Idempotent, and safe
        while another thread waits for this process's answer (it gets EngineProcessDied)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        atexit.unregister(self.close)
        with contextlib.suppress(Exception):
            self._conn.send(None)
        self.process.join(grace_s)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(grace_s)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        with self._lock:
            if not self._readers:
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
    warm: bool = False  # it has run the workload (a warm-up run or a replicate)
    asleep: bool = False
    kv_pin: Mapping[str, Any] | None = None


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
    try:
        environment = engine.environment()
    except Exception as exc:  # noqa: BLE001 - said to the parent, which fails the replicate
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", environment))
    life: Lifetime | None = None
    try:
        while True:
            try:
                task = conn.recv()
            except (EOFError, OSError):
                break
            if task is None:
                break
            if task == SLEEP:
                try:
                    slept = put_to_sleep(life)
                except Exception:  # noqa: BLE001 - an engine that cannot sleep is shut down: the GPU is freed either way
                    if life is not None:
                        close_quietly(life, {})
                    life, slept = None, None  # the parent learns that the engine is gone
                conn.send(("slept", slept))
                continue
            if task == RELEASE:
                if life is not None:
                    close_quietly(life, {})
                life = None
                conn.send(("released", None))
                continue
            life = run_task(engine, spec, price, task, life)
            conn.send(("record", task.record))
    finally:
        if life is not None:
            with contextlib.suppress(Exception):
                life.session.close()


def run_task(engine: Engine, spec: WorkloadSpec, price: Price, task: Task, life: Lifetime | None,
             starts: StartCount = PROCESS_STARTS) -> Lifetime | None:
    """Measure `task` on the live engine, or on a new one; return the lifetime that goes on (None: ended)."""
    record, key = task.record, lifetime_key(task.arm, task.flags)
    if task.workload:
        spec = replace(spec, **task.workload)
    if life is not None and life.key != key:
        close_quietly(life, record)
        life = None
    if life is None:
        try:
            extra = {**(task.pin or {}), **({"enable_sleep_mode": True} if task.sleep_mode else {})}
            session = engine.start({**task.flags, **extra})
        except EngineStartError as exc:
            record.update(status="failed", reason=str(exc), failed_at="start", ended_at=now_iso())
            return None
        except Exception as exc:  # noqa: BLE001 - an engine bug fails the replicate, not the process
            record.update(status="failed", reason=f"{type(exc).__name__}: {exc}", failed_at="start", ended_at=now_iso())
            return None
        pin = session.kv_pin() if hasattr(session, "kv_pin") else None  # what gives a later start this capacity
        life = Lifetime(session, key, uuid.uuid4().hex[:12], session.start_seconds, kv_pin=pin)
        record["engine_start_s"] = session.start_seconds
        if (waited := getattr(session, "memory_wait_s", None)) is not None:  # for the GPU's memory, before it
            record["engine_memory_wait_s"] = waited
        starts.engines += 1
        if task.warmup == "every" or (task.warmup == "first" and starts.engines == 1):
            # a process's first run is slow (lazy imports, allocator, caches): run it, and keep nothing
            if not begin(life, task, record, idle=False):
                return None
            began = session.now()  # the engine's clock (virtual on the fake engine)
            # unpriced: nothing of it is kept, and its energy is not read
            warm = measure_on(session, task.flags, warmup_work(spec), replace(price, usd_per_kwh=None), {})
            life.warmup_s = session.now() - began
            record["engine_warmup_s"] = life.warmup_s
            life.warm = True
            if not is_ok(warm):
                record.update(status="failed", reason=f"the engine's warm-up run failed: {warm['reason']}",
                              failed_at=warm.get("failed_at", "run"), ended_at=now_iso())
                close_quietly(life, record)
                return None
    else:
        record["engine_start_s"] = 0.0  # started for an earlier replicate
        if life.asleep:  # it slept while another engine used the GPU
            began = life.session.now()
            try:
                life.session.wake()
            except Exception as exc:  # noqa: BLE001 - a failed wake-up fails the replicate and ends the engine
                record.update(status="failed", reason=f"the engine did not wake: {type(exc).__name__}: {exc}",
                              failed_at="start", ended_at=now_iso(), infrastructure=True)  # the GPU's, not the flags'

                close_quietly(life, record)
                return None
            life.asleep = False
            record["engine_wake_s"] = life.session.now() - began
    if not begin(life, task, record, idle=record["engine_start_s"] == 0.0):
        return None
    # an engine that has run this workload already is warm for every batch size it will see
    measure_on(life.session, task.flags, spec, price, record, cold=not life.warm,
               energy=meter_for(engine.name, task.flags))
    life.warm = True
    live = is_ok(record) and task.keep
    record["engine_lifetime"] = {"id": life.id, "replicate": life.runs, "pid": os.getpid(), "start_s": life.start_s,
                                 "warmup_s": life.warmup_s, "live": live,
                                 # the GPUs this engine (and vLLM's own workers, its children) can see
                                 "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                                 "kv_pin": dict(life.kv_pin) if life.kv_pin else None}
    record["ended_at"] = now_iso()
    life.runs += 1
    if not live:  # not kept, or failed (its state is then unknown): the next replicate starts a new engine
        close_quietly(life, record)
        return None
    return life


def begin(life: Lifetime, task: Task, record: dict[str, Any], *, idle: bool) -> bool:
    """Start a replicate afresh on the engine (a server's prefix cache reset goes over HTTP, and can fail). A
    failure ends the engine and fails the replicate: the flags' doing on an engine just started for it, the
    slot's (infrastructure) on one that was up from an earlier replicate and broke while `idle`."""
    try:
        life.session.begin_replicate(task.run_index)
    except Exception as exc:  # noqa: BLE001 - said in the record, never a crash of this process
        record.update(status="failed", reason=f"the engine could not begin the replicate: {type(exc).__name__}: "
                      f"{exc}", failed_at="start", ended_at=now_iso(), **({"infrastructure": True} if idle else {}))
        close_quietly(life, record)
        return False
    return True


def put_to_sleep(life: Lifetime | None) -> float:
    if life is None or life.asleep:
        return 0.0
    began = time.perf_counter()
    life.session.sleep()
    life.asleep = True
    return time.perf_counter() - began


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
