from __future__ import annotations

import os
import uuid

import pytest

from throttle_sweep.engines.vllm_inproc import cpu_build

# vLLM's CPU build in this process (see scripts/engine-env); set before anything imports vllm. On a GPU
# the tests run vLLM as production does (the multiprocess engine core).
if cpu_build():
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# every process this test run starts inherits the mark, orphans included: another run's processes on the same
# machine (a second checkout's suite, CI beside a developer) are not this run's to answer for
RUN_MARK = ("THROTTLE_SWEEP_TEST_RUN", uuid.uuid4().hex)
os.environ[RUN_MARK[0]] = RUN_MARK[1]


def _ray_and_engine_processes() -> set[tuple[int, float]]:
    import psutil

    found = set()
    for p in psutil.process_iter(["pid", "cmdline", "create_time"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if cmd.startswith("ray::") or any(k in cmd for k in ("raylet", "gcs_server", "ray/dashboard", "ray/_private",
                                                             "multiprocessing.spawn import spawn_main",
                                                             "vllm.entrypoints.openai.api_server", "vllm.entrypoints.cli.main serve",
                                                             "orphan_guard")):
            try:
                ours = p.environ().get(RUN_MARK[0]) == RUN_MARK[1]
            except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
                ours = False
            if ours:
                found.add((p.info["pid"], p.info["create_time"]))
    return found


@pytest.fixture(scope="session", autouse=True)
def no_process_left_behind():
    """After the suite, every Ray or engine process the tests started must have ended."""
    import time

    before = _ray_and_engine_processes()
    yield
    deadline = time.monotonic() + 90
    while (left := _ray_and_engine_processes() - before) and time.monotonic() < deadline:
        time.sleep(1)
    assert not left, f"processes left running after the test suite: {sorted(pid for pid, _ in left)}"


@pytest.fixture
def ctrl_c():
    """SIGINT raises KeyboardInterrupt in this process for the test, whatever the suite inherited (a shell's
    background job starts with it ignored): a test that sends one sets what it relies on."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)
