"""Free memory on the GPUs an engine is about to use: a wait until enough is back before it starts, and after a
failed start whether memory was short.

vLLM starts only when each GPU's free memory is at least gpu_memory_utilization x its total, and an engine
that has just ended (its process exiting, a CUDA context going away) gives its memory back a little later.
Read through NVML, as vLLM's own platform reads device facts: CUDA is never initialised in this process."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from throttle_sweep.errors import MEMORY_SHORT, ConfigError

Reading = list[tuple[int, int]]  # (free, total) bytes per device
WAIT_S = 60.0  # then the start is tried anyway: vLLM refuses it if the memory is still held (see cluster/slot.py)
POLL_S = 0.5
SETTLE_S = 3.0  # free memory that has not grown for this long is not coming back
GROWTH_BYTES = 64 << 20  # less is jitter, not memory coming back
# after a failed start: the dead core's processes exit and the driver frees their memory within seconds; what
# is still held after this long is another process's
AFTER_FAILURE_WAIT_S = 10.0
# vLLM reads free memory after creating its CUDA context (about half a GiB, more with NCCL); NVML, read before
# the engine exists, shows that memory free
CONTEXT_BYTES = 512 << 20
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
    """Poll until every device has utilization x total free and the context vLLM creates before its check, or
    its free memory has stopped growing for `settle_s` (an idle GPU never shows its whole total: more may never
    come back), or `wait_s` has passed; the seconds waited (None where there is no GPU to read, or it cannot be
    read: the start then goes ahead, and vLLM's own check decides). A utilization no GPU read can ever give is
    refused (ConfigError) at the first reading."""
    settled = settle(utilization, read, margin=CONTEXT_BYTES, refuse=True, wait_s=wait_s, poll_s=poll_s,
                     settle_s=settle_s, clock=clock, sleep=sleep)
    return None if settled is None else settled[1]


def settled_shortfall(utilization: float, read: Callable[[], Reading | None], *,
                      wait_s: float | None = None, poll_s: float | None = None, settle_s: float | None = None,
                      clock: Callable[[], float] = time.monotonic,
                      sleep: Callable[[float], None] = time.sleep) -> str | None:
    """After a failed start: `shortfall` once the memory the dead engine held has come back (enough is free,
    or it has stopped growing for `settle_s`, or `wait_s` has passed); None where it cannot be read."""
    settled = settle(utilization, read, margin=0, refuse=False,
                     wait_s=AFTER_FAILURE_WAIT_S if wait_s is None else wait_s,
                     poll_s=POLL_S if poll_s is None else poll_s,
                     settle_s=SETTLE_S if settle_s is None else settle_s, clock=clock, sleep=sleep)
    return None if settled is None else shortfall(utilization, settled[0])


def settle(utilization: float, read: Callable[[], Reading | None], *, margin: int, refuse: bool, wait_s: float,
           poll_s: float, settle_s: float, clock: Callable[[], float],
           sleep: Callable[[float], None]) -> tuple[Reading, float] | None:
    """Poll until every device has utilization x total + `margin` free, or its free memory has stopped growing
    for `settle_s`, or `wait_s` has passed: the last reading and the seconds waited; None without a reading.
    With `refuse`, a utilization beyond what a device can give raises ConfigError at the first reading."""
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
        if refuse and best is None and (why := beyond_reach(utilization, reading)):
            raise ConfigError(why)
        now = clock()
        if best is None or any(free > top + GROWTH_BYTES for (free, _), (top, _) in zip(reading, best, strict=True)):
            best, grew_at = reading, now
        enough = all(free >= utilization * total + margin for free, total in reading)
        if enough or now - grew_at >= settle_s or now - began >= wait_s:
            return reading, now - began
        sleep(poll_s)


def beyond_reach(utilization: float, reading: Reading) -> str | None:
    """Why no start can ever have `utilization` of these GPUs: vLLM asks utilization x total free after its
    CUDA context exists, so more than the total less that context is never free (and more than 1 never is)."""
    for device, (_, total) in enumerate(reading):
        if utilization > 1 or utilization * total > total - CONTEXT_BYTES:
            return (f"engine flag gpu_memory_utilization={utilization:g} asks {utilization * total / GIB:.2f} GiB "
                    f"of GPU {device}'s {total / GIB:.1f} GiB, which is never free: vLLM asks it free after its "
                    f"own CUDA context (about {CONTEXT_BYTES / GIB:g} GiB) exists, so at most "
                    f"{max(0.0, 1 - CONTEXT_BYTES / total):.3f} here")
    return None


def before_start(flags: Mapping[str, Any]) -> float | None:
    """Wait for the memory an engine with these flags will need on each of its GPUs (tensor x pipeline x data
    parallel); the seconds waited, None off a GPU."""
    from throttle_sweep.engines.flags import engine_gpus

    gpus = engine_gpus(flags)
    return wait_for_memory(utilization_of(flags), lambda: device_memory(gpus), poll_s=POLL_S)


def utilization_of(flags: Mapping[str, Any]) -> float:
    return float(flags.get("gpu_memory_utilization") or 0.9)  # vLLM's default


def shortfall(utilization: float, reading: Reading | None) -> str | None:
    """Which GPU has less free memory than vLLM asks at start (utilization x total), in the words
    errors.refused_for_memory knows; None when each has enough, or nothing was read."""
    for device, (free, total) in enumerate(reading or []):
        if free < utilization * total:
            return (f"GPU {device} has {free / GIB:.1f} of {total / GIB:.1f} GiB free: {MEMORY_SHORT} "
                    f"{utilization:g} asks ({utilization * total / GIB:.1f} GiB)")
    return None


def after_failure(flags: Mapping[str, Any]) -> str | None:
    """`settled_shortfall` on the GPUs an engine with these flags used; None off a GPU."""
    from throttle_sweep.engines.flags import engine_gpus

    gpus = engine_gpus(flags)
    return settled_shortfall(utilization_of(flags), lambda: device_memory(gpus))
