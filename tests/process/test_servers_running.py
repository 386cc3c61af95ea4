"""The tests' "no server left running" check counts only the servers its own test worker started: under
xdist another worker's test may have a vLLM server up at the same moment."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from tests.helpers import servers_running

# a process whose command line reads as vLLM's API server (argv[0] of `python -c` is "-c"; the rest is argv)
LOOKALIKE = [sys.executable, "-c", "import time; time.sleep(60)", "vllm.entrypoints.openai.api_server"]


def start(env: dict[str, str]) -> subprocess.Popen:
    proc = subprocess.Popen(LOOKALIKE, env=env)
    time.sleep(0.3)
    return proc


def test_a_server_another_worker_started_is_not_this_workers():
    ours = start(dict(os.environ))
    theirs = start({**os.environ, "PYTEST_XDIST_WORKER": "gw-elsewhere"})
    try:
        running = servers_running()
        assert ours.pid in running and theirs.pid not in running
    finally:
        for proc in (ours, theirs):
            proc.kill()
            proc.wait()
    assert ours.pid not in servers_running()
