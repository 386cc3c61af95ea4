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
    waited = wait_for_memory(0.9, readings(20, 60, 71.9, 72.0), poll_s=0.5, clock=clock, sleep=clock.sleep)
    assert waited == 1.5  # three polls short of 72 GiB, the fourth has it


def test_it_gives_up_after_its_wait_and_lets_vllm_decide():
    clock = Clock()
    assert wait_for_memory(0.9, readings(10), wait_s=5.0, poll_s=1.0, clock=clock, sleep=clock.sleep) == 5.0


def test_no_gpu_no_wait():
    clock = Clock()
    assert wait_for_memory(0.9, lambda: None, clock=clock, sleep=clock.sleep) is None and clock.t == 0.0
