"""The in-process engine runs the batch defaults `vllm serve` would (vLLM's `LLM` class has others), records
them, and the export serves them. Real vLLM CPU build; on a GPU the same code resolves that GPU's defaults
(H100: 8192 tokens served against 16384 offline), which only a GPU can show."""

from __future__ import annotations

from throttle_sweep.cost import Price
from throttle_sweep.engines import VllmInprocEngine
from throttle_sweep.measure import measure_replicate
from throttle_sweep.workload import WorkloadSpec

FLAGS = {"max_model_len": 1024, "kv_cache_memory_bytes": 2359296, "enforce_eager": True, "seed": 0}


def test_flags_left_to_vllm_run_with_the_servers_defaults_and_are_recorded():
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    engine = VllmInprocEngine()
    flags = engine.engine_flags(FLAGS)
    offline = EngineArgs(**flags).create_engine_config(UsageContext.LLM_CLASS).scheduler_config
    served = EngineArgs(**flags).create_engine_config(UsageContext.OPENAI_API_SERVER).scheduler_config
    assert (offline.max_num_seqs, offline.max_num_batched_tokens) != (served.max_num_seqs, served.max_num_batched_tokens)
    spec = WorkloadSpec(num_requests=4, prompt_len=16, output_len=8, concurrency=4)
    record = measure_replicate(engine, FLAGS, spec, Price(), run_id="t", arm="measure", position=0)
    assert record["status"] == "ok", record.get("reason")
    assert record["served_defaults"] == {"max_num_seqs": served.max_num_seqs,
                                         "max_num_batched_tokens": served.max_num_batched_tokens}
    assert record["engine_flags"]["max_num_batched_tokens"] == served.max_num_batched_tokens


def test_the_running_scheduler_has_the_servers_values():
    engine = VllmInprocEngine()
    session = engine.start(FLAGS)
    try:
        scheduler = session._scheduler
        assert (scheduler.max_num_running_reqs, scheduler.max_num_scheduled_tokens) == (
            session.served_defaults["max_num_seqs"], session.served_defaults["max_num_batched_tokens"])
    finally:
        session.close()
