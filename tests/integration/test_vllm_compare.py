"""mode=compare on the real vLLM CPU engine with the embedded tiny model."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from tests.helpers import compose_cfg
from throttle_sweep.commands import compare as compare_cmd
from throttle_sweep.stats import CHEAPER, PRICIER

pytestmark = pytest.mark.integration
SMALL = ["workload.num_requests=16", "workload.output_len=32", "workload.prompt_len=32", "workload.warmup_requests=2"]


def test_eight_in_flight_is_cheaper_than_one_with_an_interval_excluding_one(tmp_path):
    cfg = compose_cfg(*SMALL, "run=real", "baseline.max_num_seqs=1", "candidate.max_num_seqs=8", tmp_path=tmp_path)
    assert compare_cmd.run(cfg, Console(quiet=True)) == 0
    summary = json.loads((tmp_path / "real" / "summary.json").read_text())
    assert summary["verdict"] == CHEAPER and summary["ci"][1] < 1, summary
    assert all(r["status"] == "ok" for r in summary["replicates"])


def test_aa_compare_does_not_claim_a_difference(tmp_path):
    # alpha 0.01 keeps this real-machine test's own false-alarm rate at about 1%.
    cfg = compose_cfg(*SMALL, "run=aa", "baseline.max_num_seqs=4", "candidate.max_num_seqs=4", "compare.alpha=0.01",
                      tmp_path=tmp_path)
    assert compare_cmd.run(cfg, Console(quiet=True)) == 0
    summary = json.loads((tmp_path / "aa" / "summary.json").read_text())
    assert summary["verdict"] not in (CHEAPER, PRICIER), summary
