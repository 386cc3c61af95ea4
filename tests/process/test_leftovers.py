"""The leftovers of a killed driver's private Ray: ended only when they prove to be that Ray's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import psutil

from throttle_sweep.cluster.ray_runtime import LEFTOVERS, end_leftovers


def started(*args):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *args])
    return proc, {"pid": proc.pid, "create_time": psutil.Process(proc.pid).create_time()}


def test_only_processes_that_name_the_private_temp_dir_are_ended(tmp_path):
    temp = tempfile.mkdtemp(prefix="ts-ray-", dir="/tmp")
    ours, ours_info = started(f"--session-dir={temp}/session_x")
    stranger, stranger_info = started("--unrelated")  # same pid and start time as noted, but not that Ray's
    try:
        (tmp_path / LEFTOVERS).write_text(json.dumps({"temp_dir": temp, "processes": [ours_info, stranger_info]}))
        said = []
        assert end_leftovers(tmp_path, said.append) == 1
        assert ours.wait(timeout=10) is not None and stranger.poll() is None
        assert not (tmp_path / LEFTOVERS).exists() and not os.path.exists(temp)
    finally:
        for proc in (ours, stranger):
            proc.kill()
            proc.wait()
        shutil.rmtree(temp, ignore_errors=True)


def test_a_leftovers_file_that_names_a_foreign_dir_ends_and_removes_nothing(tmp_path):
    victim, info = started("/etc")
    try:
        (tmp_path / LEFTOVERS).write_text(json.dumps({"temp_dir": "/etc", "processes": [info]}))
        said = []
        assert end_leftovers(tmp_path, said.append) == 0
        assert victim.poll() is None and os.path.isdir("/etc")
        assert "not a private Ray temp dir of this tool" in said[0]
        (tmp_path / LEFTOVERS).write_text("not json")
        assert end_leftovers(tmp_path, said.append) == 0 and "not a leftovers file" in said[1]
    finally:
        victim.kill()
        victim.wait()


def test_the_suites_leftover_check_counts_this_runs_processes_and_no_one_elses():
    """A process of this test run is seen, orphans included (the mark is inherited); one another run started
    on this machine (its own mark) is not, so a second suite beside this one cannot fail it."""
    import os
    import subprocess
    import sys

    from tests.conftest import RUN_MARK, _ray_and_engine_processes

    sleeper = [sys.executable, "-c", "import time; time.sleep(60)", "orphan_guard"]
    ours = subprocess.Popen(sleeper)
    theirs = subprocess.Popen(sleeper, env={**os.environ, RUN_MARK[0]: "another run"})
    try:
        seen = {pid for pid, _ in _ray_and_engine_processes()}
        assert ours.pid in seen and theirs.pid not in seen
    finally:
        for p in (ours, theirs):
            p.kill()
            p.wait()
