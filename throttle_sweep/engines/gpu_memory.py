"""Free memory on the GPUs an engine is about to use, and a wait until enough is back before it starts.

vLLM starts only when each GPU's free memory is at least gpu_memory_utilization x its total, and an engine
that has just ended (its process exiting, a CUDA context going away) gives its memory back a little later.
Read through NVML, as vLLM's own platform reads device facts: CUDA is never initialised in this process."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from throttle_sweep.errors import MEMORY_SHORT

Reading = list[tuple[int, int]]  # (free, total) bytes per device
WAIT_S = 60.0  # then the start is tried anyway: vLLM refuses it if the memory is still held (see slot.py)
POLL_S = 0.5
SETTLE_S = 3.0  # free memory that has not grown for this long is not coming back
GROWTH_BYTES = 64 << 20  # less is jitter, not memory coming back
# vLLM reads free memory after creating its CUDA context (about half a GiB, more with NCCL); NVML, read before
# the engine exists, must show that much more for vLLM's own check to pass
MARGIN_BYTES = 1 << 30
GIB = float(1 << 30)


def device_memory(devices: int) -> Reading | None:
    """(free, total) of the first `devices` GPUs this process sees (CUDA_VISIBLE_DEVICES, or what Ray
    assigned), physical ids mapped as vLLM maps them; None where vLLM's platform is not CUDA."""
    from vllm.platforms import current_platform

    if not current_platform.is_cuda():
        return None
    from vllm.utils.import_utils import import_pynvml

    nvml = import_pynvml()
    nvml.nvmlInit()
    try:
        reading = []
        for device in range(devices):
            handle = nvml.nvmlDeviceGetHandleByIndex(current_platform.device_id_to_physical_device_id(device))
            info = nvml.nvmlDeviceGetMemoryInfo(handle)
            reading.append((int(info.free), int(info.total)))
        return reading
    finally:
        nvml.nvmlShutdown()


def wait_for_memory(utilization: float, read: Callable[[], Reading | None], *, wait_s: float = WAIT_S,
                    poll_s: float = POLL_S, settle_s: float = SETTLE_S, clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep) -> float | None:
    """Poll until every device has utilization x total free and a margin, or its free memory has stopped
    growing for `settle_s` (an idle GPU never shows its whole total: more may never come back), or `wait_s`
    has passed; the seconds waited (None where there is no GPU to read, or it cannot be read: the start then
    goes ahead, and vLLM's own check decides)."""
    began = clock()
    best: Reading | None = None
    grew_at = began
    while True:
        try:
            reading = read()
        except Exception:  # noqa: BLE001 - NVML unsupported (MIG), a device not found: vLLM's start decides
            return None
        if reading is None:
            return None
        now = clock()
        if best is None or any(free > top + GROWTH_BYTES for (free, _), (top, _) in zip(reading, best, strict=True)):
            best, grew_at = reading, now
        if not shortfall(utilization, reading) or now - grew_at >= settle_s or now - began >= wait_s:
            return now - began
        sleep(poll_s)


def before_start(flags: Mapping[str, Any]) -> float | None:
    """Wait for the memory an engine with these flags will need on each of its GPUs (tensor x pipeline x data
    parallel); the seconds waited, None off a GPU."""
    from throttle_sweep.cost import engine_gpus

    gpus = engine_gpus(flags)
    return wait_for_memory(utilization_of(flags), lambda: device_memory(gpus), poll_s=POLL_S)


def utilization_of(flags: Mapping[str, Any]) -> float:
    return float(flags.get("gpu_memory_utilization") or 0.9)  # vLLM's default


def shortfall(utilization: float, reading: Reading | None) -> str | None:
    """Which GPU has less free memory than vLLM will find at start (utilization x total, and the context it
    creates first), in the words errors.refused_for_memory knows; None when each has enough, or nothing was
    read."""
    for device, (free, total) in enumerate(reading or []):
        if free < utilization * total + MARGIN_BYTES:
            return (f"GPU {device} has {free / GIB:.1f} of {total / GIB:.1f} GiB free: {MEMORY_SHORT} "
                    f"{utilization:g} asks ({utilization * total / GIB:.1f} GiB)")
    return None


def shortfall_now(utilization: float, read: Callable[[], Reading | None]) -> str | None:
    """`shortfall` of a reading taken now; None where it cannot be read."""
    try:
        return shortfall(utilization, read())
    except Exception:  # noqa: BLE001 - no reading, no claim
        return None
