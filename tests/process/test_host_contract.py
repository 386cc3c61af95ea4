"""The unit tier measures the fake engine in-thread (engines.thread_host.InThreadHost); production measures
every engine in a process of its own (EngineHost). The fast tier is worth only what the two share: the same
replicates through either give the same records, apart from where and when they ran."""

from __future__ import annotations

from throttle_sweep.cluster.host import EngineHost
from throttle_sweep.cluster.slot import WarmSlot
from throttle_sweep.cluster.thread_host import InThreadHost
from throttle_sweep.engines import FakeEngine, FakeKnobs
from throttle_sweep.measurement.cost import Price
from throttle_sweep.measurement.workload import WorkloadSpec

# where and when a replicate ran: the only things the two hosts may differ in
WHERE_AND_WHEN = {"record_id", "started_at", "ended_at", "environment", "pid", "id", "host"}


def comparable(value):
    if isinstance(value, dict):
        return {k: comparable(v) for k, v in value.items() if k not in WHERE_AND_WHEN}
    if isinstance(value, list):
        return [comparable(v) for v in value]
    return value


def measured_through(host, restart: str) -> list[dict]:
    spec = WorkloadSpec(num_requests=12, prompt_len=16, output_len=32, concurrency=12, warmup_requests=0)
    engine = FakeEngine(FakeKnobs(noise_sd=0.03, lifetime_sd=0.02, drift_per_start=0.01, seed=7,
                                  kv_bytes_per_token=1024, fail_start_when={"max_num_seqs": 16}))
    slot = WarmSlot(engine, spec, Price(), run_id="t", restart=restart, engine_warmup="first")
    slot.make_host = host
    flags = {"kv_cache_memory_bytes": 24 * 16 * 1024, "block_size": 16}
    plan = [(2, "baseline"), (12, "candidate"), (12, "candidate"), (2, "baseline"), (32, "candidate")]
    try:
        return [slot.measure({**flags, "max_num_seqs": n}, arm, position, {"stage": "search"})
                for position, (n, arm) in enumerate(plan)]
    finally:
        slot.close()


def test_an_engine_in_thread_measures_what_an_engine_process_measures():
    for restart in ("never", "per_replicate"):
        in_process = measured_through(EngineHost, restart)
        in_thread = measured_through(InThreadHost, restart)
        assert [r["status"] for r in in_thread] == ["ok", "ok", "ok", "ok", "failed"]  # 32: the start is refused
        assert any(r["preemptions"] for r in in_thread[:4])  # 12 at once preempt in this KV cache
        assert comparable(in_thread) == comparable(in_process), restart
