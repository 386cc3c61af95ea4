"""What the engine reads of its device, on vLLM's own platform object: a GPU's name comes from NVML without
initialising CUDA (which would make vLLM force `spawn` for its engine core and workers). The CUDA platform
is mocked here; only a real GPU shows the name NVML gives."""

from __future__ import annotations

import pytest


class MockedCuda:
    device_name = device_type = "cuda"

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return "NVIDIA H100 80GB HBM3"


def test_the_device_name_is_read_from_vllms_platform_without_initialising_cuda(monkeypatch):
    import torch
    import vllm.platforms

    from throttle_sweep.engines import VllmInprocEngine

    monkeypatch.setattr(vllm.platforms, "_current_platform", MockedCuda())
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: pytest.fail("CUDA initialised for a name"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: pytest.fail("torch asked about CUDA"))
    env = VllmInprocEngine().environment()
    assert env["device"] == "cuda" and env["device_name"] == "NVIDIA H100 80GB HBM3"


def test_a_prefix_cache_that_was_not_reset_fails_the_replicate_instead_of_warming_it():
    """vLLM's reset returns False (and resets nothing) while requests are running: the next replicate would
    start with the last one's prompts cached, cheaper than a fresh engine would be."""
    from types import SimpleNamespace

    from throttle_sweep.engines.vllm_inproc import VllmSession
    from throttle_sweep.errors import EngineRunError

    session = SimpleNamespace(llm=SimpleNamespace(reset_prefix_cache=lambda: False))
    with pytest.raises(EngineRunError, match="prefix cache"):
        VllmSession.reset_prefix_cache(session)
    VllmSession.reset_prefix_cache(SimpleNamespace(llm=SimpleNamespace(reset_prefix_cache=lambda: True)))
