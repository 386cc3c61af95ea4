"""One writer per results folder: a second driver is refused before it starts, measures or cleans anything."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from rich.console import Console

from tests.helpers import compose_cfg
from throttle_sweep.commands import compare as compare_cmd
from throttle_sweep.commands import sweep as sweep_cmd
from throttle_sweep.engines import FakeEngine
from throttle_sweep.errors import ConfigError
from throttle_sweep.store.lock import RunLockedError, hold
from throttle_sweep.store.records import read_records

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["backend=fake", "workload.num_requests=8", "workload.prompt_len=16", "workload.output_len=16",
         "workload.warmup_requests=0"]


def test_a_second_sweep_on_a_held_study_is_refused_before_any_engine_or_cleanup(tmp_path, monkeypatch):
    monkeypatch.setattr(FakeEngine, "start", lambda *a: pytest.fail("engine started"))
    folder = tmp_path / "held"
    folder.mkdir()
    temp = tempfile.mkdtemp(prefix="ts-ray-", dir="/tmp")  # a live driver's private Ray, as its leftovers file says
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", temp])  # names its temp dir
    try:
        (folder / "ray-local.json").write_text(json.dumps({
            "temp_dir": temp,
            "processes": [{"pid": bystander.pid, "create_time": psutil.Process(bystander.pid).create_time()}]}))
        cfg = compose_cfg(*SMALL, "+space=batching", "study.name=held", "ray.enabled=true", tmp_path=tmp_path)
        with hold(folder, what="study 'held'"), pytest.raises(RunLockedError, match=r"in use by another .*pid \d+"):
            sweep_cmd.run(cfg, Console(quiet=True))
        assert bystander.poll() is None, "the second driver killed the first one's processes as leftovers"
        assert (folder / "ray-local.json").exists() and Path(temp).is_dir()
    finally:
        bystander.kill()
        bystander.wait()
        shutil.rmtree(temp, ignore_errors=True)


def test_a_second_compare_on_a_held_run_folder_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(FakeEngine, "start", lambda *a: pytest.fail("engine started"))
    cfg = compose_cfg(*SMALL, "mode=compare", "run=c", tmp_path=tmp_path)
    with hold(tmp_path / "c", what="run 'c'"), pytest.raises(RunLockedError, match="in use"):
        compare_cmd.run(cfg, Console(quiet=True))


def test_two_real_drivers_on_one_study_the_second_is_refused_and_the_first_finishes(tmp_path):
    args = [sys.executable, "-m", "throttle_sweep", *SMALL, "+space=batching", "~space.max_num_batched_tokens",
            "space.max_num_seqs.high=8", "study.name=two", f"results_dir={tmp_path}", "study.n_trials=3",
            "compare.replicates=2", "study.confirm_replicates=2", "study.confirm_top=1", "plots=false",
            "fake.realtime=true", "fake.start_s=0.3"]
    first = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    records = tmp_path / "two" / "replicates.jsonl"
    deadline = time.monotonic() + 60
    while not records.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    second = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert second.returncode == 2
    assert f"pid {first.pid}" in second.stderr and "in use by another throttle_sweep run" in second.stderr
    out, _ = first.communicate(timeout=120)
    assert first.returncode == 0, out
    assert len({(r["comparison"], r["position"]) for r in read_records(records)}) == len(read_records(records))


@pytest.mark.parametrize("name", ["..", ".", "a/b", "/abs"])
def test_a_study_name_that_leaves_the_results_folder_is_refused(tmp_path, name):
    cfg = compose_cfg(*SMALL, "+space=batching", f"study.name='{name}'", tmp_path=tmp_path)
    with pytest.raises(ConfigError, match="study.name must be a plain folder name"):
        sweep_cmd.run(cfg, Console(quiet=True))
