"""One replicate, end to end: start the engine with the flags, warm up, run the fixed workload, read the
engine's metrics, shut down, and return the record. A failure becomes a record, never a crash."""

from __future__ import annotations

import datetime as dt
import socket
import traceback
import uuid
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

import numpy as np

from throttle_sweep.cost import Price, usd_per_mtok
from throttle_sweep.engines.base import Engine
from throttle_sweep.errors import EngineRunError, EngineStartError
from throttle_sweep.records import SCHEMA_VERSION
from throttle_sweep.workload import DriveResult, WorkloadSpec, drive, make_requests


def _now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "p99": None}
    p50, p95, p99 = np.percentile(np.asarray(values, dtype=float), [50, 95, 99])
    return {"p50": float(p50), "p95": float(p95), "p99": float(p99)}


def summarise(result: DriveResult, spec: WorkloadSpec, price: Price) -> dict[str, Any]:
    """The measured part of a record, from the driver's per-request timings."""
    done = [t for t in result.timings if t.finished_s is not None]
    ttft = [t.first_token_s - t.submitted_s for t in done if t.first_token_s is not None]
    itl = [(t.finished_s - t.first_token_s) / (t.output_tokens - 1)
           for t in done if t.first_token_s is not None and t.output_tokens > 1]
    e2e = [t.finished_s - t.submitted_s for t in done]
    input_tokens = sum(t.prompt_tokens for t in done)
    output_tokens = sum(t.output_tokens for t in done)
    wall_s = result.wall_s
    return {
        "wall_s": wall_s,
        "requests_completed": len(done),
        "requests_failed": len(result.timings) - len(done),
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "output_tokens_per_s": output_tokens / wall_s if wall_s > 0 else None,
        "usd_per_mtok": usd_per_mtok(price, wall_s, output_tokens),
        "usd_per_mtok_input": usd_per_mtok(price, wall_s, input_tokens),
        "usd_per_mtok_total": usd_per_mtok(price, wall_s, input_tokens + output_tokens),
        "peak_kv_cache_usage": result.peak_kv_cache_usage,
        "latency_s": {"ttft": percentiles(ttft), "itl": percentiles(itl), "e2e": percentiles(e2e)},
    }


def record_header(engine: Engine, flags: Mapping[str, Any], spec: WorkloadSpec, price: Price, *, run_id: str,
                  arm: str, position: int, environment: Mapping[str, Any] | None = None,
                  context: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What every record says before anything is measured: which arm, flags, work and price."""
    return {
        "schema_version": SCHEMA_VERSION,
        "record_id": uuid.uuid4().hex,
        "run_id": run_id,
        "arm": arm,
        "flags": dict(flags),
        "engine_flags": engine.engine_flags(flags),
        "position": position,
        "usd_per_gpu_hour": price.usd_per_gpu_hour,
        "gpus": price.gpus,
        "price_is_assumed": True,
        "workload": asdict(spec),
        "environment": dict(environment or engine.environment()),
        "node": socket.gethostname(),
        "started_at": _now_iso(),
        **dict(context or {}),
    }


def failed_record(header: dict[str, Any], reason: str, **extra: Any) -> dict[str, Any]:
    """A replicate that produced no measurement (the slot lost it); kept so nothing disappears silently."""
    return {**header, "status": "failed", "reason": reason, "ended_at": _now_iso(), **extra}


def measure_replicate(
    engine: Engine,
    flags: Mapping[str, Any],
    spec: WorkloadSpec,
    price: Price,
    *,
    run_id: str,
    arm: str,
    position: int,
    environment: Mapping[str, Any] | None = None,
    context: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Measure once. The returned record has status 'ok', or 'failed' with the engine's reason."""
    record = record_header(engine, flags, spec, price, run_id=run_id, arm=arm, position=position,
                           environment=environment, context=context)
    session = None
    try:
        session = engine.start(flags)
        record["engine_start_s"] = session.start_seconds
        if spec.warmup_requests:
            drive(session, make_requests(spec, warmup=True), loop="closed", concurrency=spec.concurrency)
        before = session.preemptions()
        result = drive(session, make_requests(spec), loop=spec.loop, concurrency=spec.concurrency)
        record.update(summarise(result, spec, price))
        record["preemptions"] = session.preemptions() - before
        record["status"] = "ok" if record["requests_failed"] == 0 else "failed"
        record["reason"] = None if record["status"] == "ok" else f"{record['requests_failed']} requests did not finish"
    except (EngineStartError, EngineRunError) as exc:
        record.update(status="failed", reason=str(exc), stage="start" if session is None else "run")
    except Exception as exc:  # an engine bug must not take the sweep down; keep its trace in the record
        record.update(status="failed", reason=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc(limit=8),
                      stage="start" if session is None else "run")
    finally:
        if session is not None:
            try:
                session.close()
            except Exception as exc:  # noqa: BLE001 - a failed shutdown is worth a note, not a crash
                record["shutdown_error"] = f"{type(exc).__name__}: {exc}"
    record["ended_at"] = _now_iso()
    return record


def one_line(record: Mapping[str, Any], price: Price) -> str:
    """The one-line result users read: throughput, cost, preemptions, tail latency."""
    if record["status"] != "ok":
        return f"FAILED ({record.get('stage', 'run')}): {record.get('reason')}"
    lat = record["latency_s"]
    return (f"{record['output_tokens_per_s']:.1f} output tok/s  ${record['usd_per_mtok']:.4f}/M output tokens "
            f"({price.label()})  preemptions={record['preemptions']}  "
            f"p95 TTFT={lat['ttft']['p95'] * 1e3:.1f} ms  p95 ITL={lat['itl']['p95'] * 1e3:.2f} ms  "
            f"p95 E2E={lat['e2e']['p95']:.3f} s")
