"""One replicate: warm up, run the fixed workload, read the engine's metrics, and return the record, on an
engine that is already running (`measure_on`, for the warm engines of cluster/host.py) or on one started and
shut down for it (`measure_replicate`). A failure becomes a record, never a crash."""

from __future__ import annotations

import bisect
import datetime as dt
import socket
import time
import traceback
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

from throttle_sweep.engines.base import Engine, EngineSession
from throttle_sweep.errors import EngineRunError, EngineStartError
from throttle_sweep.measurement.cost import Price, usd_per_mtok
from throttle_sweep.measurement.energy import Meter, energy_note, joules_per_token, joules_text, meter_for
from throttle_sweep.measurement.workload import DriveResult, WorkloadSpec, drive, make_requests
from throttle_sweep.store.records import SCHEMA_VERSION, is_ok


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def percentiles(values: list[float]) -> dict[str, float | int | None]:
    """p50/p95/p99 and `n`, the samples they rest on (over 20 requests, p99 is the maximum)."""
    if not values:
        return {"p50": None, "p95": None, "p99": None, "n": 0}
    p50, p95, p99 = np.percentile(np.asarray(values, dtype=float), [50, 95, 99])
    return {"p50": float(p50), "p95": float(p95), "p99": float(p99), "n": len(values)}


LATE_NOTE_S = 0.005  # open loop: lateness beyond this (and beyond 10% of the median TTFT) is flagged
BEHIND_S = 0.010  # open loop: the driver is behind its schedule when requests wait this much beyond a step's end


# The client is the bottleneck when its process used nearly all the one core its interpreter lock allows, or it
# was busy and its streams' loop woke late: then token arrivals, and in a closed loop the next requests, wait for
# the client, and configurations look alike. A loop late while its process was mostly idle was kept waiting by
# other processes (a loaded machine): that is the machine's drift, which interleaving cancels, not the client's
# limit. The lag limit is generous, for a machine whose cores the server shares.
CLIENT_CPU_SHARE = 0.9
CLIENT_BUSY_SHARE = 0.3  # (a busy client on a loaded 2-core machine gets about half a core)
CLIENT_LAG_S = 0.1


def client_bound(load: Mapping[str, Any] | None) -> str | None:
    """Why a run measured its own client rather than the engine (see CLIENT_CPU_SHARE), or None."""
    if not load:
        return None
    lag = (load.get("loop_lag_s") or {}).get("p99") or 0.0
    busy = load.get("cpu_share", 0.0)
    if busy >= CLIENT_CPU_SHARE or (lag >= CLIENT_LAG_S and busy >= CLIENT_BUSY_SHARE):
        return (f"the client was the bottleneck (its process used {load.get('cpu_share', 0.0):.0%} of a core, "
                f"limit {CLIENT_CPU_SHARE:.0%}; its loop woke p99 {lag * 1e3:.0f} ms late, limit "
                f"{CLIENT_LAG_S * 1e3:.0f} ms): the run says nothing of the engine; measure from a faster client "
                "or with less in flight")
    return None


def behind_schedule(result: DriveResult) -> float:
    """How far the driver fell behind its arrival schedule beyond what waiting for the engine's step explains
    (p99 over requests, seconds): a request due mid-step can only be added once the step ends, as a server
    does, so that wait is the engine's; anything after it is the client's, and says nothing of the engine."""
    ends = [step.ended_s for step in result.steps]
    beyond = []
    for t in result.timings:
        i = bisect.bisect_right(ends, t.scheduled_s)  # the first step to end after it was due
        under_way = i < len(ends) and (result.steps[i].began_s or 0.0) <= t.scheduled_s
        beyond.append(max(0.0, t.submitted_s - (ends[i] if under_way else t.scheduled_s)))
    return float(np.percentile(beyond, 99)) if beyond else 0.0


def steady_window(result: DriveResult) -> tuple[float, int] | None:
    """(seconds, output tokens) of a closed loop's steady part: from the start to the end of the last step that
    began with the engine full (as many in flight as it runs at once: the concurrency, or max_num_seqs if
    lower). After it, the work drains: fewer requests are left than the engine could run, so the tail's cost
    follows how the fixed work splits into waves, not the flags."""
    if not result.full:
        return None
    end, tokens = None, 0
    for step in result.steps:
        if step.in_flight < result.full:
            break
        end, tokens = step.ended_s, tokens + step.tokens
    return None if end is None or tokens == 0 else (end - result.started_s, tokens)


def energy_used(result: DriveResult) -> tuple[float | None, float | None]:
    """Joules the engine's GPUs used over the whole run and over its steady window (steady_window), from the
    meter's readings at their edges; None where a reading is missing."""
    start, window_end, end = result.energy_j or (None, None, None)
    return (None if start is None or end is None else end - start,
            None if start is None or window_end is None else window_end - start)


def summarise(result: DriveResult, spec: WorkloadSpec, price: Price) -> dict[str, Any]:
    """The measured part of a record, from the driver's per-request and per-step timings (and the energy
    meter's readings, if it had one)."""
    done = [t for t in result.timings if t.finished_s is not None]
    started = [t for t in done if t.first_token_s is not None]
    ttft = [t.first_token_s - t.scheduled_s for t in started]  # from when it was due, not when it got in
    tpot = [(t.finished_s - t.first_token_s) / (t.output_tokens - 1) for t in started if t.output_tokens > 1]
    itl = [b - a for t in done for a, b in zip(t.token_times, t.token_times[1:], strict=False)]
    e2e = [t.finished_s - t.scheduled_s for t in done]
    late = [t.submitted_s - t.scheduled_s for t in result.timings]
    input_tokens = sum(t.prompt_tokens for t in done)
    output_tokens = sum(t.output_tokens for t in done)
    wall_s = result.wall_s
    energy_j, steady_j = energy_used(result)
    out: dict[str, Any] = {
        "wall_s": wall_s,
        "requests_completed": len(done),
        "requests_failed": len(result.timings) - len(done),
        "requests_wrong_length": sum(1 for t in done if t.output_tokens != t.output_len),
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "output_tokens_per_s": output_tokens / wall_s if wall_s > 0 else None,
        # closed loop: cost of this fixed work; open loop: cost at the offered load (follows the arrivals)
        "cost_basis": "fixed_work" if spec.loop == "closed" else "offered_load",
        "usd_per_mtok": usd_per_mtok(price, wall_s, output_tokens, energy_j),
        # every token the engine processed (prompt + output) over the same wall time; not an input/output split
        "usd_per_mtok_total": usd_per_mtok(price, wall_s, input_tokens + output_tokens, energy_j),
        "peak_kv_cache_usage": result.peak_kv_cache_usage,
        "latency_s": {"ttft": percentiles(ttft), "tpot": percentiles(tpot), "itl": percentiles(itl),
                      "e2e": percentiles(e2e)},
    }
    if result.energy_j is not None:
        out.update(energy_j=energy_j, j_per_output_token=joules_per_token(energy_j, output_tokens))
    window = steady_window(result)
    if window is not None:
        seconds, tokens = window
        out["steady"] = {"usd_per_mtok": usd_per_mtok(price, seconds, tokens, steady_j), "window_s": seconds,
                         "output_tokens": tokens, "drain_share": 1 - seconds / wall_s if wall_s > 0 else 0.0,
                         "in_flight": result.full}
        if result.energy_j is not None:
            out["steady"].update(energy_j=steady_j, j_per_output_token=joules_per_token(steady_j, tokens))
    if spec.loop == "open":
        out["lateness_s"] = {**percentiles(late), "max": max(late) if late else None,
                             "beyond_steps_p99": behind_schedule(result)}
        # every request's arrival offset, TTFT and TPOT (attainment of any SLO, computed later: capacity) and
        # lateness (its TTFT from when it was sent, as other clients count it, is TTFT less lateness)
        out["requests_s"] = [[round(t.scheduled_s - result.started_s, 6),
                              None if t.first_token_s is None or t.finished_s is None
                              else round(t.first_token_s - t.scheduled_s, 6),
                              None if t.first_token_s is None or t.finished_s is None or t.output_tokens < 2
                              else round((t.finished_s - t.first_token_s) / (t.output_tokens - 1), 6),
                              round(t.submitted_s - t.scheduled_s, 6)]
                             for t in result.timings]
        p50_ttft = out["latency_s"]["ttft"]["p50"] or 0.0
        if late and out["lateness_s"]["p99"] > max(LATE_NOTE_S, 0.1 * p50_ttft):
            out.setdefault("notes", []).append(
                f"requests reached the engine late (p99 {out['lateness_s']['p99'] * 1e3:.1f} ms after their arrival: "
                "the driver adds them between engine steps); latency counts from the arrival, so it includes this")
    return out


def record_header(engine: Engine, flags: Mapping[str, Any], spec: WorkloadSpec, price: Price, *, run_id: str,
                  arm: str, position: int, environment: Mapping[str, Any] | None = None,
                  context: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What every record says before anything is measured: which arm, flags, work and price (every GPU the
    engine holds is charged)."""
    price = price.charged(flags)
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
        **({"usd_per_kwh": price.usd_per_kwh} if price.usd_per_kwh is not None else {}),
        "workload": asdict(spec),
        "environment": dict(environment if environment is not None else engine.environment()),
        "node": socket.gethostname(),
        "started_at": now_iso(),
        **dict(context or {}),
    }


def failed_record(header: dict[str, Any], reason: str, **extra: Any) -> dict[str, Any]:
    """A replicate that produced no measurement (the slot lost it); kept so nothing disappears silently."""
    return {**header, "status": "failed", "reason": reason, "ended_at": now_iso(), **extra}


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
    energy: Meter | str | None = None,
) -> dict[str, Any]:
    """Measure once on a fresh engine, started here and shut down after (mode=measure). The returned record
    has status 'ok', or 'failed' with the engine's reason. `energy`: the GPUs' meter, or why there is none
    (default: energy.meter_for the engine)."""
    record = record_header(engine, flags, spec, price, run_id=run_id, arm=arm, position=position,
                           environment=environment, context=context)
    session = None
    try:
        session = engine.start(flags)
        record["engine_start_s"] = session.start_seconds
        measure_on(session, flags, spec, price, record,
                   energy=meter_for(engine.name, flags) if energy is None else energy)
    except EngineStartError as exc:
        record.update(status="failed", reason=str(exc), failed_at="start")
    except Exception as exc:  # an engine bug must not take the caller down; keep its trace in the record
        record.update(status="failed", reason=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc(limit=8),
                      failed_at="start")
    finally:
        if session is not None:
            try:
                session.close()
            except Exception as exc:  # noqa: BLE001 - a failed shutdown is worth a note, not a crash
                record["shutdown_error"] = f"{type(exc).__name__}: {exc}"
    record["ended_at"] = now_iso()
    return record


def judge(record: dict[str, Any], result: DriveResult) -> None:
    """A measured run's status: 'failed' if it was not the fixed work asked for, 'void' if its client was
    the bottleneck (client_bound), else 'ok'."""
    record["status"], record["reason"] = "ok", None
    if record["requests_failed"]:
        record.update(status="failed", reason=f"{record['requests_failed']} requests did not finish")
    elif record["requests_wrong_length"]:
        wrong = next(t for t in result.timings if t.output_tokens != t.output_len)
        record.update(status="failed", reason=(
            f"{record['requests_wrong_length']} requests did not produce exactly their output length (e.g. "
            f"{wrong.request_id}: {wrong.output_tokens} of {wrong.output_len} tokens; cut short by "
            "max_model_len?): not the fixed work asked for"))
    elif why := client_bound(record.get("client")):
        record.update(status="void", reason=why, void=why)


def judge_energy(record: dict[str, Any], energy: Meter | str | None, price: Price) -> None:
    """Why the replicate has no energy reading, if it has none (kept in the record; the run says it once);
    with a price of energy, such a replicate cannot be priced, so it fails."""
    if record.get("energy_j") is not None:
        return
    if energy is not None:
        record["energy_off"] = energy if isinstance(energy, str) else energy.off or "the meter gave no reading"
    if price.usd_per_kwh is not None and is_ok(record):
        record.update(status="failed", reason=(
            f"cost.usd_per_kwh={price.usd_per_kwh:g} prices the energy the GPUs use, but this replicate has no "
            f"energy reading ({record.get('energy_off') or 'this engine runs on no GPU'}): its cost cannot be "
            "priced"))


def measure_on(session: EngineSession, flags: Mapping[str, Any], spec: WorkloadSpec, price: Price,
               record: dict[str, Any], *, cold: bool = True, energy: Meter | str | None = None) -> dict[str, Any]:
    """One replicate on a running engine: warm-up requests (on a `cold` engine, one that has not run this
    workload yet), the fixed work, the engine's own counters, and with a meter (`energy`) the energy its GPUs
    used (else `energy` says why none was measured). Fills `record` (status 'ok', or 'failed' with the
    reason) and returns it; never raises for the engine's faults."""
    price = price.charged(flags)
    meter = energy if isinstance(energy, Meter) else None
    record["kv_cache"] = {"blocks": getattr(session, "kv_blocks", None),
                          "block_size": getattr(session, "kv_block_size", None)}
    if (log := getattr(session, "log_path", None)) is not None:  # a server's own log (backend=server)
        record["server_log"] = str(log)
    if (core := getattr(session, "engine_core", None)) is not None:  # in-process | multiprocess (vLLM's own)
        record["engine_core"] = core
    if (sampling := getattr(session, "sampling_defaults", None)) is not None:  # the model's generation_config
        record["sampling_defaults"] = dict(sampling)
    if served := getattr(session, "served_defaults", None):  # defaults the engine resolved as `vllm serve` does
        record["served_defaults"] = dict(served)
        record["engine_flags"] = {**record.get("engine_flags", {}), **served}
    try:
        batch = flags.get("max_num_seqs") or getattr(session, "max_num_seqs", None)
        warmup = make_requests(spec, warmup=True, batch=batch) if cold else []
        record["warmup_requests"] = len(warmup)
        if warmup:  # one full batch of the engine, short requests: every batch size the run will see, cheaply
            drive(session, warmup, loop="closed", concurrency=spec.concurrency)
            if hasattr(session, "reset_prefix_cache"):  # they share the work's prefix: the measured part starts
                session.reset_prefix_cache()            # with an empty cache, like every replicate
        if getattr(session, "prefix_cache_reset", None) is not None:  # did the last reset work (HTTP backends)
            record["prefix_cache_reset"] = session.prefix_cache_reset
        before = session.preemptions()
        cache_before = session.prefix_cache() if hasattr(session, "prefix_cache") else None
        load = getattr(session, "client_load", None)  # an HTTP client's own load (the warm-up's is not this run's)
        if load is not None:
            load()
        result = drive(session, make_requests(spec), loop=spec.loop, concurrency=spec.concurrency,
                       batch_limit=getattr(session, "max_num_seqs", None) or flags.get("max_num_seqs"),
                       meter=None if meter is None else meter.joules)
        record.update(summarise(result, spec, price))
        if load is not None:
            record["client"] = load()
        record["preemptions"] = session.preemptions() - before
        if getattr(session, "engine_steps", False):  # the driver saw the engine's own steps: its schedule
            record["engine_schedule"] = {"fingerprint": result.schedule, "steps": len(result.steps)}
        if cache_before is not None:  # prompt tokens served from the prefix cache during the measured part
            queries, hits = (after - was for after, was in zip(session.prefix_cache(), cache_before, strict=True))
            record["prefix_cache"] = {"queries": queries, "hits": hits,
                                      "hit_rate": hits / queries if queries else None}
        judge(record, result)
        judge_energy(record, energy, price)
    except EngineRunError as exc:
        record.update(status="failed", reason=str(exc), failed_at="run")
    except Exception as exc:  # an engine bug must not take the sweep down; keep its trace in the record
        record.update(status="failed", reason=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc(limit=8),
                      failed_at="run")
    return record


TIMER_TICKS = 1000  # measured work should span at least this many ticks of the clock that times it


def short_work_note(records: Sequence[Mapping[str, Any]]) -> str | None:
    """Work too short for its timer: under TIMER_TICKS ticks, timer steps weigh in the cost per token, which
    changes how to read the answer. A start longer than the work does not: the judged cost leaves the start
    out (the budget and the plan count it as machine time)."""
    tick = time.get_clock_info("perf_counter").resolution
    for r in records:
        wall = r.get("wall_s")
        if is_ok(r) and wall and wall < TIMER_TICKS * tick:
            return (f"a replicate's measured work took {wall:.2g} s, under {TIMER_TICKS} ticks of the timer "
                    f"({tick:g} s each), so timer steps weigh in its cost per token; raise workload.num_requests "
                    "(or output_len)")
    return None


def closing_notes(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """What a run says once, at its end, of all its replicates: work too short for its timer, energy that was
    not measured (and why)."""
    return [n for n in (short_work_note(records), energy_note(records)) if n is not None]


def p95_text(latency: Mapping[str, Any], kind: str, spec: str, scale: float = 1e3) -> str:
    """A run's p95 of `kind` (in ms by default) as `spec` formats it; "-" where it has no samples (a stream
    whose tokens came in one or two chunks has no gaps between them: no TPOT, no ITL)."""
    value = latency[kind]["p95"]
    return "-".rjust(int(spec.split(".")[0] or 0)) if value is None else format(value * scale, spec)


def one_line(record: Mapping[str, Any], price: Price) -> str:
    """The one-line result users read: throughput, cost, preemptions, tail latency."""
    price = price.charged(record.get("flags") or {})
    if record.get("void"):
        return f"VOID: {record['void']}"
    if not is_ok(record):
        return f"FAILED ({record.get('failed_at', 'run')}): {record.get('reason')}"
    lat = record["latency_s"]
    steady = record.get("steady")
    if steady:
        cost = (f"${steady['usd_per_mtok']:.4f}/M output tokens steady{joules_text(steady)} ({price.label()}; "
                f"${record['usd_per_mtok']:.4f}/M for the whole fixed work, {100 * steady['drain_share']:.0f}% of it "
                "draining)")
    else:
        cost = (f"${record['usd_per_mtok']:.4f}/M output tokens at the offered load{joules_text(record)} "
                f"({price.label()})")
    line = (f"{record['output_tokens_per_s']:.1f} output tok/s  {cost}  preemptions={record['preemptions']}  "
            f"p95 TTFT={p95_text(lat, 'ttft', '.1f')} ms  p95 TPOT={p95_text(lat, 'tpot', '.2f')} ms  "
            f"p95 ITL={p95_text(lat, 'itl', '.2f')} ms  p95 E2E={p95_text(lat, 'e2e', '.3f', scale=1)} s  "
            f"(percentiles of {lat['e2e']['n']} requests)")
    return "\n".join([line, *(f"note: {n}" for n in record.get("notes", []))])
