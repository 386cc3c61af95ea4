"""scripts/typed_cluster.py as a user runs it: a local Ray cluster of two pretend GPU types, the tool's goodput
sweep on it (here on the fake engine, type B four times as fast), and every Ray process it started ended."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import GOODPUT_TYPED

ROOT = Path(__file__).resolve().parents[2]


def ray_processes_of(marker: str) -> list[str]:
    done = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True)
    return [line for line in done.stdout.splitlines() if marker in line and "ps -eo" not in line]


def test_the_typed_cluster_script_runs_the_sweep_on_two_types_and_ends_its_ray(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "250"}
    args = [a for a in GOODPUT_TYPED if a != "ray.enabled=true"]
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "typed_cluster.py"), *args,
                           "cost.prices={A: 1.0, B: 2.5}", f"results_dir={tmp_path}"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    assert "type A (1 thread) on the head, type B (2 threads) on a worker" in said
    summary = json.loads((tmp_path / "g" / "summary.json").read_text())
    assert summary["winner"]["params"]["gpu_type"] == "B", said  # 4x the speed at 2.5x the price
    temp = next(line for line in said.splitlines() if line.startswith("typed_cluster:")).split("Ray's files: ")[1]
    assert not ray_processes_of(temp.rstrip(")")), ray_processes_of(temp.rstrip(")"))
