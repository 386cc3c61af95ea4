"""scripts/gpu_check.py on vLLM's CPU build, as a user runs it (the tiny model stands in for Qwen2.5-0.5B):
the published experiment, then a short sweep against vLLM's own defaults. What a GPU would measure, and
whether it fits in 10 minutes there, only a GPU can show."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import compose_cfg, gpu_check
from throttle_sweep.settings.sweep import load_sweep
from throttle_sweep.store.records import read_records
from throttle_sweep.sweep.gpu_time import gpu_time

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


@pytest.mark.quiet  # its published comparison came out INCONCLUSIVE once beside other engines
def test_the_check_reproduces_the_published_comparison_and_sweeps_against_vllms_defaults(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--results", str(tmp_path)],
                          cwd=tmp_path, text=True, capture_output=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((tmp_path / "published" / "summary.json").read_text())
    assert summary["labels"] == {"baseline": "max_num_seqs=1", "candidate": "max_num_seqs=8"}
    assert summary["verdict"] == "CHEAPER" and summary["ci"][1] < 0.6
    assert summary["n"] == {"baseline": 3, "candidate": 3}
    tail = done.stdout[done.stdout.index("\ngpu-check\n"):]
    assert f"{summary['ratio']:.3f}" in tail and "published: ratio 0.314 [0.301, 0.328]" in tail
    answer = next(line for line in tail.splitlines() if "sweep against vLLM's defaults:" in line)
    assert "winner (every constraint kept" in answer or "no candidate was confirmed cheaper than the baseline (" in answer
    records = [json.loads(line) for line in (tmp_path / "sweep" / "replicates.jsonl").read_text().splitlines()]
    # the search runs against a reference point; confirmation measures against the baseline
    baseline = [r for r in records if r["arm"] == "baseline" and r["stage"] == "confirm" and r["status"] == "ok"]
    assert baseline and all("max_num_seqs" not in r["flags"] for r in baseline)  # left to vLLM
    assert {r["engine_flags"]["max_num_seqs"] for r in baseline} == {r["served_defaults"]["max_num_seqs"]
                                                                      for r in baseline}


def test_vllm_reads_the_shipped_architecture_as_qwen2_5_0_5b():
    """The config the GPU check serves, read by vLLM itself (no weights: the check loads dummy ones)."""
    from vllm.engine.arg_utils import EngineArgs

    from throttle_sweep.models import QWEN2_5_0_5B

    config = EngineArgs(model=str(QWEN2_5_0_5B), load_format="dummy", skip_tokenizer_init=True,
                        max_model_len=4096).create_model_config()
    assert config.architectures == ["Qwen2ForCausalLM"]
    assert (config.get_head_size(), config.get_total_num_kv_heads(), config.get_vocab_size()) == (64, 2, 151936)
    # its sampling defaults, which the API server applies to every request (and so the measurement does)
    sampling = config.get_diff_sampling_param()
    assert (sampling["top_k"], sampling["top_p"], sampling["repetition_penalty"]) == (20, 0.8, 1.1)


def test_the_gpu_sweep_runs_against_vllms_defaults_over_a_range_that_holds_them(tmp_path, monkeypatch):
    """Its settings as a GPU machine checks them (here, with no GPU, engine=gpu would stop at once)."""
    from throttle_sweep.engines import gpu_found

    monkeypatch.setattr(gpu_found, "no_gpu", lambda: None)
    check = gpu_check()
    run = load_sweep(compose_cfg("+space=batching", "study.name=sweep", *check.STEPS["gpu"]["sweep"],
                                 tmp_path=tmp_path))
    assert run.baseline.get("max_num_seqs") is None and run.baseline.get("max_num_batched_tokens") is None
    seqs = run.distributions["max_num_seqs"]
    assert seqs.low <= 256 and seqs.high >= 1024  # vLLM serves 256 on an A100, 1024 on an H100
    assert set(run.distributions["max_num_batched_tokens"].choices) >= {2048, 8192}
    assert run.base["model"] == str(check.QWEN) and run.base["load_format"] == "dummy"
    assert not run.out.exists()  # checked only: nothing written


@pytest.mark.parametrize("gpu", ["H100", "A100"])
def test_the_twin_refuses_nothing_the_gpu_steps_need(gpu, tmp_path):
    """The GPU steps' flags as `--twin` runs them: the baseline (vLLM's defaults, the model's own 32768-token
    max_model_len), both published arms and each end of the sweep's space pass vLLM's validation on the twin
    GPU and get a KV cache there."""
    from throttle_sweep.settings.sections import arm_flags, plain
    from throttle_sweep.settings.sweep import space_extremes

    check = gpu_check()
    twin = ["backend=twin", f"twin.gpu={gpu}"]
    run = load_sweep(compose_cfg("+space=batching", "study.name=sweep", *check.STEPS["gpu"]["sweep"], *twin,
                                 tmp_path=tmp_path))
    cfg = compose_cfg("mode=compare", *check.PUBLISHED_ARMS, *check.STEPS["gpu"]["published"], *twin,
                      tmp_path=tmp_path)
    arms = [arm_flags(plain(cfg.engine), plain(cfg[arm])) for arm in ("baseline", "candidate")]
    for flags in [run.baseline, *arms, *(flags for _, flags in space_extremes(run.base, run.distributions))]:
        assert run.engine.refusal(flags) is None, flags
        assert run.engine.start(flags).kv_bytes > 0


def test_on_the_h100_twin_the_check_says_the_gpu_minutes_it_takes_and_they_are_at_most_ten(tmp_path, capsys):
    """`--twin H100` with the real step list (under a minute here): both steps run on the twin, none on vLLM,
    and the summary gives the GPU-minutes their records stand for, which the check is sized to keep within 10."""
    check = gpu_check()
    assert check.main(["--twin", "H100", "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    records = {step: read_records(tmp_path / step / "replicates.jsonl") for step in ("published", "sweep")}
    for step in records.values():
        assert step and {(r["environment"]["engine"], r["environment"]["device_name"], r["environment"]["predicted"])
                         for r in step} == {("twin", "H100-80GB", True)}
    spent = {step: gpu_time(found).total_s / 60 for step, found in records.items()}
    assert all(minutes > 0 for minutes in spent.values()) and sum(spent.values()) <= 10
    tail = out[out.index("\ngpu-check\n"):]
    assert "max_num_seqs 1 against 8, eight in flight, on the H100-80GB twin: ratio " in tail
    assert (f"GPU time on the H100-80GB twin, predicted, not measured: {sum(spent.values()):.1f} GPU-minutes in all "
            f"(published comparison {spent['published']:.1f}, sweep {spent['sweep']:.1f})") in tail
