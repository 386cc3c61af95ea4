"""An engine's warm-up run (engine_warmup: a process's first engine runs the work once, unmeasured) warms what
makes a first run slow, every batch size the work reaches, with the workload's short warm-up outputs: the whole
work would double the first run's cost (on a GPU, minutes before the sweep's plan)."""

from __future__ import annotations

from throttle_sweep.cluster.slot import WarmSlot
from throttle_sweep.engines.fake import FakeEngine, FakeKnobs
from throttle_sweep.measurement.cost import Price
from throttle_sweep.measurement.workload import WorkloadSpec


def test_the_engine_warm_up_runs_every_request_with_the_short_warm_up_output():
    spec = WorkloadSpec(num_requests=64, prompt_len=16, output_len=128, concurrency=16, warmup_output_len=8)
    s = WarmSlot(FakeEngine(FakeKnobs()), spec, Price(), run_id="t", environment={}, engine_warmup="first")
    try:
        record = s.measure({"max_num_seqs": 16}, "baseline", 0, {"stage": "search"})
    finally:
        s.close()
    assert record["status"] == "ok" and record["engine_warmup_s"] > 0
    # 64 requests of 8 tokens against 128: a sixteenth of the decode steps (prefill and the run's own warm-up
    # requests beside), never the whole work again
    assert record["engine_warmup_s"] < record["wall_s"] / 8
