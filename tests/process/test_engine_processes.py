"""What only real engine processes show: a hanging engine's process ended when its slots close, and a
server started through the orphan guard ended with the process that started it, even after SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

from throttle_sweep.cluster.pool import Job, LocalPool


def test_closing_two_slots_while_both_measure_ends_every_engine_process_and_thread():
    """Ctrl-C with two local slots: the driver's thread closes the slots while each slot's thread waits for
    its engine (here both engines hang). Every engine process ends, both threads end, nothing raises."""
    from throttle_sweep.cluster.slot import WarmSlot
    from throttle_sweep.engines import FakeEngine, FakeKnobs
    from throttle_sweep.measurement.cost import Price
    from throttle_sweep.measurement.workload import WorkloadSpec

    spec = WorkloadSpec(num_requests=8, prompt_len=16, output_len=32, concurrency=8, warmup_requests=0)
    engine = FakeEngine(FakeKnobs(hang_when={"max_num_seqs": 1}))
    slots = [WarmSlot(engine, spec, Price(), run_id="t", name=f"local-{i}", engine_warmup="none") for i in range(2)]
    pool = LocalPool([s.measure for s in slots])
    threads = list(pool._threads)  # noqa: SLF001 - what the pool runs
    for slot in (0, 1):
        pool.submit(Job(slot, {"max_num_seqs": 2, "kv_cache_memory_bytes": 1 << 20}, "candidate", 0))
    deadline = time.monotonic() + 60
    while not all(s.hosts and s.hosts[0].environment for s in slots):  # both engine processes are ready
        assert time.monotonic() < deadline, "the engine processes never got ready"
        time.sleep(0.1)
    time.sleep(1.0)  # and their engines have started the replicate, and hang in it
    processes = [h.process for s in slots for h in s.hosts]
    began = time.monotonic()
    pool.close()
    for s in slots:
        s.close()
    pool.join(timeout=30)
    assert time.monotonic() - began < 30
    assert not any(t.is_alive() for t in threads)
    assert not any(p.is_alive() for p in processes) and not any(s.hosts for s in slots)
    left = pool.drain()  # what the threads saw: their engines shut down, the slot's doing, never the flags'
    assert len(left) == 2 and all(r["status"] == "failed" and r["infrastructure"] for r in left), left


def test_a_guarded_server_ends_with_the_process_that_started_it():
    """The starter is SIGKILLed (no clean-up runs): the kernel still ends what it started through the guard."""
    starter = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-m', 'throttle_sweep.engines.orphan_guard', sys.executable, '-c',"
        " 'import time; time.sleep(120)'])\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(120)\n")], stdout=subprocess.PIPE, text=True)
    guarded = int(starter.stdout.readline())
    deadline = time.monotonic() + 20
    while psutil.Process(guarded).cmdline()[1:] != ["-c", "import time; time.sleep(120)"]:  # it becomes the program
        assert time.monotonic() < deadline, psutil.Process(guarded).cmdline()
        time.sleep(0.05)
    os.kill(starter.pid, signal.SIGKILL)
    starter.wait()
    def running() -> bool:
        try:
            return psutil.Process(guarded).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + 10
    while running() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running()
