"""The in-process engine runs the batch defaults `vllm serve` would (vLLM's `LLM` class has others), records
them, and the export serves them. Real vLLM CPU build; on a GPU the same code resolves that GPU's defaults
(H100: 8192 tokens served against 16384 offline), which only a GPU can show."""

from __future__ import annotations

from throttle_sweep.engines import VllmInprocEngine
from throttle_sweep.measurement.cost import Price
from throttle_sweep.measurement.replicate import measure_replicate
from throttle_sweep.measurement.workload import WorkloadSpec

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


def test_requests_get_the_models_generation_config_as_the_api_server_applies_it(tmp_path):
    """A copy of the tiny model that carries a generation_config.json: its sampling defaults apply under
    what the request sets (as vLLM's server does for the same request body), and are recorded."""
    import json
    import shutil

    from throttle_sweep.engines.base import Request
    from throttle_sweep.models import TINY_QWEN2

    model = tmp_path / "tiny-with-generation-config"
    shutil.copytree(TINY_QWEN2, model)
    (model / "generation_config.json").write_text(json.dumps({"top_k": 20, "top_p": 0.8, "repetition_penalty": 1.05,
                                                               "temperature": 0.7, "max_new_tokens": 3}))
    flags = {**FLAGS, "model": str(model), "load_format": "dummy", "skip_tokenizer_init": True}
    session = VllmInprocEngine().start(flags)
    try:
        params = session.params(Request("r", 16, (11, 12, 13), None, 0.0))
        assert (params.top_k, params.top_p, params.repetition_penalty) == (20, 0.8, 1.05)
        assert (params.max_tokens, params.min_tokens, params.temperature, params.ignore_eos) == (16, 16, 1.0, True)
        assert params.detokenize is False  # no tokenizer here; a real model's are detokenized, as served
    finally:
        session.close()
    spec = WorkloadSpec(num_requests=4, prompt_len=16, output_len=8, concurrency=4)
    record = measure_replicate(VllmInprocEngine(), flags, spec, Price(), run_id="t", arm="measure", position=0)
    assert record["status"] == "ok" and record["output_tokens"] == 32  # fixed work still: max_new_tokens is ours
    assert record["sampling_defaults"]["top_k"] == 20
