"""Engines: the interface measurement needs, vLLM in-process, and a fake for fast tests."""

from __future__ import annotations

from throttle_sweep.engines.base import Engine, EngineSession, Request, StepEvent
from throttle_sweep.engines.fake import FakeEngine, FakeKnobs
from throttle_sweep.engines.vllm_inproc import VllmInprocEngine

__all__ = ["Engine", "EngineSession", "FakeEngine", "FakeKnobs", "Request", "StepEvent", "VllmInprocEngine",
           "make_engine"]


def make_engine(kind: str, *, fake_knobs: FakeKnobs | None = None) -> Engine:
    if kind == "vllm":
        return VllmInprocEngine()
    if kind == "fake":
        return FakeEngine(fake_knobs)
    from throttle_sweep.errors import ConfigError

    raise ConfigError(f"backend must be one of 'vllm', 'fake', but got {kind!r}")
