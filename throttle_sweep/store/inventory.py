"""What a records file holds, before anything is analysed: its comparisons (a sweep's search trials and
confirmations, one candidate's view of a joint confirmation, a mode=compare run, a CSV of costs), its
probes (single runs that find the preemption boundary) and single measurements (mode=measure), and which
comparisons were abandoned part-way (an interrupted run starts a comparison afresh; the part it left is
kept in the records, but it is not the comparison and its verdict would be no one's)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from throttle_sweep.stats.analysis import split_joint
from throttle_sweep.stats.comparison import fault_of, retry_key

COMPARISON, PROBE, MEASURE, CALIBRATION, CAPACITY = "comparison", "probe", "measure", "calibration", "capacity"
TIEBREAK = "tiebreak"  # candidates' runs against each other alone: no comparison with a baseline
GOODPUT = ("goodput-screen", "goodput-confirm")  # runs at arrival rates, one configuration each


@dataclass
class Entry:
    name: str  # the comparison id (one candidate's view of a joint one: ID-trial-N); a CSV's: its file's stem
    kind: str  # comparison | probe | measure | calibration (the run that sized the work: workload.replicate_s)
    #            | capacity (mode=capacity's runs at rates)
    stage: str | None  # search | confirm | probe (a sweep's), compare, measure; None for a CSV of costs
    key: str | None  # the sweep's name for it (trial-3, confirm-trial-0, probe max_num_seqs=8 #1)
    records: list[dict[str, Any]]
    partial: str | None = None  # why it is not a whole comparison
    joint: list[dict[str, Any]] | None = None  # one candidate's view of a joint comparison: all its records
    trial: int | None = None  # ... and which candidate

    @property
    def runs(self) -> int:
        return sum(not r.get("warmup") for r in self.records)

    def matches(self, wanted: str) -> bool:
        return wanted in (self.name, self.key) or (len(wanted) >= 6 and self.name.startswith(wanted))


def inventory(records: Sequence[Mapping[str, Any]], *, stem: str) -> list[Entry]:
    groups: dict[str | None, list[dict[str, Any]]] = {}
    for record in records:
        groups.setdefault(record.get("comparison"), []).append(dict(record))
    keys = {group[0].get("key") for group in groups.values()}
    entries = []
    for cid, group in groups.items():
        first = group[0]
        if all(r["arm"] == MEASURE for r in group):
            entries.append(Entry(cid or MEASURE, MEASURE, MEASURE, None, group))
        elif first.get("stage") in (PROBE, CALIBRATION, CAPACITY, TIEBREAK, *GOODPUT):
            entries.append(Entry(cid or first["stage"], first["stage"], first["stage"], first.get("key"), group))
        else:
            stage = first.get("stage") or ("compare" if "schema_version" in first else None)
            why = abandoned(group, keys)
            for trial, view in split_joint(group):
                name = (cid or stem) if trial is None else f"{cid}-trial-{trial}"
                entries.append(Entry(name, COMPARISON, stage, first.get("key"), view, why,
                                     joint=group if trial is not None else None, trial=trial))
    return entries


def abandoned(group: Sequence[Mapping[str, Any]], keys: set[str | None]) -> str | None:
    """Why these records are the part of a comparison that a later run started again, or None."""
    key = group[0].get("key")
    if key is not None:  # a sweep's: one measured again from scratch runs under the next key (compare.retry_key)
        again = retry_key(key)
        if again in keys:
            return f"abandoned: {len(group)} runs, then measured again from scratch as {again}"
    planned = group[0].get("runs_planned")
    if planned is None:  # records written before comparisons said how long they were planned
        return None
    runs = {r["position"]: r for r in group}
    fault = fault_of(runs)
    ends = group[0].get("looks") or [planned]  # a sweep's comparison may stop, decided, at any look
    if len(runs) not in ends and not (fault is not None and fault.blame == "candidate"):
        return (f"abandoned: {len(runs)} of {planned} runs measured when its run stopped (an interrupted "
                "comparison starts afresh when its run is resumed)")
    return None
