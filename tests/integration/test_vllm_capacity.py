"""mode=capacity on the real vLLM CPU engine with the embedded tiny model (#26)."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from tests.helpers import compose_cfg
from throttle_sweep.commands import capacity as capacity_cmd
from throttle_sweep.records import read_records

pytestmark = pytest.mark.integration
SMALL = ["workload.num_requests=20", "capacity.run_s=4", "workload.output_len=16", "workload.prompt_len=32", "workload.warmup_requests=2",
         "compare.restart=never", "slo.p95_ttft_s=1.0", "slo.p95_tpot_s=0.2", "capacity.rel_tol=0.3",
         "capacity.knee_rates=3", "capacity.knee_replicates=2", "capacity.knee_margin=0.3", "plots=false"]


def capacity(tmp_path, seqs: int) -> dict:
    cfg = compose_cfg(*SMALL, f"run=seqs{seqs}", f"engine.max_num_seqs={seqs}", "capacity.rate_start=4",
                      tmp_path=tmp_path)
    capacity_cmd.run(cfg, Console(quiet=True))
    records = read_records(tmp_path / f"seqs{seqs}" / "replicates.jsonl")
    assert records and all(r["status"] == "ok" and len(r["requests_s"]) >= 20 for r in records)
    return json.loads((tmp_path / f"seqs{seqs}" / "summary.json").read_text())


def test_eight_in_flight_serve_a_higher_rate_within_the_slo_than_one(tmp_path):
    """One sequence at a time serves 16-token requests one after another; eight share each step. The rate
    eight keep the SLO at lies above the upper bound of one's capacity (measured beside other work on 2
    cores: one's upper bound 8.7 req/s, eight's capacity 29 req/s)."""
    one, eight = capacity(tmp_path, 1), capacity(tmp_path, 8)
    assert one["capacity_ci"][1] is not None and eight["capacity_rps"] is not None, (one, eight)
    assert one["capacity_ci"][1] < eight["capacity_rps"], (one["capacity_ci"], eight["capacity_rps"])
    assert eight["goodput_tokens_per_s"] == pytest.approx(eight["capacity_rps"] * 0.9 * 16)
