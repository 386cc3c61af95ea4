"""Free memory on the GPUs an engine is about to use, and a wait until enough is back before it starts.

vLLM starts only when each GPU's free memory is at least gpu_memory_utilization x its total, and an engine
that has just ended (its process exiting, a CUDA context going away) gives its memory back a little later.
Read through NVML, as vLLM's own platform reads device facts: CUDA is never initialised in this process."""

from __future__ import annotations

import time
from collections.abc import Callable

Reading = list[tuple[int, int]]  # (free, total) bytes per device
WAIT_S = 60.0  # then the start is tried anyway: vLLM refuses it if the memory is still held (see slot.py)
POLL_S = 0.5


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
                    poll_s: float = POLL_S, clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep) -> float | None:
    """Poll until every device has utilization x total free, or `wait_s` has passed; the seconds waited (None
    where there is no GPU to read)."""
    began = clock()
    while True:
        reading = read()
        if reading is None:
            return None
        if all(free >= utilization * total for free, total in reading) or clock() - began >= wait_s:
            return clock() - began
        sleep(poll_s)
