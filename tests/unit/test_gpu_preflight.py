"""GPU settings that cannot run are refused before anything starts (#45): engine=gpu on a machine without a
CUDA GPU (a real GPU's own answer, NVML counting it, is mocked here, as only a GPU machine can give it), and
in-process data parallelism, which vLLM's LLM class refuses."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.helpers import compose_cfg
from throttle_sweep.engines import gpu_found
from throttle_sweep.engines.fake import FAKE_FLAG_SCHEMA
from throttle_sweep.errors import ConfigError
from throttle_sweep.settings.sections import engine_from, preflight, workload_from


class FakeNvml:
    """NVML as the nvidia-ml-py module answers: a device count, or its error where no driver is loaded."""

    class NVMLError(Exception):  # noqa: N818 - NVML's own name, which vLLM's platform check looks for
        pass

    def __init__(self, count: int | None) -> None:
        self.count, self.shut = count, False

    def nvmlInit(self) -> None:  # noqa: N802 - NVML's names
        if self.count is None:
            raise self.NVMLError("NVML Shared Library Not Found")

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return self.count

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.shut = True


@pytest.mark.parametrize("backend", ["vllm", "server"])
def test_engine_gpu_without_a_gpu_fails_at_once_and_points_to_the_twin(monkeypatch, backend):
    monkeypatch.setattr(gpu_found, "no_gpu", lambda: "NVML found no NVIDIA driver")
    cfg = compose_cfg("engine=gpu", f"backend={backend}", "+space=batching")
    with pytest.raises(ConfigError) as caught:
        engine_from(cfg)
    message = str(caught.value)
    assert "engine=gpu" in message and "no CUDA GPU" in message and "NVML found no NVIDIA driver" in message
    assert "backend=twin twin.gpu=H100" in message


def test_a_gpu_found_or_another_backend_or_a_ray_cluster_is_not_refused(monkeypatch):
    monkeypatch.setattr(gpu_found, "no_gpu", lambda: None)
    assert engine_from(compose_cfg("engine=gpu")).name == "vllm"
    monkeypatch.setattr(gpu_found, "no_gpu", lambda: "none here")
    assert engine_from(compose_cfg("engine=gpu", "backend=fake")).name == "fake"
    assert engine_from(compose_cfg("engine=gpu", "ray.enabled=true")).name == "vllm"  # the GPUs are the cluster's
    assert engine_from(compose_cfg()).name == "vllm"  # the CPU build's tiny model


def test_no_gpu_reads_the_build_and_nvml_as_vllms_platform_does():
    assert "CPU build" in gpu_found.no_gpu(cpu=True, nvml=lambda: FakeNvml(1))
    assert gpu_found.no_gpu(cpu=False, nvml=lambda: FakeNvml(2)) is None
    none = FakeNvml(0)
    assert "no GPU" in gpu_found.no_gpu(cpu=False, nvml=lambda: none) and none.shut
    assert "NVML Shared Library Not Found" in gpu_found.no_gpu(cpu=False, nvml=lambda: FakeNvml(None),
                                                               jetson=lambda: False)
    assert gpu_found.no_gpu(cpu=False, nvml=lambda: FakeNvml(None), jetson=lambda: True) is None


def test_in_process_data_parallel_is_refused_before_start_pointing_to_the_server():
    """vLLM's LLM class refuses data_parallel_size > 1 at start (unless an external launcher runs it), which a
    sweep would blame on the flags: refused here, naming the arm and the way that runs it."""
    schema = {**FAKE_FLAG_SCHEMA, "data_parallel_size": int}
    spec = workload_from(compose_cfg())
    inproc, server = (SimpleNamespace(name=name, flag_schema=lambda: schema) for name in ("vllm", "vllm-server"))
    with pytest.raises(ConfigError) as caught:
        preflight(inproc, {"data_parallel_size": 2}, spec, source="baseline")
    assert "baseline.data_parallel_size=2" in str(caught.value) and "backend=server" in str(caught.value)
    preflight(server, {"data_parallel_size": 2}, spec, source="baseline")
    preflight(inproc, {"data_parallel_size": 2, "distributed_executor_backend": "external_launcher"}, spec,
              source="baseline")
    preflight(inproc, {"data_parallel_size": 1}, spec, source="baseline")


def test_engine_gpu_with_the_cpu_memory_space_is_refused_pointing_to_the_gpu_one(monkeypatch):
    """space=memory sweeps KV caches of a few MiB, sized for the CPU build's tiny model: on a GPU vLLM refuses
    most of them for a real model, so the sweep stops before it starts and names the GPU memory space."""
    monkeypatch.setattr(gpu_found, "no_gpu", lambda: None)
    with pytest.raises(ConfigError) as caught:
        engine_from(compose_cfg("engine=gpu", "+space=memory"))
    assert "kv_cache_memory_bytes" in str(caught.value) and "+space=gpu_memory" in str(caught.value)


def test_the_gpu_memory_space_straddles_vllms_defaults(monkeypatch):
    from throttle_sweep.settings.sections import arm_flags, plain
    from throttle_sweep.sweep.space import build_space

    monkeypatch.setattr(gpu_found, "no_gpu", lambda: None)
    cfg = compose_cfg("engine=gpu", "+space=gpu_memory")
    engine_from(cfg)  # not refused
    dists = build_space(plain(cfg.space), FAKE_FLAG_SCHEMA, source="space")
    utilization = dists["gpu_memory_utilization"]
    baseline = arm_flags(arm_flags(plain(cfg.engine)), plain(cfg.baseline))
    assert utilization.low < baseline["gpu_memory_utilization"] < utilization.high
    assert {"auto", "fp8"} <= set(dists["kv_cache_dtype"].choices)
    assert 16 in dists["block_size"].choices  # vLLM's default block on CUDA
    assert "kv_cache_memory_bytes" not in dists
