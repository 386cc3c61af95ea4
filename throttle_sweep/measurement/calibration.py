"""Fixed work sized by time (`workload.replicate_s`). A GPU's pace is unknown until it runs: a fixed request
count that fills a minute on one GPU takes seconds on another, where an engine start outweighs the measured
work, or hours on a slower one. So the baseline runs once at the configured size (`num_requests`), and every
replicate then runs as many requests as make the baseline's replicate last `replicate_s`.

The size is found once per study or comparison: a resume reads the calibration run back from the records,
so the work (the cost's denominator) never moves within one. The calibration run is kept in the records
(stage `calibration`); it is no replicate of any comparison.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, replace
from typing import Any

from throttle_sweep.measurement.workload import WorkloadSpec
from throttle_sweep.store.records import is_ok

STAGE = "calibration"
CONTEXT = {"stage": STAGE}


class Failed(Exception):
    """The calibration run failed (its words say why and what to do); nothing was sized."""


def size(spec: WorkloadSpec, baseline: Mapping[str, Any], records: Iterable[Mapping[str, Any]],
         run_baseline: Callable[[], Mapping[str, Any]], *, attempts: int = 1) -> tuple[WorkloadSpec, str]:
    """The workload every replicate runs, and the sentence that says how it was sized: from the calibration run
    an earlier run recorded, or from one made now (`run_baseline`, which writes its record), again while its
    slot is lost (infrastructure), up to `attempts` times. Raises Failed when it does not run ok."""
    record = found(records, spec, baseline)
    again = record is not None
    for _ in range(0 if again else attempts):
        record = run_baseline()
        if is_ok(record) or not record.get("infrastructure"):
            break
    if record is None or not is_ok(record):
        raise Failed(failed_words(record or {}))
    now = sized(spec, record)
    return now, sentence(spec, now, record, again=again)


def sized_requests(spec: WorkloadSpec, wall_s: float) -> int:
    """How many requests make a replicate last `spec.replicate_s`, from a run of `spec.num_requests` that took
    `wall_s`; never fewer than the loop keeps in flight (the space is clipped to that many)."""
    return max(spec.concurrency, math.ceil(spec.num_requests * spec.replicate_s / wall_s))


def found(records: Iterable[Mapping[str, Any]], spec: WorkloadSpec, baseline: Mapping[str, Any]
          ) -> Mapping[str, Any] | None:
    """The calibration run an earlier run made of this configured workload with these baseline flags (the
    first that ran ok: the one that sized the records after it)."""
    configured = asdict(spec)
    return next((r for r in records if r.get("stage") == STAGE and is_ok(r) and r.get("wall_s")
                 and r.get("workload") == configured and r.get("flags") == dict(baseline)), None)


def sized(spec: WorkloadSpec, record: Mapping[str, Any]) -> WorkloadSpec:
    """The workload every replicate runs; it keeps `replicate_s`, which says how its count was found."""
    return replace(spec, num_requests=sized_requests(spec, record["wall_s"]))


def sentence(spec: WorkloadSpec, now: WorkloadSpec, record: Mapping[str, Any], *, again: bool) -> str:
    start = record.get("engine_start_s")
    return (f"calibration{' (read back from the records)' if again else ''}: the baseline ran "
            f"{spec.num_requests} requests in {record['wall_s']:.1f} s"
            + (f" after a {start:.0f} s engine start" if start else "")
            + f"; every replicate runs {now.num_requests} requests " + replicate_words(spec, now, record["wall_s"]))


def replicate_words(spec: WorkloadSpec, now: WorkloadSpec, wall_s: float) -> str:
    """How long a baseline replicate of the sized work will take, and why when it is not `replicate_s`."""
    seconds = wall_s * now.num_requests / spec.num_requests
    if now.num_requests == spec.concurrency and seconds > spec.replicate_s * 1.05:
        return (f"(about {seconds:.0f} s at the baseline: never fewer than the {spec.concurrency} the loop keeps in "
                f"flight, so longer than workload.replicate_s={spec.replicate_s:g} s)")
    return f"(about {spec.replicate_s:g} s at the baseline, workload.replicate_s)"


def failed_words(record: Mapping[str, Any]) -> str:
    if record.get("infrastructure"):  # the slot's loss, attempt after attempt
        return (f"the baseline's calibration run was lost with its slot, attempt after attempt (the last: "
                f"{record.get('reason')}); run the same command again once the machine is sound")
    return (f"the baseline's calibration run failed ({record.get('reason')}); it sizes the work of every "
            "replicate (workload.replicate_s): fix what makes the baseline fail, or set workload.num_requests "
            "with workload.replicate_s=null")

