"""One run at one arrival rate, as every capacity measurement takes it: written as it comes, void (and run
again) when the client fell behind its arrival schedule, void and run again twice as long when its latency
grew through the run yet it kept the SLO (steady.undecided), and read as (met, counted) of the SLO after
the warm-up its own requests show (steady.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from throttle_sweep.capacity.steady import counted, undecided
from throttle_sweep.cluster.signals import deferred
from throttle_sweep.cluster.slot import WarmSlot
from throttle_sweep.measurement.replicate import BEHIND_S, p95_text
from throttle_sweep.settings.capacity import CapacitySettings
from throttle_sweep.store.records import RecordLog, is_ok

MAX_VOID = 3  # runs at one rate that fell behind their schedule, in a row: the client cannot offer that rate


class ClientTooSlow(Exception):
    """The client could not keep to a rate's arrival schedule MAX_VOID times in a row."""


def usable(record: Mapping[str, Any], stage: str) -> bool:
    return record.get("stage") == stage and is_ok(record) and not record.get("void")


def measure_rate(slot: WarmSlot, flags: Mapping[str, Any], rate: float, context: Mapping[str, Any], log: RecordLog,
                 settings: CapacitySettings, arm: str, say: Callable[[str], None], replicate: int = 0
                 ) -> dict[str, Any]:
    """The record of one usable run at `rate` (its `replicate`-th there: its arrival schedule), or of a failed
    one (status != ok: the caller decides what a failure means). Raises ClientTooSlow."""
    longer: str | None = None  # why the run is twice as long, once a trend left it undecided
    for _ in range(MAX_VOID):
        record = slot.measure(dict(flags), arm, len(log.records), {**context, **({"lengthened": longer} if longer
                                                                                 else {})},
                              workload=settings.at(rate, replicate, scale=2 if longer else 1))
        behind = (record.get("lateness_s") or {}).get("beyond_steps_p99") or 0.0
        if is_ok(record) and behind > max(BEHIND_S, 0.05 * (settings.slo.p95_ttft_s or 0.0)):
            record["void"] = (f"the client fell behind its arrival schedule (p99 {behind * 1e3:.0f} ms beyond "
                              "the engine's steps): the run says nothing of the engine")
        elif is_ok(record) and (why := undecided(record, settings.slo)):
            record["void"] = longer = why
        with deferred():
            log.append(record)
        if not record.get("void"):  # lateness here, or the client's own load (measure.client_bound)
            return record
        say(f"[yellow]void:[/] {record['void']}; again at {rate:g} req/s")
    raise ClientTooSlow(f"the client could not keep to {rate:g} requests/s in {MAX_VOID} runs: this machine cannot "
                        "offer that load; measure from a faster client, or lower capacity.max_rate")


def met_of(record: Mapping[str, Any], settings: CapacitySettings) -> tuple[int, int]:
    """(met, counted) of a usable run: after its warm-up, or its second half where its latency grew
    (steady.counted)."""
    met, n, _ = counted(record, settings.slo) or (0, 0, None)
    return met, n


def run_line(label: str, rate: float, record: Mapping[str, Any], met: int, n: int, holds: bool,
             settings: CapacitySettings) -> str:
    lat = record["latency_s"]
    return (f"  {label:7}  {rate:9.4g} req/s  attainment {met / n:6.1%} ({met}/{n})  p95 TTFT "
            f"{p95_text(lat, 'ttft', '8.1f')} ms  p95 TPOT {p95_text(lat, 'tpot', '7.2f')} ms  "
            f"{'holds' if holds else 'fails'}{steady_words(record, settings)}")


def steady_words(record: Mapping[str, Any], settings: CapacitySettings) -> str:
    """The run's warm-up, and how its trend was read, where it had one."""
    found = counted(record, settings.slo)
    if found is None:
        return ""
    _, n, s = found
    where = "; second half counted: latency grew through the run" if n == s.second_counted and s.trending else ""
    return f"  warm-up {s.warmup_s:.1f} s{where}{' (lengthened 2x)' if record.get('lengthened') else ''}"
