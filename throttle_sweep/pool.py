"""Engine slots. A slot owns one engine and measures one replicate at a time; the driver hands out
replicates and gets records back, so it alone writes. `LocalPool` is one slot in this process; the Ray
pool in cluster.py has one actor per slot.

`wait` never raises for a lost replicate: it returns a failed record. `infrastructure: true` in it means
the slot itself was lost (its node died), not that the flags failed; such a slot may leave `slots`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Job:
    slot: int
    flags: Mapping[str, Any]
    arm: str
    position: int
    context: Mapping[str, Any] = field(default_factory=dict)


class Pool(Protocol):
    size: int
    slots: list[int]  # the slots alive now (a Ray slot whose node died can be retired)

    def submit(self, job: Job) -> None: ...
    def wait(self) -> list[tuple[Job, dict[str, Any]]]: ...  # at least one finished job, with its record
    def close(self) -> None: ...


MeasureFn = Callable[[Mapping[str, Any], str, int, Mapping[str, Any]], dict[str, Any]]


class LocalPool:
    """One slot, in this process: `wait` measures the job that was submitted."""

    size = 1
    slots = [0]  # noqa: RUF012 - one fixed slot

    def __init__(self, measure: MeasureFn) -> None:
        self._measure = measure
        self._queue: list[Job] = []

    def submit(self, job: Job) -> None:
        self._queue.append(job)

    def wait(self) -> list[tuple[Job, dict[str, Any]]]:
        job = self._queue.pop(0)
        record = self._measure(job.flags, job.arm, job.position, {**job.context, "slot": f"local-{job.slot}"})
        return [(job, record)]

    def close(self) -> None:
        self._queue.clear()
