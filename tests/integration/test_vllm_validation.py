"""vLLM's own config validation decides which flags it refuses at start, before any start (engines/
vllm_validation.py): real vLLM (the CPU build), on its CPU platform and on a mocked CUDA one."""

from __future__ import annotations

import pytest

from throttle_sweep.engines.vllm_validation import CannotValidate, CudaDevice, vllm_refusal
from throttle_sweep.models import QWEN2_5_0_5B, TINY_QWEN2

H100 = CudaDevice("NVIDIA H100 80GB HBM3", 80 << 30, (9, 0))
REFUSED = "max_num_batched_tokens (1024) must be greater than or equal to max_num_seqs (2048)"


def model(path) -> dict:
    return {"model": str(path), "load_format": "dummy", "skip_tokenizer_init": True}


@pytest.fixture
def no_gpu_touched(monkeypatch):
    """CUDA is never initialised (every device allocation or query goes through torch.cuda._lazy_init)."""
    import torch

    monkeypatch.setattr(torch.cuda, "_lazy_init", lambda: pytest.fail("CUDA initialised"))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: pytest.fail("CUDA memory read"))


@pytest.mark.parametrize("path", [TINY_QWEN2, QWEN2_5_0_5B])
def test_vllm_refuses_fewer_batched_tokens_than_sequences_in_its_own_words(path, no_gpu_touched):
    why = vllm_refusal({**model(path), "max_num_seqs": 2048, "max_num_batched_tokens": 1024})
    assert why is not None and REFUSED in why and why.startswith("SchedulerConfig: ")
    assert "pydantic" not in why and "input_value" not in why
    assert vllm_refusal({**model(path), "max_num_seqs": 256, "max_num_batched_tokens": 2048}) is None


def test_on_a_mocked_cuda_gpu_the_same_flags_are_refused_and_its_defaults_accepted(no_gpu_touched):
    import vllm.platforms

    before = vllm.platforms.current_platform
    flags = model(QWEN2_5_0_5B)
    assert REFUSED in vllm_refusal({**flags, "max_num_seqs": 2048, "max_num_batched_tokens": 1024}, cuda=H100)
    assert vllm_refusal({**flags, "max_num_seqs": 256, "max_num_batched_tokens": 2048}, cuda=H100) is None
    assert vllm_refusal({**flags, "max_num_seqs": 2048}, cuda=H100) is None  # its default token budget
    assert vllm.platforms.current_platform is before and before.device_type == "cpu"
    import vllm.engine.arg_utils

    assert vllm.engine.arg_utils.current_platform is before  # every binding given back


def test_other_checks_of_vllms_configs_are_refusals_too():
    why = vllm_refusal({**model(TINY_QWEN2), "max_model_len": 100000})
    assert why is not None and "max_model_len (100000)" in why
    assert "gpu_memory_utilization" in vllm_refusal({**model(TINY_QWEN2), "gpu_memory_utilization": 1.5})


def test_a_model_it_cannot_read_is_no_refusal_and_a_hub_model_is_never_looked_up(tmp_path):
    with pytest.raises(CannotValidate, match="no config.json"):  # vLLM says so as a ModelConfig error
        vllm_refusal({**model(tmp_path), "max_num_seqs": 2048, "max_num_batched_tokens": 1024})
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(Exception) as unreadable:  # noqa: PT011 - raised as it came: no answer either way
        vllm_refusal({**model(tmp_path), "max_num_seqs": 2048, "max_num_batched_tokens": 1024})
    assert REFUSED not in str(unreadable.value)
    with pytest.raises(CannotValidate, match="not a local folder"):
        vllm_refusal({"model": "Qwen/Qwen2.5-0.5B-Instruct", "max_num_seqs": 2048, "max_num_batched_tokens": 1024})


def test_both_vllm_engines_say_what_they_would_refuse_before_any_start(monkeypatch, tmp_path):
    import vllm

    from throttle_sweep.engines import VllmInprocEngine
    from throttle_sweep.engines.vllm_server import VllmServerEngine

    monkeypatch.setattr(vllm, "LLM", lambda **kw: pytest.fail("an engine started"))
    for engine in (VllmInprocEngine(), VllmServerEngine(log_dir=tmp_path)):
        assert REFUSED in engine.refusal({"max_num_seqs": 2048, "max_num_batched_tokens": 1024})
        assert engine.refusal({"max_num_seqs": 256, "max_num_batched_tokens": 2048}) is None
        assert engine.refusal({"model": "Qwen/Qwen2.5-0.5B-Instruct", "max_num_seqs": 2048,
                               "max_num_batched_tokens": 1024}) is None  # a start tells


def test_compare_refuses_an_arm_vllm_would_refuse_before_any_engine_starts(tmp_path, monkeypatch):
    import vllm

    from tests.helpers import compose_cfg
    from throttle_sweep.errors import ConfigError
    from throttle_sweep.settings.compare import load_compare

    monkeypatch.setattr(vllm, "LLM", lambda **kw: pytest.fail("an engine started"))
    cfg = compose_cfg("mode=compare", "candidate.max_num_seqs=2048", "candidate.max_num_batched_tokens=1024",
                      tmp_path=tmp_path)
    with pytest.raises(ConfigError, match="candidate: the engine refuses these flags .*max_num_batched_tokens="
                                          "1024.*must be greater than or equal to max_num_seqs \\(2048\\)"):
        load_compare(cfg)


def test_a_sweep_on_vllm_probes_only_the_values_vllm_accepts_and_keeps_the_refused_stretch(monkeypatch):
    import optuna
    import vllm
    from optuna.distributions import CategoricalDistribution, IntDistribution

    from throttle_sweep.engines import VllmInprocEngine
    from throttle_sweep.sweep.boundary import knob_values
    from throttle_sweep.sweep.options import SweepSettings
    from throttle_sweep.sweep.refusals import probe_distribution
    from throttle_sweep.sweep.schedules import ScheduleIndex
    from throttle_sweep.sweep.state import StudyView

    monkeypatch.setattr(vllm, "LLM", lambda **kw: pytest.fail("an engine started"))
    seqs = IntDistribution(1000, 1100)
    view = StudyView(study=optuna.create_study(), settings=SweepSettings(boundary_knob="max_num_seqs"),
                     distributions={"max_num_seqs": seqs, "max_num_batched_tokens": CategoricalDistribution([1024, 2048])},
                     base_flags={"max_model_len": 1024}, baseline_flags={"max_model_len": 1024, "max_num_seqs": 1},
                     schedules=ScheduleIndex(()), refusal=VllmInprocEngine().refusal)
    assert knob_values(probe_distribution(view, "max_num_seqs", {"max_num_batched_tokens": 1024})) == list(
        range(1000, 1025))
    assert probe_distribution(view, "max_num_seqs", {"max_num_batched_tokens": 2048}) is seqs
    ((stretch,),) = view.findings.refused.values()
    assert (stretch["low"], stretch["high"], stretch["others"]) == (1025, 1100, {"max_num_batched_tokens": 1024})
    assert "max_num_seqs (1025)" in stretch["reason"]
