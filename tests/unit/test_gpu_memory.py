"""The wait before an engine starts on a GPU, until the memory the last engine held is back (vLLM refuses a
start below gpu_memory_utilization x total free). Simulated readings and clock: only a GPU shows how long
a real engine's memory takes to come back."""

from __future__ import annotations

from throttle_sweep.engines.gpu_memory import wait_for_memory

GIB = 1 << 30


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def readings(*free_gib: float):
    seq = iter(free_gib)
    last = [free_gib[-1]]

    def read():
        value = next(seq, last[0])
        return [(int(value * GIB), 80 * GIB), (80 * GIB, 80 * GIB)]  # the second GPU of a tp=2 engine is free
    return read


def test_it_waits_until_every_gpu_has_what_vllm_will_ask_for():
    clock = Clock()
    waited = wait_for_memory(0.9, readings(20, 60, 72.0, 73.0), poll_s=0.5, clock=clock, sleep=clock.sleep)
    assert waited == 1.5  # three polls short of 72 GiB and the margin, the fourth has them


def test_it_gives_up_after_its_wait_and_lets_vllm_decide():
    clock = Clock()
    rising = readings(*[10 + i for i in range(20)])  # still coming back, too slowly
    assert wait_for_memory(0.9, rising, wait_s=5.0, poll_s=1.0, clock=clock, sleep=clock.sleep) == 5.0


def test_it_stops_once_the_memory_stops_coming_back():
    """An idle GPU never shows its whole total free, so a high gpu_memory_utilization may ask more than will
    ever come back: waiting on then costs start time for nothing."""
    clock = Clock()
    assert wait_for_memory(0.98, readings(60, 78.9), settle_s=3.0, poll_s=1.0, clock=clock, sleep=clock.sleep) == 4.0


def test_no_gpu_no_wait():
    clock = Clock()
    assert wait_for_memory(0.9, lambda: None, clock=clock, sleep=clock.sleep) is None and clock.t == 0.0


def test_a_shortfall_is_said_in_words_the_slot_takes_for_a_memory_refusal():
    from throttle_sweep.engines.gpu_memory import shortfall
    from throttle_sweep.errors import refused_for_memory

    short = shortfall(0.9, [(80 * GIB, 80 * GIB), (10 * GIB, 80 * GIB)])
    assert short is not None and "GPU 1" in short and refused_for_memory(short)
    assert shortfall(0.9, [(80 * GIB, 80 * GIB)]) is None and shortfall(0.9, None) is None
    # read after the failed engine let go of its own context: short by less than that is still short
    assert shortfall(0.9, [(int(72.5 * GIB), 80 * GIB)]) is not None


def test_the_wait_leaves_room_for_the_context_vllm_creates_before_its_own_check():
    """vLLM reads free memory after creating its CUDA context (about half a GiB, more with NCCL): NVML, read
    before, must show that much more."""
    from throttle_sweep.engines.gpu_memory import MARGIN_BYTES

    clock = Clock()
    need = 0.9 * 80 * GIB
    read = readings(need / GIB, (need + MARGIN_BYTES) / GIB)
    assert wait_for_memory(0.9, read, poll_s=1.0, clock=clock, sleep=clock.sleep) == 1.0


def test_a_reading_that_fails_means_no_wait_not_a_failed_start():
    clock = Clock()

    def broken():
        raise RuntimeError("NVML: not supported on a MIG device")
    assert wait_for_memory(0.9, broken, clock=clock, sleep=clock.sleep) is None
