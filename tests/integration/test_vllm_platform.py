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


def test_free_gpu_memory_is_read_through_nvml_for_the_engines_own_gpus_without_initialising_cuda(monkeypatch):
    """Before a start the engine waits until vLLM's own start check will pass (free >= gpu_memory_utilization x
    total on each of its GPUs); the reading maps the engine's devices to physical ones as vLLM does. NVML and
    the CUDA platform are mocked: only a GPU shows real readings."""
    from types import SimpleNamespace

    import torch
    import vllm.platforms
    import vllm.utils.import_utils

    from throttle_sweep.engines.gpu_memory import device_memory

    class Cuda(MockedCuda):
        @staticmethod
        def is_cuda() -> bool:
            return True

        @staticmethod
        def device_id_to_physical_device_id(device: int) -> int:
            return {0: 3, 1: 5}[device]  # CUDA_VISIBLE_DEVICES=3,5

    calls = []
    free = {3: 10 << 30, 5: 70 << 30}
    nvml = SimpleNamespace(nvmlInit=lambda: calls.append("init"), nvmlShutdown=lambda: calls.append("shutdown"),
                           nvmlDeviceGetHandleByIndex=lambda i: i,
                           nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(free=free[h], total=80 << 30))
    monkeypatch.setattr(vllm.platforms, "_current_platform", Cuda())
    monkeypatch.setattr(vllm.utils.import_utils, "import_pynvml", lambda: nvml)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: pytest.fail("torch asked about CUDA"))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: pytest.fail("CUDA initialised for memory"))
    assert device_memory(2) == [(10 << 30, 80 << 30), (70 << 30, 80 << 30)]
    assert calls == ["init", "shutdown"]


def test_an_engine_start_waits_for_the_memory_its_gpus_will_need(monkeypatch):
    """The start reads the memory of tensor x pipeline x data parallel GPUs and records the wait."""
    import throttle_sweep.engines.gpu_memory as gpu_memory
    import throttle_sweep.engines.vllm_inproc as inproc

    asked = []
    monkeypatch.setattr(gpu_memory, "device_memory", lambda n: asked.append(n) or [(80 << 30, 80 << 30)] * n)
    session = inproc.VllmInprocEngine().start({"max_model_len": 256, "kv_cache_memory_bytes": 2 << 20,
                                              "enforce_eager": True, "tensor_parallel_size": None})
    try:
        assert asked == [1] and session.memory_wait_s is not None and session.memory_wait_s < 1.0
    finally:
        session.close()


def test_a_start_the_multiprocess_core_fails_on_a_gpu_short_of_memory_is_said_to_be_refused_for_memory(monkeypatch):
    """With the multiprocess engine core (a GPU's default) vLLM's refusal stays in the core's own log; this
    process sees only "Engine core initialization failed". The GPU's memory, read again, tells why."""
    import vllm

    import throttle_sweep.engines.gpu_memory as gpu_memory
    import throttle_sweep.engines.vllm_inproc as inproc
    from throttle_sweep.errors import EngineStartError, refused_for_memory

    def failed(**kwargs):
        raise RuntimeError("Engine core initialization failed. See root cause above. Failed core proc(s): {}")
    monkeypatch.setattr(vllm, "LLM", failed)
    monkeypatch.setattr(inproc, "served_batch_defaults", lambda flags: {})
    monkeypatch.setattr(gpu_memory, "before_start", lambda flags: 0.0)
    monkeypatch.setattr(gpu_memory, "POLL_S", 0.0)
    monkeypatch.setattr(gpu_memory, "SETTLE_S", 0.0)
    monkeypatch.setattr(gpu_memory, "device_memory", lambda n: [(10 << 30, 80 << 30)] * n)
    with pytest.raises(EngineStartError) as short:
        inproc.VllmInprocEngine().start({"model": "m"})
    assert refused_for_memory(str(short.value)) and "Engine core initialization failed" in str(short.value)
    monkeypatch.setattr(gpu_memory, "device_memory", lambda n: [(80 << 30, 80 << 30)] * n)
    with pytest.raises(EngineStartError) as other:
        inproc.VllmInprocEngine().start({"model": "m"})
    assert not refused_for_memory(str(other.value))


def test_a_failed_start_is_judged_on_the_gpus_memory_once_the_dead_core_has_given_it_back(monkeypatch):
    """Read at once, the memory of a core that died of its own fault is still held, and the failure looked like
    memory another process holds (retried as the slot's, not the flags')."""
    import vllm

    import throttle_sweep.engines.gpu_memory as gpu_memory
    import throttle_sweep.engines.vllm_inproc as inproc
    from throttle_sweep.errors import EngineStartError, refused_for_memory

    def failed(**kwargs):
        raise RuntimeError("Engine core initialization failed. See root cause above. Failed core proc(s): {}")
    back = iter([10, 40, 75])  # GiB free of 80: the dead core's memory coming back
    monkeypatch.setattr(vllm, "LLM", failed)
    monkeypatch.setattr(inproc, "served_batch_defaults", lambda flags: {})
    monkeypatch.setattr(gpu_memory, "before_start", lambda flags: 0.0)
    monkeypatch.setattr(gpu_memory, "POLL_S", 0.0)
    monkeypatch.setattr(gpu_memory, "device_memory", lambda n: [(next(back, 75) << 30, 80 << 30)] * n)
    with pytest.raises(EngineStartError) as failure:
        inproc.VllmInprocEngine().start({"model": "m"})
    assert not refused_for_memory(str(failure.value)), failure.value
    assert next(back, None) is None  # read until it was back
