"""mode=compare on the real vLLM CPU engine with the embedded tiny model."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from tests.helpers import compose_cfg
from throttle_sweep.commands import compare as compare_cmd
from throttle_sweep.stats.verdict import CHEAPER, PRICIER

pytestmark = [pytest.mark.integration, pytest.mark.quiet]  # verdicts of the real engine
SMALL = ["workload.num_requests=16", "workload.output_len=32", "workload.prompt_len=32", "workload.warmup_requests=2"]


def test_eight_in_flight_is_cheaper_than_one_with_an_interval_excluding_one(tmp_path):
    cfg = compose_cfg(*SMALL, "run=real", "baseline.max_num_seqs=1", "candidate.max_num_seqs=8", tmp_path=tmp_path)
    assert compare_cmd.run(cfg, Console(quiet=True)) == 0
    summary = json.loads((tmp_path / "real" / "summary.json").read_text())
    assert summary["verdict"] == CHEAPER and summary["ci"][1] < 1, summary
    assert all(r["status"] == "ok" for r in summary["replicates"])


def aa_compare(tmp_path, run: str) -> dict:
    # alpha 0.01: a correct method claims a difference in about 1% of A/A runs, half of them each way
    cfg = compose_cfg(*SMALL, f"run={run}", "baseline.max_num_seqs=4", "candidate.max_num_seqs=4",
                      "compare.alpha=0.01", tmp_path=tmp_path)
    assert compare_cmd.run(cfg, Console(quiet=True)) == 0
    return json.loads((tmp_path / run / "summary.json").read_text())


def runs_of(summary: dict) -> str:
    """Each run's position, arm and cost, for a failure to be read without the files."""
    return " ".join(f"{r['position']}{r['arm'][0].upper()}="
                    + ("failed" if r.get("judged_usd_per_mtok") is None else f"{r['judged_usd_per_mtok']:.4f}")
                    for r in summary["replicates"])


def test_aa_compare_does_not_claim_a_difference(tmp_path):
    # One A/A run is one draw: even a correct method claims a difference in it at rate alpha (CI failed once
    # so, ratio 0.80 [0.667, 0.961]). A claim is therefore put to a second, independent A/A, and the test fails
    # if that one repeats it: a correct method does so in alpha * alpha/2 = 0.005% of runs; a method biased
    # towards one arm (warmer, first, on a faster process) that claims in a share p of runs fails in p^2 of
    # them (pooling the two runs would keep more power, at a higher false-failure rate).
    first = aa_compare(tmp_path, "aa")
    if first["verdict"] not in (CHEAPER, PRICIER):
        return
    second = aa_compare(tmp_path, "aa-again")
    assert second["verdict"] != first["verdict"], (
        f"two A/A compares both said {first['verdict']}: ratio {first['ratio']:.3f} {first['ci']} "
        f"({runs_of(first)}), then {second['ratio']:.3f} {second['ci']} ({runs_of(second)})")
