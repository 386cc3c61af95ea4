"""The GPU twin: its calibration against the published A100 experiment, the KV cache vLLM's profiling would
give, the refusals in vLLM's words, CUDA graph padding, start costs, and async scheduling's jitter. The twin
predicts; these tests hold it to what it was calibrated on and to its own rules, not to a GPU."""

from __future__ import annotations

import random

import pytest

from throttle_sweep.engines.base import Request
from throttle_sweep.engines.twin import TwinConf, TwinEngine
from throttle_sweep.engines.twin.gpus import GIB, gpu_spec
from throttle_sweep.engines.twin.model_shape import load_shape
from throttle_sweep.engines.twin.step_time import Batch
from throttle_sweep.errors import ConfigError, EngineStartError
from throttle_sweep.models import QWEN2_5_0_5B, QWEN2_5_7B

QWEN = "Qwen/Qwen2.5-0.5B-Instruct"


def closed_loop(session, *, requests: int, in_flight: int, prompt: int = 256, output: int | list[int] = 256,
                index: int = 0):
    """Fixed work through a session as the workload driver runs it: output tokens/s and preemptions."""
    session.begin_replicate(index)
    before = session.preemptions()  # cumulative over the engine's life
    lengths = output if isinstance(output, list) else [output] * requests
    queue = iter(Request(f"r{i}", lengths[i], tuple(range(prompt))) for i in range(requests))
    for _ in range(in_flight):
        session.add(next(queue))
    tokens = 0
    while session.has_unfinished():
        for event in session.step():
            if event.finished:
                tokens += event.output_tokens
                if (nxt := next(queue, None)) is not None:
                    session.add(nxt)
    return tokens / session.now(), session.preemptions() - before


def test_the_a100_twin_reproduces_the_published_experiment_it_was_calibrated_on():
    """Qwen2.5-0.5B on an A100, eight in flight: about 516 output tokens/s at max_num_seqs=1 and 1,650 at 8
    ($0.748 and $0.234 per million at $1.39/h)."""
    engine = TwinEngine(TwinConf(gpu="A100", noise_sd=0.0))
    one, _ = closed_loop(engine.start({"model": QWEN, "max_num_seqs": 1}), requests=64, in_flight=8)
    eight, _ = closed_loop(engine.start({"model": QWEN, "max_num_seqs": 8}), requests=64, in_flight=8)
    assert one == pytest.approx(516, rel=0.03) and eight == pytest.approx(1650, rel=0.03)
    assert 1.39 / 3600 / (eight / 1e6) / (1.39 / 3600 / (one / 1e6)) == pytest.approx(0.314, abs=0.01)


def nano_vllm_bench(session) -> float:
    """nano-vllm's bench.py as its vLLM line runs it: 256 requests at once, prompts of 100-1024 random tokens and
    100-1024 output tokens drawn from random.seed(0) in its order (133,966 output tokens), through LLM.generate."""
    rng = random.Random(0)
    prompts = [[rng.randint(0, 10000) for _ in range(rng.randint(100, 1024))] for _ in range(256)]
    outputs = [rng.randint(100, 1024) for _ in range(256)]
    assert sum(outputs) == 133_966
    session.begin_replicate(0)
    for i, (prompt, output) in enumerate(zip(prompts, outputs, strict=True)):
        session.add(Request(f"r{i}", output, tuple(prompt)))
    while session.has_unfinished():
        session.step()
    return sum(outputs) / session.now()


def test_the_large_batch_host_reproduces_the_published_offline_a800_run():
    """vLLM 0.10.2's offline LLM on an A800-SXM4-80GB (an A100 by bandwidth and FLOP/s; LLM-class defaults
    for that name, 1024 sequences and 16384 tokens), Qwen2.5-0.5B, nano-vllm's bench: 17,711 output tokens/s
    (cosmoliu2002/nano-vllm-triton issue #1). The seed's host, extrapolated to 256 sequences, predicts about
    2,300: ten times less (docs/twin.md, Calibration)."""
    flags = {"model": QWEN, "max_num_seqs": 1024, "max_num_batched_tokens": 16384, "max_model_len": 4096}
    large = nano_vllm_bench(TwinEngine(TwinConf(gpu="A100", noise_sd=0.0, host="large-batch")).start(flags))
    seed = nano_vllm_bench(TwinEngine(TwinConf(gpu="A100", noise_sd=0.0)).start(flags))
    assert large == pytest.approx(17_711, rel=0.03)
    assert seed < large / 5


def test_a_host_the_twin_does_not_know_is_named_with_those_it_does():
    with pytest.raises(ConfigError, match=r"twin.host must be one of large-batch, seed.*'fast'"):
        TwinEngine(TwinConf(host="fast")).start({"model": QWEN})


def test_the_model_shape_is_read_from_config_json():
    small, large = load_shape(QWEN2_5_0_5B), load_shape(QWEN2_5_7B)
    assert small.weight_bytes / 2 == pytest.approx(0.494e9, rel=0.01)  # Qwen2.5-0.5B: 0.49B parameters
    assert large.weight_bytes / 2 == pytest.approx(7.61e9, rel=0.01)  # Qwen2.5-7B: 7.61B
    assert small.kv_bytes_per_token() == 2 * 24 * 2 * 64 * 2 and large.kv_bytes_per_token() == 2 * 28 * 4 * 128 * 2


def test_the_kv_cache_is_what_gpu_memory_utilization_leaves_after_weights_activations_and_graphs():
    engine = TwinEngine(TwinConf(gpu="H100"))
    blocks = {u: engine.start({"model": QWEN, "gpu_memory_utilization": u}).kv_blocks for u in (0.5, 0.7, 0.9)}
    per_block = 16 * 12288
    assert blocks[0.5] < blocks[0.7] < blocks[0.9]
    # each 0.2 of the GPU is 0.2 x its memory of KV cache, whatever else the profile counted
    assert (blocks[0.9] - blocks[0.7]) * per_block == pytest.approx(0.2 * gpu_spec("H100").memory_bytes, rel=0.001)
    # a larger batch budget leaves less: its activation peak is profiled
    assert engine.start({"model": QWEN, "max_num_batched_tokens": 32768}).kv_blocks < blocks[0.9]


def test_a_kv_cache_too_small_for_one_request_is_refused_in_vllms_words():
    engine = TwinEngine(TwinConf(gpu="L4"))
    with pytest.raises(EngineStartError, match="No available memory for the cache blocks"):
        engine.start({"model": "Qwen/Qwen2.5-7B-Instruct", "gpu_memory_utilization": 0.5})
    with pytest.raises(EngineStartError, match=r"max seq len \(32768\).*estimated maximum model length"):
        engine.start({"model": "Qwen/Qwen2.5-7B-Instruct", "gpu_memory_utilization": 0.75})
    assert engine.start({"model": "Qwen/Qwen2.5-7B-Instruct", "gpu_memory_utilization": 0.75,
                         "max_model_len": 4096}).kv_blocks > 0


def test_a_decode_batch_runs_the_cuda_graph_it_is_padded_to():
    roofline = TwinEngine(TwinConf(gpu="H100")).start({"model": QWEN, "max_num_seqs": 64}).roofline
    def gpu(seqs: int) -> float:  # the same KV read, so that only the padding differs
        return roofline.gpu_seconds(Batch(0, seqs, 16 * 512, seqs, seqs))
    assert roofline.padded(9) == 16 and roofline.padded(16) == 16 and roofline.padded(129) == 129  # above 2 x 64
    assert gpu(9) == pytest.approx(gpu(16), rel=0.01)  # KV reads apart, the padded batch's work
    eager = TwinEngine(TwinConf(gpu="H100")).start({"model": QWEN, "max_num_seqs": 64, "enforce_eager": True})
    assert eager.roofline.padded(9) == 9
    assert eager.roofline.gpu_seconds(Batch(0, 16, 16 * 512, 16, 16)) > gpu(16)  # kernel launches


def test_an_engine_start_costs_compile_once_per_model_and_graph_capture_per_size():
    engine = TwinEngine(TwinConf(gpu="H100"))
    first, again = engine.start({"model": QWEN}), engine.start({"model": QWEN})
    eager = engine.start({"model": QWEN, "enforce_eager": True})
    assert first.start_seconds - again.start_seconds == pytest.approx(30.0 - 6.0)
    assert eager.start_seconds < again.start_seconds
    assert first.served_defaults == {"max_num_seqs": 1024, "max_num_batched_tokens": 8192}  # vllm serve on an H100
    a100 = TwinEngine(TwinConf(gpu="A100")).start({"model": QWEN})
    assert a100.served_defaults == {"max_num_seqs": 256, "max_num_batched_tokens": 2048}
    assert a100.max_num_seqs == 256


def test_jitter_makes_preemption_counts_near_the_boundary_differ_between_repeats():
    """Qwen2.5-7B with a KV cache that 104 sequences of mixed lengths overfill: without jitter every repeat
    preempts the same; with it (async scheduling) the counts differ. (With equal lengths the waves keep in step
    and the counts stay equal even with jitter.)"""
    flags = {"model": "Qwen/Qwen2.5-7B-Instruct", "max_num_seqs": 104, "num_gpu_blocks_override": 2450,
             "max_model_len": 4096}
    lengths = [128 + (i * 97) % 257 for i in range(416)]  # 128 to 384 output tokens
    def counts(jitter: float) -> set[int]:
        session = TwinEngine(TwinConf(gpu="H100", jitter=jitter)).start(flags)
        return {closed_loop(session, requests=416, in_flight=104, output=lengths, index=i)[1] for i in range(4)}
    steady = counts(0.0)
    assert len(steady) == 1 and steady.pop() > 0
    assert len(counts(0.3)) > 1


def test_an_unknown_gpu_or_model_is_named_with_what_the_twin_knows(tmp_path):
    with pytest.raises(ConfigError, match=r"twin.gpu: unknown GPU 'H10'.*H100-80GB"):
        TwinEngine(TwinConf(gpu="H10"))
    with pytest.raises(ConfigError, match="twin.gpu.memory_gib must be a positive number"):
        TwinEngine(TwinConf(gpu={"name": "mine", "memory_gib": -1, "bandwidth_gb_s": 900, "bf16_tflops": 200}))
    own = TwinEngine(TwinConf(gpu={"name": "mine", "memory_gib": 48, "bandwidth_gb_s": 900, "bf16_tflops": 200}))
    assert own.gpu.memory_bytes == 48 * GIB
    with pytest.raises(ConfigError, match="engine.model='org/unknown'.*fetches nothing"):
        own.start({"model": "org/unknown"})
    with pytest.raises(ConfigError, match="twin.jitter must be a probability"):
        TwinEngine(TwinConf(jitter=2))


def test_measured_kernels_are_an_optional_extra_named_where_it_is_missing(monkeypatch):
    """twin.step_time=aiconfigurator without aiconfigurator-core installed: the extra is named, before a run."""
    import sys

    from throttle_sweep.engines.twin import aiconfigurator

    monkeypatch.setitem(sys.modules, "aiconfigurator_core", None)  # an import of it fails, installed or not
    aiconfigurator._model.cache_clear()
    with pytest.raises(ConfigError, match=r"twin.step_time=aiconfigurator needs the optional extra: pip install "
                                          r"'throttle-sweep\[twin-aic\]'"):
        TwinEngine(TwinConf(gpu="H100", step_time="aiconfigurator")).start({"model": QWEN})
    aiconfigurator._model.cache_clear()


def test_measured_kernels_on_a_gpu_they_do_not_cover_and_an_unknown_step_time_are_refused():
    with pytest.raises(ConfigError, match=r"no vLLM data for twin.gpu=L4: it covers H100-80GB, H200, A100-80GB"):
        TwinEngine(TwinConf(gpu="L4", step_time="aiconfigurator")).start({"model": QWEN})
    with pytest.raises(ConfigError, match=r"twin.step_time must be one of roofline, aiconfigurator.*'kernels'"):
        TwinEngine(TwinConf(step_time="kernels"))


def test_measured_kernels_set_the_gpus_part_of_a_step_where_the_extra_is_installed():
    """Where aiconfigurator-core is installed (the twin-aic extra; not in CI): a 1-sequence decode step of
    Qwen2.5-0.5B on the H100 takes 1.19 ms of GPU time in its measured kernels (the roofline says 1.55), and
    the host's part stays the twin's (benchmarks/twin_step_time.py puts the two side by side)."""
    pytest.importorskip("aiconfigurator_core")
    flags = {"model": QWEN, "max_num_seqs": 8}
    measured = TwinEngine(TwinConf(gpu="H100", step_time="aiconfigurator")).start(flags).roofline
    modelled = TwinEngine(TwinConf(gpu="H100")).start(flags).roofline
    step = Batch(prefill_tokens=0, decode_seqs=1, kv_tokens=300, sampled=1, seqs=1)
    assert measured.gpu_seconds(step) == pytest.approx(1.194e-3, rel=0.02)
    assert modelled.gpu_seconds(step) == pytest.approx(1.55e-3, rel=0.02)
    assert measured.host_seconds(step) == modelled.host_seconds(step)
