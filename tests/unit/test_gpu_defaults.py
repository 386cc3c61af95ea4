"""engine=gpu sweeps against what users run untuned, vLLM's own defaults, over a range that contains them;
the embedded CPU default keeps the published experiment's baseline of max_num_seqs=1."""

from __future__ import annotations

import optuna

from tests.helpers import compose_cfg
from throttle_sweep.settings.sections import arm_flags, plain, workload_from
from throttle_sweep.sweep.space import build_space, within_in_flight

VLLM_SERVED = {"max_num_seqs": (256, 1024), "max_num_batched_tokens": (2048, 8192, 16384)}  # A100, H100, B200


def space_of(cfg):
    from throttle_sweep.engines.fake import FAKE_FLAG_SCHEMA

    spec = workload_from(cfg)
    dists = build_space(plain(cfg.space), FAKE_FLAG_SCHEMA, source="space")
    return within_in_flight(dists, min(spec.concurrency, spec.num_requests), source="space")[0]


def test_on_a_gpu_the_baseline_is_vllms_default_and_the_space_straddles_it():
    cfg = compose_cfg("engine=gpu", "+space=batching")
    baseline = arm_flags(arm_flags(plain(cfg.engine)), plain(cfg.baseline))
    assert baseline.get("max_num_seqs") is None and baseline.get("max_num_batched_tokens") is None
    dists = space_of(cfg)
    seqs, tokens = dists["max_num_seqs"], dists["max_num_batched_tokens"]
    assert isinstance(seqs, optuna.distributions.IntDistribution)
    assert all(seqs.low < v < seqs.high for v in VLLM_SERVED["max_num_seqs"])
    assert min(tokens.choices) < min(VLLM_SERVED["max_num_batched_tokens"])
    assert max(tokens.choices) > max(VLLM_SERVED["max_num_batched_tokens"])
    assert set(VLLM_SERVED["max_num_batched_tokens"]) <= set(tokens.choices)


def test_the_embedded_cpu_default_keeps_the_published_baseline_of_one():
    cfg = compose_cfg("+space=batching")
    assert plain(cfg.baseline)["max_num_seqs"] == 1
    assert space_of(cfg)["max_num_seqs"].high == 16  # what its workload keeps in flight


def test_reports_name_the_baseline_and_say_which_flags_are_vllms_defaults():
    from throttle_sweep.sweep.report import baseline_words

    assert baseline_words({"max_num_seqs": 1}) == (
        "the baseline max_num_seqs=1 (max_num_batched_tokens: vLLM's default, as `vllm serve` resolves it)")
    assert baseline_words({"max_model_len": 4096}) == ("the baseline (max_num_seqs, max_num_batched_tokens: vLLM's "
                                                       "defaults, as `vllm serve` resolves them)")
    assert baseline_words({"max_num_seqs": 8, "max_num_batched_tokens": 2048}) == (
        "the baseline max_num_seqs=8 max_num_batched_tokens=2048")


def test_on_a_gpu_the_context_length_is_the_models_own():
    """engine=gpu leaves max_model_len to the model (Qwen2.5 serves 32768), so the export does not cap what
    production accepts; the workload's lengths are still checked against the model's own limit."""
    from dataclasses import replace

    import pytest

    from throttle_sweep.engines import FakeEngine
    from throttle_sweep.errors import ConfigError
    from throttle_sweep.models import QWEN2_5_0_5B
    from throttle_sweep.settings.sections import preflight

    cfg = compose_cfg("engine=gpu", "backend=fake", f"engine.model={QWEN2_5_0_5B}", "workload.prompt_len=8192",
                      "workload.num_requests=2", "workload.concurrency=2")  # two requests show the lengths
    flags = arm_flags(arm_flags(plain(cfg.engine)), plain(cfg.baseline))
    assert "max_model_len" not in flags
    spec = workload_from(cfg)
    preflight(FakeEngine(), flags, spec, source="baseline")  # 8192 + 256 tokens: beyond 4096, within 32768
    with pytest.raises(ConfigError, match="max_model_len=32768"):
        preflight(FakeEngine(), flags, replace(spec, prompt_len=32768), source="baseline")


def test_a_hub_models_length_limit_is_read_from_the_local_cache(tmp_path, monkeypatch):
    """A model named by its hub name is checked against its config.json where this machine's Hugging Face
    cache holds it (nothing is fetched)."""
    import json

    from throttle_sweep import models

    snapshot = tmp_path / "config.json"
    snapshot.write_text(json.dumps({"max_position_embeddings": 32768}))
    monkeypatch.setattr(models, "cached_config", lambda model: str(snapshot) if model == "org/m" else None)
    assert models.model_config("org/m") == {"max_position_embeddings": 32768}
    assert models.model_config("org/other") is None
