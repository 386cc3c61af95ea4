"""The in-process engine's prefix-cache reset between replicates waits for vLLM as the HTTP path does (#45,
finding 6f): vLLM resets nothing while a finished request's blocks are still held, and says so with False."""

from __future__ import annotations

import pytest

from throttle_sweep.engines import vllm_inproc
from throttle_sweep.errors import EngineRunError


class StubLLM:
    """vllm.LLM's reset_prefix_cache: False for the first `refusals` calls (blocks still held), then True."""

    def __init__(self, refusals: float) -> None:
        self.refusals, self.calls = refusals, 0

    def reset_prefix_cache(self) -> bool:
        self.calls += 1
        return self.calls > self.refusals


def session(llm: StubLLM) -> vllm_inproc.VllmSession:
    made = object.__new__(vllm_inproc.VllmSession)  # no engine: only the reset is exercised
    made.llm = llm
    return made


def test_a_reset_refused_for_a_moment_is_tried_again():
    llm = StubLLM(refusals=2)
    session(llm).begin_replicate(1)
    assert llm.calls == 3


def test_a_reset_refused_for_longer_than_the_wait_fails_the_replicate(monkeypatch):
    monkeypatch.setattr(vllm_inproc, "PREFIX_RESET_WAIT_S", 0.05)
    llm = StubLLM(refusals=float("inf"))
    with pytest.raises(EngineRunError, match="did not reset its prefix cache"):
        session(llm).reset_prefix_cache()
    assert llm.calls > 1
