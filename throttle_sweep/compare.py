"""Baseline against candidate on one slot: run the interleaved schedule, one replicate at a time.

The slot measures; the caller writes each record as it arrives (one writer). Positions already measured
(from an interrupted run of the same comparison) are taken as they are and never measured again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

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
