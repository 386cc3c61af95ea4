"""The GPUs the twin knows: memory, memory bandwidth and dense bf16 FLOP/s from NVIDIA's datasheets, and the
total memory as the driver reports it (what vLLM's `gpu_memory_utilization` is a share of). A user's own GPU is
a mapping with the same fields."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from throttle_sweep.errors import ConfigError, nearest

GIB = 1 << 30


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_bytes: int  # total device memory as torch.cuda.mem_get_info reports it
    bandwidth_bytes_s: float  # HBM/GDDR bandwidth, datasheet peak
    bf16_flops: float  # dense bf16 tensor-core FLOP/s, datasheet peak (no sparsity)
    layer_floor_s: float = 45e-6  # the shortest a decoder layer runs with CUDA graphs (launch and sync bound)
    device_name: str = ""  # as vLLM's platform reads it from NVML (it picks some defaults by it)
    capability: tuple[int, int] = (8, 0)  # CUDA compute capability (vLLM checks dtypes and kernels against it)


# Datasheet figures (SXM parts where NVIDIA sells both); memory as nvidia-smi reports it.
GPUS: dict[str, GpuSpec] = {
    "A100-40GB": GpuSpec("A100-40GB", 40 * GIB, 1.555e12, 312e12, 50e-6, "NVIDIA A100-SXM4-40GB", (8, 0)),
    "A100-80GB": GpuSpec("A100-80GB", 80 * GIB, 2.039e12, 312e12, 50e-6, "NVIDIA A100-SXM4-80GB", (8, 0)),
    "H100-80GB": GpuSpec("H100-80GB", 81559 << 20, 3.35e12, 989e12, 45e-6, "NVIDIA H100 80GB HBM3", (9, 0)),
    "H200": GpuSpec("H200", 143771 << 20, 4.8e12, 989e12, 45e-6, "NVIDIA H200", (9, 0)),
    "L4": GpuSpec("L4", 23034 << 20, 0.300e12, 121e12, 60e-6, "NVIDIA L4", (8, 9)),
}
ALIASES = {"A100": "A100-80GB", "H100": "H100-80GB", "H200-141GB": "H200", "L4-24GB": "L4"}


def gpu_spec(given: str | Mapping[str, Any], *, key: str = "twin.gpu") -> GpuSpec:
    """A known GPU by name (`H100`, `A100-40GB`, ...), or a user's own as a mapping: name, memory_gib,
    bandwidth_gb_s, bf16_tflops (and optionally layer_floor_us)."""
    if isinstance(given, str):
        name = ALIASES.get(given, given)
        if name not in GPUS:
            near = nearest(given, [*GPUS, *ALIASES], n=3)
            raise ConfigError(f"{key}: unknown GPU {given!r}; the twin knows {', '.join(GPUS)} (and "
                              f"{', '.join(ALIASES)}){'; nearest: ' + ', '.join(near) if near else ''}, or give your "
                              "own as {name: ..., memory_gib: ..., bandwidth_gb_s: ..., bf16_tflops: ...}")
        return GPUS[name]
    spec = dict(given)
    needed = ("name", "memory_gib", "bandwidth_gb_s", "bf16_tflops")
    missing = [k for k in needed if spec.get(k) is None]
    unknown = sorted(set(spec) - {*needed, "layer_floor_us"})
    if missing or unknown:
        raise ConfigError(f"{key}: a GPU of your own needs {', '.join(needed)} (optional: layer_floor_us); "
                          + (f"missing {', '.join(missing)}" if missing else f"unknown {', '.join(unknown)}"))
    for k in needed[1:] + (("layer_floor_us",) if "layer_floor_us" in spec else ()):
        value = spec[k]
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ConfigError(f"{key}.{k} must be a positive number, but got {value!r}")
    floor = spec.get("layer_floor_us")
    return GpuSpec(str(spec["name"]), int(spec["memory_gib"] * GIB), spec["bandwidth_gb_s"] * 1e9,
                   spec["bf16_tflops"] * 1e12, floor * 1e-6 if floor else GpuSpec.layer_floor_s,
                   device_name=f"NVIDIA {spec['name']}")


def describe(gpu: GpuSpec) -> dict[str, Any]:
    """The spec as the records keep it."""
    return {f.name: getattr(gpu, f.name) for f in fields(gpu)}
