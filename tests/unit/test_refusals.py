"""Flags the engine refuses at start (vLLM: max_num_batched_tokens below max_num_seqs) are decided before any
start: never run, told to the study as refused, not as preempting, and named by the report apart from the
preemption boundary. On the fake engine, which refuses what vLLM refuses here."""

from __future__ import annotations

import pytest
from rich.console import Console

from tests.helpers import compose_cfg
from throttle_sweep.commands import measure as measure_cmd
from throttle_sweep.engines import FakeEngine
from throttle_sweep.engines.base import engine_refusal
from throttle_sweep.errors import ConfigError, EngineStartError


def test_the_fake_engine_says_what_it_refuses_before_a_start_and_a_start_of_it_raises_the_same():
    engine = FakeEngine()
    why = engine.refusal({"max_num_seqs": 2048, "max_num_batched_tokens": 1024})
    assert why is not None and "max_num_batched_tokens (1024)" in why and "max_num_seqs (2048)" in why
    assert engine.refusal({"max_num_seqs": 256, "max_num_batched_tokens": 2048}) is None
    with pytest.raises(EngineStartError, match="max_num_seqs \\(2048\\)"):
        engine.start({"max_num_seqs": 2048, "max_num_batched_tokens": 1024})
    assert engine_refusal(object(), {"max_num_seqs": 2048, "max_num_batched_tokens": 1024}) is None  # none to ask


def test_measure_and_compare_refuse_a_refused_arm_before_any_engine_starts(tmp_path, monkeypatch):
    monkeypatch.setattr(FakeEngine, "start", lambda *a: pytest.fail("an engine started"))
    cfg = compose_cfg("backend=fake", "mode=measure", "engine.max_num_seqs=64",
                      "engine.max_num_batched_tokens=32", tmp_path=tmp_path)
    with pytest.raises(ConfigError) as refused:
        measure_cmd.run(cfg, Console(quiet=True))
    assert "engine" in str(refused.value) and "max_num_seqs (64)" in str(refused.value)
    assert "refuse" in str(refused.value)
    from throttle_sweep.settings.compare import load_compare

    cfg = compose_cfg("backend=fake", "mode=compare", "candidate.max_num_seqs=64",
                      "candidate.max_num_batched_tokens=32", tmp_path=tmp_path)
    with pytest.raises(ConfigError, match="candidate: .*max_num_batched_tokens=32.*max_num_seqs \\(64\\)"):
        load_compare(cfg)
