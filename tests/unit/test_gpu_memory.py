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
    assert wait_for_memory(0.99, readings(60, 78.9), settle_s=3.0, poll_s=1.0, clock=clock, sleep=clock.sleep) == 4.0


def test_no_gpu_no_wait():
    clock = Clock()
    assert wait_for_memory(0.9, lambda: None, clock=clock, sleep=clock.sleep) is None and clock.t == 0.0


def test_a_shortfall_is_said_in_words_the_slot_takes_for_a_memory_refusal():
    from throttle_sweep.engines.gpu_memory import shortfall
    from throttle_sweep.errors import refused_for_memory

    short = shortfall(0.9, [(80 * GIB, 80 * GIB), (10 * GIB, 80 * GIB)])
    assert short is not None and "GPU 1" in short and refused_for_memory(short)
    assert shortfall(0.9, [(80 * GIB, 80 * GIB)]) is None and shortfall(0.9, None) is None


def test_a_shortfall_is_vllms_own_rule_so_a_high_utilization_on_an_idle_gpu_is_not_short():
    """vLLM asks free >= gpu_memory_utilization x total; read after a failed start (no engine left on the GPU), a
    margin on top called 0.98 on an idle 80 GiB GPU short every time, and its failures the GPU's doing."""
    from throttle_sweep.engines.gpu_memory import shortfall

    assert shortfall(0.98, [(int(78.9 * GIB), 80 * GIB)]) is None
    assert shortfall(0.9, [(int(72.5 * GIB), 80 * GIB)]) is None
    assert shortfall(0.9, [(int(71.5 * GIB), 80 * GIB)]) is not None


def test_a_failed_start_is_judged_short_of_memory_only_once_the_memory_has_come_back():
    """A dead engine core's memory comes back some reads after its start failed: read at once, a core that died
    of its own fault looked like one refused for memory another process held."""
    from throttle_sweep.engines.gpu_memory import settled_shortfall

    clock = Clock()
    coming_back = readings(10, 30, 55, 75, 75)  # 0.9 x 80 = 72 GiB asked
    assert settled_shortfall(0.9, coming_back, poll_s=0.5, clock=clock, sleep=clock.sleep) is None
    assert clock.t == 1.5  # judged at the fourth read, the first with the memory back


def test_memory_another_process_holds_is_short_once_it_has_stopped_coming_back_within_a_bounded_wait():
    from throttle_sweep.engines.gpu_memory import settled_shortfall

    clock = Clock()
    held = readings(10, 30, 40)  # then 40 GiB for good: someone else has the rest
    short = settled_shortfall(0.9, held, poll_s=0.5, settle_s=2.0, clock=clock, sleep=clock.sleep)
    assert short is not None and "40.0 of 80.0 GiB" in short and clock.t == 3.0  # 2 s without growth after 1 s
    clock = Clock()
    rising = readings(*[10 + i for i in range(100)])  # still coming back, too slowly: the wait is bounded
    assert settled_shortfall(0.9, rising, wait_s=5.0, poll_s=1.0, clock=clock, sleep=clock.sleep) is not None
    assert clock.t == 5.0
    clock = Clock()

    def broken():
        raise RuntimeError("NVML: not supported on a MIG device")
    assert settled_shortfall(0.9, broken, clock=clock, sleep=clock.sleep) is None  # no reading, no claim


def test_a_utilization_no_gpu_can_give_is_refused_before_the_start():
    """vLLM asks free >= gpu_memory_utilization x total after creating its CUDA context, which NVML shows as
    free before: more than the total less that context can never be found free."""
    import pytest

    from throttle_sweep.engines.gpu_memory import wait_for_memory
    from throttle_sweep.errors import ConfigError

    for utilization in (0.999, 1.2):
        clock = Clock()
        with pytest.raises(ConfigError) as refused:
            wait_for_memory(utilization, readings(80), clock=clock, sleep=clock.sleep)
        said = str(refused.value)
        assert "gpu_memory_utilization" in said and f"{utilization:g}" in said and "80.0 GiB" in said, said
        assert clock.t == 0.0  # at the first reading: no wait for memory that can never come
    clock = Clock()
    assert wait_for_memory(0.98, readings(79.0), clock=clock, sleep=clock.sleep) == 0.0


def test_the_wait_leaves_room_for_the_context_vllm_creates_before_its_own_check():
    """vLLM reads free memory after creating its CUDA context (about half a GiB, more with NCCL): NVML, read
    before, must show that much more."""
    from throttle_sweep.engines.gpu_memory import CONTEXT_BYTES

    clock = Clock()
    need = 0.9 * 80 * GIB
    read = readings(need / GIB, (need + CONTEXT_BYTES) / GIB)
    assert wait_for_memory(0.9, read, poll_s=1.0, clock=clock, sleep=clock.sleep) == 1.0


def test_a_reading_that_fails_means_no_wait_not_a_failed_start():
    clock = Clock()

    def broken():
        raise RuntimeError("NVML: not supported on a MIG device")
    assert wait_for_memory(0.9, broken, clock=clock, sleep=clock.sleep) is None
