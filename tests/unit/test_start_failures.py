"""Why an engine did not start, in the engine core's own words: with vLLM's multiprocess engine core (how a GPU
runs it) the process that starts it hears only "Engine core initialization failed"; the core's traceback goes
to its stderr (the server's log, for backend=server)."""

from __future__ import annotations

import os

from throttle_sweep.engines.core_stderr import cause, heard

CAUSE = ("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
         "initializing the engine.")
CORE_STDERR = f"""Triton is installed, but doesn't include CPU backend. Disabling Triton.
Process EngineCore:
Traceback (most recent call last):
  File "/usr/lib/python3.11/multiprocessing/process.py", line 314, in _bootstrap
    self.run()
  File "/v/vllm/v1/core/kv_cache_utils.py", line 1010, in _check_enough_kv_cache_memory
    raise ValueError(
{CAUSE}
/usr/lib/python3.11/multiprocessing/resource_tracker.py:254: UserWarning: resource_tracker: There appear to be 1 leaked
  warnings.warn('resource_tracker: There appear to be %d '
"""
SERVER_LOG = f"""$ vllm serve m
(EngineCore pid=6332) ERROR 12-07 18:45:50 [core.py:1510] EngineCore failed to start.
(EngineCore pid=6332) ERROR 12-07 18:45:50 [core.py:1510] Traceback (most recent call last):
(EngineCore pid=6332) ERROR 12-07 18:45:50 [core.py:1510]     raise ValueError(
(EngineCore pid=6332) ERROR 12-07 18:45:50 [core.py:1510] {CAUSE}
{CORE_STDERR}(APIServer pid=6300) Traceback (most recent call last):
""" + "".join(f'(APIServer pid=6300)   File "x.py", line {i}, in f\n' for i in range(40)) + """\
(APIServer pid=6300) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""


def test_the_cause_is_the_engine_cores_last_exception_not_the_starters_summary():
    assert cause(CORE_STDERR.splitlines()) == CAUSE
    assert cause(SERVER_LOG.splitlines()) == CAUSE  # vLLM's log prefix is not part of it
    assert cause(["RuntimeError: Engine core initialization failed. See root cause above."]) is None
    assert cause(["AssertionError", "x"]) == "AssertionError"
    assert cause(["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."]).startswith("torch.")
    assert cause([]) is None and cause(["INFO 12-07 [api_server.py:1] Starting: ok"]) is None


def test_what_is_written_to_stderr_while_an_engine_starts_is_heard_and_still_shown(capfd):
    """The core inherits this process's stderr when it is started: what it writes there is kept (its last
    lines), and still reaches the stderr it would have reached."""
    with heard() as listening:
        os.write(2, CORE_STDERR.encode())
    listening.drain()
    assert cause(listening.lines()) == CAUSE
    assert CAUSE in capfd.readouterr().err
    os.write(2, b"after\n")
    assert "after" not in listening.lines()  # stderr is this process's own again


def test_a_server_that_exits_before_it_is_healthy_says_the_engine_cores_cause(tmp_path):
    """The API server's own traceback after the core's is longer than the log's tail."""
    from throttle_sweep.engines.vllm_server import exit_reason

    log = tmp_path / "server.log"
    log.write_text(SERVER_LOG)
    assert CAUSE in exit_reason(log, 1).splitlines()[0]
