"""The GPU path at GPU scale on the twin, as a user runs it: `engine=gpu +space=batching backend=twin`, in its
own process, cut down in work and trials. What only a GPU shows is not here: the twin predicts (docs/twin.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["workload.num_requests=256", "workload.concurrency=256", "workload.replicate_s=null",
         "workload.prompt_len=128", "workload.output_len=64", "space.max_num_seqs.high=256",
         "space.max_num_batched_tokens.choices=[128,8192]", "study.n_trials=3", "study.confirm_top=1"]


def test_the_default_gpu_sweep_runs_on_the_h100_twin_starts_nothing_vllm_refuses_and_says_what_it_would_cost(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "250"}
    done = subprocess.run([sys.executable, "-m", "throttle_sweep", "engine=gpu", "+space=batching", "backend=twin",
                           "twin.gpu=H100", f"results_dir={tmp_path}", "study.name=twin", *SMALL],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    out = done.stdout
    assert done.returncode in (0, 1), out + done.stderr  # 1: no candidate beat vLLM's defaults, said so
    assert "plan: up to" in out
    assert "GPU time on the twin (H100-80GB, predicted, not measured)" in out
    assert "refused by vLLM: max_num_batched_tokens=128 with max_num_seqs 129-256" in out
    assert "first preempting max_num_seqs=129" not in out  # a refusal is no preemption boundary
    records = [json.loads(line) for line in (tmp_path / "twin" / "replicates.jsonl").read_text().splitlines()]
    assert records and {r["environment"]["device"] for r in records} == {"twin"}
    started = [r["engine_flags"] for r in records]
    assert not [f for f in started if f.get("max_num_batched_tokens", 8192) < f.get("max_num_seqs", 1)]
    # the baseline is vLLM's own default on an H100, as `vllm serve` resolves it
    baseline = next(r for r in records if r["stage"] == "probe" and r["arm"] == "baseline")
    assert baseline["served_defaults"] == {"max_num_seqs": 1024, "max_num_batched_tokens": 8192}
