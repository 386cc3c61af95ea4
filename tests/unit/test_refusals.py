"""Flags the engine refuses at start (vLLM: max_num_batched_tokens below max_num_seqs) are decided before any
start: never run, told to the study as refused, not as preempting, and named by the report apart from the
preemption boundary. On the fake engine, which refuses what vLLM refuses here."""

from __future__ import annotations

import pytest

from throttle_sweep.engines import FakeEngine
from throttle_sweep.engines.base import engine_refusal
from throttle_sweep.errors import EngineStartError


def test_the_fake_engine_says_what_it_refuses_before_a_start_and_a_start_of_it_raises_the_same():
    engine = FakeEngine()
    why = engine.refusal({"max_num_seqs": 2048, "max_num_batched_tokens": 1024})
    assert why is not None and "max_num_batched_tokens (1024)" in why and "max_num_seqs (2048)" in why
    assert engine.refusal({"max_num_seqs": 256, "max_num_batched_tokens": 2048}) is None
    with pytest.raises(EngineStartError, match="max_num_seqs \\(2048\\)"):
        engine.start({"max_num_seqs": 2048, "max_num_batched_tokens": 1024})
    assert engine_refusal(object(), {"max_num_seqs": 2048, "max_num_batched_tokens": 1024}) is None  # none to ask
