"""A user's own search space, in their own config folder, found through hydra.searchpath."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import optuna

ROOT = Path(__file__).resolve().parents[2]
FAKE = ["backend=fake", "workload.num_requests=8", "workload.prompt_len=16", "workload.output_len=16",
        "workload.concurrency=8", "workload.warmup_requests=0", "compare.replicates=2", "study.confirm_top=1",
        "study.confirm_replicates=2", "plots=false"]


def run(tmp_path: Path, space: str, text: str, *extra: str) -> subprocess.CompletedProcess:
    folder = tmp_path / "myconf"
    (folder / "space").mkdir(parents=True, exist_ok=True)
    (folder / "space" / f"{space}.yaml").write_text(text)
    args = [sys.executable, "-m", "throttle_sweep", f"hydra.searchpath=[file://{folder}]", f"+space={space}",
            *FAKE, f"results_dir={tmp_path}", *extra]
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_a_users_own_space_file_is_swept(tmp_path):
    out = run(tmp_path, "mine", "max_num_seqs: {type: int, low: 2, high: 6, step: 2}\n", "study.sampler=grid",
              "study.n_trials=3")
    assert out.returncode == 0, out.stderr
    study = optuna.load_study(study_name="sweep-mine", storage=f"sqlite:///{tmp_path / 'sweep-mine' / 'study.db'}")
    assert sorted(t.params["max_num_seqs"] for t in study.trials) == [2, 4, 6]


def test_a_bad_user_space_is_refused_naming_its_own_file_and_key(tmp_path):
    out = run(tmp_path, "bad", "max_num_seqs: {type: int, low: 8, high: 2}\n")
    assert out.returncode == 2
    assert str(tmp_path / "myconf" / "space" / "bad.yaml") in out.stderr and "max_num_seqs" in out.stderr
    assert not (tmp_path / "sweep-bad" / "replicates.jsonl").exists()
