"""study.objective=goodput on the real vLLM CPU engine with the embedded tiny model (#26): eight sequences at
once against the baseline's one, each with its own rate search, then confirmed on interleaved fresh runs."""

from __future__ import annotations

import itertools
import json
import math

import pytest
from rich.console import Console

from tests.helpers import compose_cfg
from throttle_sweep.commands import sweep as sweep_cmd
from throttle_sweep.store.records import read_records

# a real engine's verdict on timing: beside other tests on 2 cores it measured the neighbours (CI, 2026-12-07)
pytestmark = [pytest.mark.integration, pytest.mark.quiet]
SMALL = ["+space=batching", "study.objective=goodput", "space.max_num_seqs.low=8", "space.max_num_seqs.high=8",
         "space.max_num_batched_tokens.choices=[2048]", "study.n_trials=1", "study.confirm_top=1",
         "workload.num_requests=20", "capacity.run_s=1", "workload.output_len=16", "workload.prompt_len=32",
         "workload.warmup_requests=2", "compare.restart=never", "slo.p95_ttft_s=1.0", "slo.p95_tpot_s=0.2",
         "capacity.rel_tol=1", "capacity.knee_rates=3", "capacity.knee_replicates=4", "capacity.knee_margin=0.3",
         "capacity.rate_start=16", "workload.target_rps=100", "plots=false", "study.name=g"]


def test_eight_in_flight_win_a_goodput_sweep_and_say_how_many_replicas_serve_the_target(tmp_path):
    """On a doubling bracket from 16 req/s, the baseline (one sequence at a time) broke the SLO at a rate at
    most the highest eight kept it at; eight is the winner, confirmed on fresh runs interleaved with the
    baseline's, cheaper beyond doubt (else nothing is exported), and ceil(100 / its capacity) replicas serve
    100 req/s."""
    console = Console(record=True, width=250)
    code = sweep_cmd.run(compose_cfg(*SMALL, tmp_path=tmp_path), console)
    said = console.export_text()
    assert code == 0, said
    records = read_records(tmp_path / "g" / "replicates.jsonl")
    assert records and all(r["status"] == "ok" for r in records), [r.get("reason") for r in records]
    summary = json.loads((tmp_path / "g" / "summary.json").read_text())
    base, eight = summary["screen"]
    assert base["config"] == "baseline" and eight["params"]["max_num_seqs"] == 8
    assert base["bracket"][1] <= eight["bracket"][0], (base["bracket"], eight["bracket"])
    winner = summary["winner"]
    assert winner["params"]["max_num_seqs"] == 8
    assert winner["fleet"]["replicas"] == math.ceil(100 / winner["capacity_rps"])
    confirm = [r["config"] for r in records if r["stage"] == "goodput-confirm" and not r.get("void")]
    # 3 knee rates x 4 passes each (with 2 runs a rate no rate holds or fails beyond doubt, and only a winner
    # cheaper beyond doubt is exported); the baseline also at the candidate's lowest knee rate above its own
    assert set(confirm) == {"baseline", "trial 0"} and confirm.count("trial 0") == 3 * 4
    assert 3 * 4 <= confirm.count("baseline") <= 4 * 4
    # interleaved in mirrored passes (B T B T B T | T B T B T B): two of a kind only where a pass turns
    assert max(len(list(run)) for _, run in itertools.groupby(confirm)) <= 2, confirm
    winner_words = " ".join(said[said.index("\nwinner:"):].split())[:1200]  # (a long line wraps at the width)
    assert " replica" in winner_words, winner_words
    assert winner["cheaper_than_baseline"] and (tmp_path / "g" / "best" / "vllm_config.yaml").exists()
