"""One run at one arrival rate, as every capacity measurement takes it: written as it comes, void (and run
again) when the client fell behind its arrival schedule, and read as (met, counted) of the SLO."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from throttle_sweep.capacity.slo import attainment
from throttle_sweep.measure import BEHIND_S
from throttle_sweep.records import RecordLog
from throttle_sweep.settings.capacity import CapacitySettings
from throttle_sweep.signals import deferred
from throttle_sweep.slot import WarmSlot

MAX_VOID = 3  # runs at one rate that fell behind their schedule, in a row: the client cannot offer that rate


class ClientTooSlow(Exception):
    """The client could not keep to a rate's arrival schedule MAX_VOID times in a row."""


def usable(record: Mapping[str, Any], stage: str) -> bool:
    return record.get("stage") == stage and record.get("status") == "ok" and not record.get("void")


def measure_rate(slot: WarmSlot, flags: Mapping[str, Any], rate: float, context: Mapping[str, Any], log: RecordLog,
                 settings: CapacitySettings, arm: str, say: Callable[[str], None], replicate: int = 0
                 ) -> dict[str, Any]:
    """The record of one usable run at `rate` (its `replicate`-th there: its arrival schedule), or of a failed
    one (status != ok: the caller decides what a failure means). Raises ClientTooSlow."""
    for _ in range(MAX_VOID):
        record = slot.measure(dict(flags), arm, len(log.records), dict(context),
                              workload=settings.at(rate, replicate))
        behind = (record.get("lateness_s") or {}).get("beyond_steps_p99") or 0.0
        if record["status"] == "ok" and behind > max(BEHIND_S, 0.05 * (settings.slo.p95_ttft_s or 0.0)):
            record["void"] = (f"the client fell behind its arrival schedule (p99 {behind * 1e3:.0f} ms beyond "
                              "the engine's steps): the run says nothing of the engine")
        with deferred():
            log.append(record)
        if not record.get("void"):  # lateness here, or the client's own load (measure.client_bound)
            return record
        say(f"[yellow]void:[/] {record['void']}; again at {rate:g} req/s")
    raise ClientTooSlow(f"the client could not keep to {rate:g} requests/s in {MAX_VOID} runs: this machine cannot "
                        "offer that load; measure from a faster client, or lower capacity.max_rate")


def met_of(record: Mapping[str, Any], settings: CapacitySettings) -> tuple[int, int]:
    return attainment(record, settings.slo, settings.settle_share)


def run_line(label: str, rate: float, record: Mapping[str, Any], met: int, counted: int, holds: bool) -> str:
    lat = record["latency_s"]
    return (f"  {label:7}  {rate:9.4g} req/s  attainment {met / counted:6.1%} ({met}/{counted})  p95 TTFT "
            f"{lat['ttft']['p95'] * 1e3:8.1f} ms  p95 TPOT {lat['tpot']['p95'] * 1e3:7.2f} ms  "
            f"{'holds' if holds else 'fails'}")
