"""Baseline against candidate on one slot: run the interleaved schedule, one replicate at a time, and what
the records of one comparison say about it (`settle`, `fault_of`).

The slot measures; the caller writes each record as it arrives (one writer). A comparison an earlier run
left complete is taken as it is; one it left partial is started afresh under a new id, never continued in
another process after a gap (that would mix engines, and drift that is not linear, into one comparison).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from throttle_sweep.stats.schedule import BASELINE
from throttle_sweep.store.records import is_ok

MAX_ATTEMPTS = 3  # a comparison stopped this often by faults that are not the candidate's is given up


@dataclass(frozen=True)
class Fault:
    """Why a comparison stopped early, and who is to blame: the candidate's flags, the baseline, or the slot."""

    blame: str  # candidate | baseline | slot | client
    record: dict[str, Any]

    @property
    def reason(self) -> str:
        return f"{self.record['arm']}: {self.record.get('reason')}"


def fault_of(records: Mapping[int, Mapping[str, Any]]) -> Fault | None:
    """The first failed replicate of a comparison, with its blame; a lost slot (its node died, it hung, it was
    killed for memory) is never the flags' fault, and a failed baseline is not the candidate's."""
    for position in sorted(records):
        record = records[position]
        if not is_ok(record):
            if record.get("void"):  # the client was the bottleneck: no one's flags are to blame
                return Fault("client", dict(record))
            if record.get("infrastructure"):
                return Fault("slot", dict(record))
            return Fault("baseline" if record["arm"] == BASELINE else "candidate", dict(record))
    return None


def settle(records: Mapping[int, Mapping[str, Any]], length: int) -> str:
    """What the records of one comparison say: 'fresh' (nothing measured), 'complete' (every position, or
    stopped by the candidate's own failure), or 'redo': stopped by a fault that is not the candidate's, or
    left partial by an earlier driver (continuing it would mix engines, slots and a gap into one comparison)."""
    if not records:
        return "fresh"
    fault = fault_of(records)
    if fault is not None:
        return "complete" if fault.blame == "candidate" else "redo"
    return "complete" if len(records) == length else "redo"


def retry_key(key: str) -> str:
    """A fresh key for a comparison restarted from scratch on another slot: 'trial-4' -> 'trial-4~1'."""
    base, _, n = key.partition("~")
    return f"{base}~{int(n or 0) + 1}"


MeasureFn = Callable[[Mapping[str, Any], str, int], dict[str, Any]]  # (flags, arm, position) -> record
ProgressFn = Callable[[int, str], None]  # (position about to run, arm)


def comparison_id(arms: Mapping[str, Mapping[str, Any]], order: Sequence[str], extra: Mapping[str, Any]) -> str:
    """A stable name for 'these arms, this order, this workload': records carrying it can be resumed."""
    blob = json.dumps({"arms": arms, "order": list(order), **extra}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def run_schedule(
    measure: MeasureFn,
    arms: Mapping[str, Mapping[str, Any]],
    order: Sequence[str],
    *,
    write: Callable[[dict[str, Any]], None],
    done: Mapping[int, dict[str, Any]] | None = None,
    progress: ProgressFn | None = None,
) -> list[dict[str, Any]]:
    """Measure every position of `order` not in `done`, writing each record before the next starts."""
    done = done or {}
    records = []
    for position, arm in enumerate(order):
        if position in done:
            records.append(done[position])
            continue
        if progress is not None:
            progress(position, arm)
        record = measure(arms[arm], arm, position)
        write(record)
        records.append(record)
    return records


def measured_positions(records: Sequence[Mapping[str, Any]], comparison: str) -> dict[int, dict[str, Any]]:
    """Records of this comparison already on disk, by position (the first one of each position wins)."""
    found: dict[int, dict[str, Any]] = {}
    for record in records:
        if record.get("comparison") == comparison:
            found.setdefault(record["position"], dict(record))
    return found
