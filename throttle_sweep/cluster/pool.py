"""Engine slots. A slot owns its engines and measures one replicate at a time; the driver hands out
replicates and gets records back, so it alone writes. `LocalPool` is this machine's slots (`slots`); the Ray
pool in ray_pool.py has one actor per slot.

`wait` never raises for a lost replicate: it returns a failed record. `infrastructure: true` in it means
the slot itself was lost (its node died), not that the flags failed; such a slot may leave `slots`."""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from throttle_sweep.cluster.signals import deferred
from throttle_sweep.errors import ConfigError


@dataclass(frozen=True)
class Job:
    slot: int
    flags: Mapping[str, Any]
    arm: str
    position: int
    context: Mapping[str, Any] = field(default_factory=dict)
    workload: Mapping[str, Any] | None = None  # what this run changes in the workload (an arrival rate)


class Pool(Protocol):
    size: int
    slots: list[int]  # the slots alive now (a Ray slot whose node died can be retired)
    shares_machine: bool  # the slots share one machine's cores: confirmations run alone

    def submit(self, job: Job) -> None: ...
    def wait(self) -> list[tuple[Job, dict[str, Any]]]: ...  # at least one finished job, with its record
    def written(self, job: Job) -> None: ...  # the driver wrote that job's record: the pool may let it go
    def drain(self) -> list[dict[str, Any]]: ...  # records finished and not yet written (a stopping run's)
    def close(self) -> None: ...


class HeldRecords:
    """What `wait` returned and the driver has not written yet, for both pools: each record stays held until
    `written`, and a stopping run's `drain` hands the rest over once."""

    def __init__(self) -> None:
        self._held: list[tuple[Job, Any]] = []

    def written(self, job: Job) -> None:
        """The driver has written the record `wait` returned for `job`: the pool lets go of it."""
        self._held = [item for item in self._held if item[0] is not job]

    def _take_held(self) -> list[dict[str, Any]]:
        records, self._held = [record for _, record in self._held], []
        return records


MeasureFn = Callable[[Mapping[str, Any], str, int, Mapping[str, Any]], dict[str, Any]]
WAIT_SLICE_S = 0.5  # the driver waits in slices, so Ctrl-C and SIGTERM are handled at once


class LocalPool(HeldRecords):
    """Slots on this machine, one `measure` each. One slot measures in the driver's thread when `wait` is called.
    Several slots each get a thread that hands the slot's replicates to its engine processes and waits for
    them (the engines work in their own processes); records come back to the driver's thread, the one writer.
    A measure that raises raises in the driver's thread, as with one slot."""

    def __init__(self, measures: MeasureFn | Sequence[MeasureFn]) -> None:
        super().__init__()
        self._measures = [measures] if callable(measures) else list(measures)
        if not self._measures:
            raise ValueError("a pool needs at least one slot")
        self.size = len(self._measures)
        self.slots = list(range(self.size))
        self.shares_machine = self.size > 1  # the slots share this machine's cores: confirmations run alone
        self._queue: list[Job] = []  # one slot: measured in `wait`
        self._done: queue.Queue[tuple[Job, dict[str, Any] | BaseException]] = queue.Queue()
        self._inboxes: list[queue.Queue[Job | None]] = []
        self._threads: list[threading.Thread] = []
        if self.size > 1:
            for slot in self.slots:
                self._inboxes.append(queue.Queue())
                thread = threading.Thread(target=self._serve, args=(slot,), daemon=True,
                                          name=f"throttle-sweep-slot-{slot}")
                thread.start()
                self._threads.append(thread)

    def _run(self, job: Job) -> dict[str, Any]:
        context = {**job.context, "slot": f"local-{job.slot}"}
        if job.workload:
            return self._measures[job.slot](job.flags, job.arm, job.position, context, workload=dict(job.workload))
        return self._measures[job.slot](job.flags, job.arm, job.position, context)

    def _serve(self, slot: int) -> None:
        inbox = self._inboxes[slot]
        while (job := inbox.get()) is not None:
            try:
                outcome: dict[str, Any] | BaseException = self._run(job)
            except BaseException as exc:  # noqa: BLE001 - handed to the driver's thread, which raises it
                outcome = exc
            self._done.put((job, outcome))

    def submit(self, job: Job) -> None:
        if self.size == 1:
            self._queue.append(job)
        else:
            self._inboxes[job.slot].put(job)

    def wait(self) -> list[tuple[Job, dict[str, Any]]]:
        """Finished replicates (at least one). Each stays held, and in `drain`, until the driver says it is
        `written`: a Ctrl-C between taking a record and writing it loses nothing."""
        before = len(self._held)
        if self.size == 1:
            job = self._queue.pop(0)
            self._held.append((job, self._run(job)))
            return self._held[before:]
        while len(self._held) == before:
            # the queue's get is Python code that a Ctrl-C could cut between taking an item and returning it:
            # held off for one slice at most, and the item goes straight into `_held`
            with deferred(), contextlib.suppress(queue.Empty):
                self._held.append(self._done.get(timeout=WAIT_SLICE_S))  # type: ignore[arg-type]
        with deferred():
            while True:  # and every other replicate that is done too
                try:
                    self._held.append(self._done.get_nowait())  # type: ignore[arg-type]
                except queue.Empty:
                    break
        new = self._held[before:]
        failed = [item for item in new if isinstance(item[1], BaseException)]
        if failed:  # the records that came with it are returned first, so that they are written
            new = [item for item in new if not isinstance(item[1], BaseException)]
            self._held[before:] = new
            for item in failed if new else failed[1:]:
                self._done.put(item)  # raised by a later wait
            if not new:
                raise failed[0][1]
        return new

    def drain(self) -> list[dict[str, Any]]:
        """The records of replicates that are done and not yet written by the driver: returned by `wait` but
        not `written`, or not yet returned (a sweep stopping mid-batch writes them: nothing measured is lost)."""
        records = self._take_held()
        while True:
            try:
                _, outcome = self._done.get_nowait()
            except queue.Empty:
                return records
            if not isinstance(outcome, BaseException):
                records.append(outcome)

    def close(self) -> None:
        """Tell the slots' threads to stop once their replicate is done (closing the slots' engines ends it)."""
        self._queue.clear()
        for inbox in self._inboxes:
            inbox.put(None)

    def join(self, timeout: float = 10.0) -> None:
        """Wait for the slots' threads to end (after `close` and the slots' own close)."""
        for thread in self._threads:
            thread.join(timeout)
        self._inboxes, self._threads = [], []


def local_slots(requested: int | None, *, backend: str, cpu_engine: bool) -> tuple[int, str]:
    """How many slots this machine runs side by side, and why. `slots: null` (auto): one per group of cores an
    engine uses (vLLM's CPU build: OMP_NUM_THREADS each), for the in-process CPU engine; one otherwise. On GPUs
    several slots need one device each, which Ray gives them (ray.enabled); an endpoint is one set of servers."""
    if requested is not None and (isinstance(requested, bool) or not isinstance(requested, int) or requested < 1):
        raise ConfigError(f"slots must be an integer >= 1 or null (one per free group of cores on the CPU build), "
                          f"but got {requested!r}")
    if requested is not None and requested > 1:
        if backend == "endpoint":
            raise ConfigError(f"slots={requested}: backend=endpoint measures your servers, which several slots would "
                              "load at once and so measure each other; use slots=1")
        if backend in ("vllm", "server") and not cpu_engine:
            raise ConfigError(f"slots={requested}: several engines on this machine's GPUs need one device each; use "
                              "ray.enabled=true, whose slots each get their own GPU (ray.slots)")
        return requested, "slots"
    if requested == 1:
        return 1, "slots=1"
    if backend != "vllm" or not cpu_engine:
        return 1, "auto: one engine at a time"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        threads = max(1, int(os.environ.get("OMP_NUM_THREADS", "1")))
    except ValueError:
        threads = 1
    count = max(1, min(cores // threads, MAX_AUTO_SLOTS))
    return count, f"auto: {cores} core(s), {threads} thread(s) per engine"


MAX_AUTO_SLOTS = 4  # more engines side by side share the memory bus and the driver's core
