"""mode=recheck on the real vLLM CPU engine: a small sweep's exported winner still holds its saving (exit 0),
and the baseline's own flags deployed as the winner do not (exit 1)."""

from __future__ import annotations

import io
import json
import shutil

import pytest
from rich.console import Console

from tests.helpers import compose_cfg, deploy
from throttle_sweep.commands import recheck as recheck_cmd
from throttle_sweep.commands import sweep as sweep_cmd

pytestmark = [pytest.mark.integration, pytest.mark.quiet]  # a timing verdict: the machine to itself


def test_a_real_sweeps_winner_rechecks_cheaper_and_the_baselines_flags_deployed_do_not(tmp_path):
    # test_vllm_sweep's smallest sweep on half its work (8 requests of 32 + 64 tokens: the baseline's runs,
    # one request at a time, are most of the time), over max_num_seqs 4-8
    cfg = compose_cfg("+space=batching", "study.name=edge", "study.n_trials=1", "study.sampler=grid",
                      "space.max_num_seqs.low=4", "space.max_num_seqs.high=8", "space.max_num_seqs.log=false",
                      "~space.max_num_batched_tokens", "engine.kv_cache_memory_bytes=2097152",
                      "engine.max_model_len=256", "compare.replicates=2", "study.confirm_top=1",
                      "study.confirm_replicates=4", "workload.num_requests=8", "workload.prompt_len=32",
                      "workload.output_len=64", "workload.concurrency=8", "workload.warmup_requests=0",
                      "plots=false", tmp_path=tmp_path)
    assert sweep_cmd.run(cfg, Console(quiet=True)) == 0
    best = tmp_path / "edge" / "best"
    claimed = json.loads((best / "best.json").read_text())
    assert claimed["measured_with"]["device"] == "cpu" and claimed["measured_with"]["vllm_version"]

    again = compose_cfg("mode=recheck", "study.name=edge", "plots=false", tmp_path=tmp_path)
    assert recheck_cmd.run(again, Console(quiet=True)) == 0
    (folder,) = (tmp_path / "edge").glob("recheck-*")
    records = [json.loads(line) for line in (folder / "replicates.jsonl").read_text().splitlines()]
    assert all(r["status"] == "ok" and r["environment"]["vllm_version"] == claimed["measured_with"]["vllm_version"]
               and "driver_version" in r["environment"] for r in records)

    worse = tmp_path / "deployed"  # the baseline's flags exported as the winner: its default token budget too
    shutil.copytree(best, worse)
    deploy(worse, max_num_seqs=claimed["baseline"]["max_num_seqs"], max_num_batched_tokens=None)
    worse_cfg = compose_cfg("mode=recheck", f"recheck.best={worse}", "run=worse", "compare.replicates=2",
                            "plots=false", tmp_path=tmp_path)
    said = io.StringIO()
    assert recheck_cmd.run(worse_cfg, Console(file=said, width=400, soft_wrap=True)) == 1
    (verdict,) = [line for line in said.getvalue().splitlines() if line.startswith("recheck: ")]
    assert "NO LONGER HOLDS" in verdict and f"ratio {claimed['ratio_vs_baseline']:.3f}" in verdict
    summary = json.loads((tmp_path / "worse" / "summary.json").read_text())
    assert summary["labels"]["candidate"] == "candidate (A/A)" and summary["verdict"] != "CHEAPER"
