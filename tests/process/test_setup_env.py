"""scripts/setup's choice of engine build and environment: the CPU build's settings on the CPU build only."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CPU_ONLY = ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_OMP_THREADS_BIND", "OMP_NUM_THREADS")


def sourced(tmp_path: Path, *, gpu: bool) -> dict[str, str]:
    """The environment `source scripts/setup` leaves, in a copy of the project whose venv is already installed
    for the build this machine takes (so nothing is installed)."""
    root = tmp_path / "project"
    (root / "scripts").mkdir(parents=True)
    for name in ("setup", "engine-env"):
        shutil.copy(ROOT / "scripts" / name, root / "scripts" / name)
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    (root / ".venv" / "bin").mkdir(parents=True)
    (root / ".venv" / "bin" / "python").symlink_to(sys.executable)
    digest = hashlib.sha256((root / "pyproject.toml").read_bytes()).hexdigest()
    (root / ".venv" / ".throttle_sweep-installed").write_text(f"{'gpu' if gpu else 'cpu'} {digest}\n")
    stub = tmp_path / "bin"
    stub.mkdir()
    if gpu:  # what a GPU machine's nvidia-smi answers to -L
        (stub / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n")
        (stub / "nvidia-smi").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in CPU_ONLY}
    env["PATH"] = f"{stub}:{env['PATH']}"
    done = subprocess.run(["bash", "-c", f"source {root / 'scripts' / 'setup'} && echo EXTRA=$EXTRA && env"],
                          env=env, capture_output=True, text=True, check=True)
    return dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)


def test_a_gpu_machine_gets_the_cuda_build_and_none_of_the_cpu_builds_settings(tmp_path):
    env = sourced(tmp_path, gpu=True)
    assert env["EXTRA"] == "gpu" and not any(k in env for k in CPU_ONLY)


def test_a_machine_without_a_gpu_gets_the_cpu_build_and_its_settings(tmp_path):
    if subprocess.run(["sh", "-c", "command -v nvidia-smi && nvidia-smi -L"], capture_output=True).returncode == 0:
        return  # this machine has a GPU: the other test covers it
    env = sourced(tmp_path, gpu=False)
    assert env["EXTRA"] == "cpu" and env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and env["OMP_NUM_THREADS"] == "1"
