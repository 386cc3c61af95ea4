"""The package as users install it: a wheel, installed outside the repository, run from another folder with
the `throttle-sweep` console script. The Hydra configs travel inside the package; results go under the
current folder."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The wheel, built from a copy of the sources (nothing written into the repository), installed into a
    folder of its own; this venv provides the dependencies."""
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".venv", ".git", "results", "build", "*.egg-info",
                                                             "__pycache__", "tests", "benchmarks"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(src),
                    "-w", str(work / "dist")], check=True)
    (wheel,) = (work / "dist").glob("throttle_sweep-*.whl")
    target = work / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True)
    return target


def run(installed: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(installed)}  # the installed copy, not the repository's
    return subprocess.run([str(installed / "bin" / "throttle-sweep"), *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=600)


def test_the_installed_wheel_runs_analyze_and_measure_from_another_folder(installed, tmp_path):
    probe = subprocess.run([sys.executable, "-c", "import throttle_sweep, sys; print(throttle_sweep.__file__)"],
                           cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(installed)}, text=True,
                           capture_output=True, check=True)
    assert probe.stdout.strip().startswith(str(installed))  # the wheel's copy, configs and all

    (tmp_path / "runs.csv").write_text("arm,order,usd_per_mtok\n" + "\n".join(
        f"{arm},{i},{cost}" for i, (arm, cost) in enumerate(
            [("baseline", 1.00), ("candidate", 0.50), ("candidate", 0.52), ("baseline", 1.02),
             ("candidate", 0.51), ("baseline", 0.99), ("baseline", 1.01), ("candidate", 0.50)])) + "\n")
    analyzed = run(installed, tmp_path, "mode=analyze", "input=runs.csv", "run=a")
    assert analyzed.returncode == 0, analyzed.stderr
    assert "verdict: CHEAPER" in analyzed.stdout and (tmp_path / "results" / "a").is_dir()

    measured = run(installed, tmp_path, "mode=measure", "run=m", "workload.num_requests=8", "workload.output_len=16",
                   "engine.max_num_seqs=4")
    assert measured.returncode == 0, measured.stderr[-3000:]
    assert "output tok/s" in measured.stdout and (tmp_path / "results" / "m" / "replicates.jsonl").exists()
