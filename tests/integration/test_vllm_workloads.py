"""Real traffic shapes in real sweeps on the vLLM CPU engine: a ShareGPT-format file, and a shared-prefix
workload searched over enable_prefix_caching."""

from __future__ import annotations

import json
from collections import Counter

import optuna
import pytest
from rich.console import Console

from tests.helpers import compose_cfg
from throttle_sweep.commands import sweep as sweep_cmd
from throttle_sweep.measurement.workload import WorkloadSpec, read_sharegpt
from throttle_sweep.store.records import read_records

pytestmark = pytest.mark.integration

SMALL = ["compare.replicates=2", "study.confirm_top=1", "study.confirm_replicates=2", "study.sampler=grid",
         "workload.warmup_requests=2", "plots=false"]


def test_a_sweep_runs_the_lengths_of_a_sharegpt_file(tmp_path):
    conversations = [{"id": str(i), "conversations": [{"from": "human", "value": "q" * (4 * (20 + 7 * i))},
                                                      {"from": "gpt", "value": "a" * (4 * (16 + 5 * i))}]}
                     for i in range(12)]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(conversations))
    cfg = compose_cfg("+space=batching", "study.name=sg", "study.n_trials=2", "~space.max_num_batched_tokens",
                      "space.max_num_seqs.low=2", "space.max_num_seqs.high=4", "space.max_num_seqs.log=false",
                      f"workload.sharegpt={path}", "workload.num_requests=8", "workload.concurrency=8",
                      *SMALL, tmp_path=tmp_path)
    assert sweep_cmd.run(cfg, Console(quiet=True)) == 0
    pairs = read_sharegpt(path, WorkloadSpec(num_requests=8, sharegpt=str(path)))
    records = [r for r in read_records(tmp_path / "sg" / "replicates.jsonl") if r["status"] == "ok"]
    assert records and all(r["input_tokens"] == sum(n for n, _, _ in pairs) for r in records)
    assert all(r["output_tokens"] == sum(n for _, n, _ in pairs) for r in records)
    study = optuna.load_study(study_name="sg", storage=f"sqlite:///{tmp_path / 'sg' / 'study.db'}")
    assert sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials) == 2


def test_a_shared_prefix_sweep_over_prefix_caching_hits_the_cache_only_when_it_is_on(tmp_path):
    cfg = compose_cfg("+space=prefix", "study.name=px", "study.n_trials=2", "workload.shared_prefix_len=384",
                      "workload.prompt_len=16", "workload.output_len=16", "workload.num_requests=16",
                      "workload.concurrency=8", "baseline.max_num_seqs=8", "engine.kv_cache_memory_bytes=67108864",
                      *SMALL, tmp_path=tmp_path)  # 64 MiB: with caching off, 8 requests of 4 blocks do not preempt
    assert sweep_cmd.run(cfg, Console(quiet=True)) == 0
    records = [r for r in read_records(tmp_path / "px" / "replicates.jsonl")
               if r["status"] == "ok" and r["arm"] == "candidate"]
    rates = Counter()
    for r in records:
        on = r["engine_flags"]["enable_prefix_caching"]
        assert r["prefix_cache"]["queries"] >= 16 * 400 if on else True
        rates[on] = max(rates[on], r["prefix_cache"]["hit_rate"] or 0.0)
    # with caching on, every request after the first finds the 384-token prefix (at least 80% of 400 tokens,
    # less the first request's); with it off, nothing is cached
    assert rates[True] > 0.8 and rates[False] == 0.0
