"""The energy an engine's GPUs use during a replicate, from NVML's energy counter
(nvmlDeviceGetTotalEnergyConsumption: millijoules since the driver loaded, Volta and newer), read by the
process that drives the replicate at the edges of the window its cost is computed over (workload.drive).

Energy is measured where it can be and otherwise off, never an error: without NVML or an NVIDIA driver, or
on GPUs without the counter, a replicate carries why (`energy_off`) and the run says it once at its end
(`energy_note`). Only a price that needs it (cost.usd_per_kwh) makes its absence an error."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

NO_NVML = "no NVIDIA GPU / NVML"
NOT_MEASURED = "energy: not measured ({})"
# the engines that run on this process's GPUs; the fake and the twin run none, an endpoint's are not ours
ON_OUR_GPUS = ("vllm", "vllm-server")


class Meter:
    """The summed energy counter of an engine's GPUs, in joules. A GPU that stops answering turns the meter
    off for good (`off` says why): a sum that lost a GPU would not be the engine's energy."""

    def __init__(self, nvml: Any, handles: list[Any]) -> None:
        self.nvml, self.handles = nvml, handles
        self.off: str | None = None

    def joules(self) -> float | None:
        if self.off is not None:
            return None
        try:
            return sum(int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(h)) for h in self.handles) / 1000.0
        except Exception as exc:  # noqa: BLE001 - NVML's own error types: the energy is off, the replicate goes on
            self.off = unreadable(self.nvml, exc)
            return None


def unreadable(nvml: Any, exc: Exception) -> str:
    """Why a GPU's counter gave no reading, in a few words."""
    if isinstance(exc, getattr(nvml, "NVMLError_NotSupported", ())):
        return "the GPU does not report its energy counter (NVML: not supported; Volta or newer has it)"
    return f"NVML could not read the energy counter ({type(exc).__name__}: {exc})"


def load_nvml() -> Any:
    from throttle_sweep.engines.gpu_found import load_nvml as load

    return load()


def visible_devices(gpus: int, visible: str | None) -> list[str]:
    """The first `gpus` devices this process sees, as CUDA_VISIBLE_DEVICES (or Ray, which sets it) names them:
    NVML indexes every GPU of the machine whatever the variable says (vLLM maps device ids the same way)."""
    if visible is None:
        return [str(i) for i in range(gpus)]
    return [d.strip() for d in visible.split(",") if d.strip()][:gpus]


def open_meter(gpus: int, *, nvml: Callable[[], Any] | None = None, env: Mapping[str, str] | None = None
               ) -> Meter | str:
    """A meter over the first `gpus` GPUs this process sees, its counter read once; else why there is none."""
    try:
        module = (nvml or load_nvml)()
        module.nvmlInit()
    except Exception:  # noqa: BLE001 - no NVML module, library or driver: NVML's own errors, or an import
        return NO_NVML
    devices = visible_devices(gpus, (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES"))
    if len(devices) < gpus:
        return f"the engine holds {gpus} GPU(s), but this process sees {len(devices)}"
    try:
        handles = [module.nvmlDeviceGetHandleByIndex(int(d)) if d.isdigit() else
                   module.nvmlDeviceGetHandleByUUID(d) for d in devices]
    except Exception as exc:  # noqa: BLE001 - a device NVML does not know (a MIG instance's name, a stale id)
        return f"NVML cannot find the engine's GPUs {','.join(devices)} ({type(exc).__name__}: {exc})"
    meter = Meter(module, handles)
    return meter if meter.joules() is not None else str(meter.off)


_meters: dict[int, Meter | str] = {}  # one meter (or why none) per GPU count, for this process's life


def meter_for(backend: str, flags: Mapping[str, Any], *, opener: Callable[[int], Meter | str] = open_meter
              ) -> Meter | str | None:
    """The meter for an engine with these flags on `backend` (every GPU it holds: tensor x pipeline x data
    parallel), or why there is none; None where energy does not apply (the fake engine, the twin)."""
    from throttle_sweep.engines.flags import engine_gpus

    if backend == "endpoint":
        return "backend=endpoint: the server's GPUs are not this process's to read"
    if backend not in ON_OUR_GPUS:
        return None
    gpus = engine_gpus(flags)
    if gpus not in _meters or isinstance(_meters[gpus], Meter) and _meters[gpus].off is not None:
        _meters[gpus] = opener(gpus)
    return _meters[gpus]


def energy_note(records: Iterable[Mapping[str, Any]]) -> str | None:
    """Why energy was not measured, said once for a run: the first reason its records give."""
    for r in records:
        if r.get("energy_off"):
            return NOT_MEASURED.format(r["energy_off"])
    return None


def joules_per_token(joules: float | None, tokens: int) -> float | None:
    return joules / tokens if joules is not None and tokens > 0 else None


def joules_text(part: Mapping[str, Any]) -> str:
    """', 0.465 J/output token' for a record (or its steady window) that has energy; else nothing."""
    value = part.get("j_per_output_token")
    return "" if value is None else f", {value:.3g} J/output token"
