"""mode=capacity on the fake engine (#26): the highest arrival rate at which one configuration keeps its SLO,
with an interval, goodput and cost there; a resume, an SLO never met or always met, and bad input refused
before any engine starts."""

from __future__ import annotations

import json
import math

import pytest
from rich.console import Console

from tests.helpers import compose_cfg
from throttle_sweep.capacity.slo import Slo
from throttle_sweep.capacity.steady import counted
from throttle_sweep.cli import compose_or_explain
from throttle_sweep.commands import capacity as capacity_cmd
from throttle_sweep.errors import ConfigError
from throttle_sweep.settings.schema import CONF_DIR
from throttle_sweep.store.records import read_records

SLO = ("slo.p95_ttft_s=0.2", "slo.p95_tpot_s=0.05")
SMALL = ("backend=fake", "workload.num_requests=100", "capacity.run_s=20", "capacity.knee_rates=4",
         "capacity.knee_replicates=4")


def run(tmp_path, *args, name="cap"):
    console = Console(record=True, width=200)
    code = capacity_cmd.run(compose_cfg("mode=capacity", f"run={name}", *args, tmp_path=tmp_path), console)
    return code, console.export_text()


def test_the_capacity_is_bracketed_by_runs_that_keep_and_break_the_slo(tmp_path):
    code, said = run(tmp_path, *SMALL, *SLO, "fake.noise_sd=0.02")
    assert code == 0, said
    summary = json.loads((tmp_path / "cap" / "summary.json").read_text())
    low, high = summary["capacity_ci"]
    assert summary["bracket"][0] < summary["bracket"][1] <= summary["bracket"][0] * 1.1  # capacity.rel_tol
    assert low <= summary["capacity_rps"] <= high and high / low < 1.6
    slo = Slo(0.2, 0.05, 0.9)
    knee = [r for r in read_records(tmp_path / "cap" / "replicates.jsonl") if r["search_stage"] == "knee"
            and not r.get("void")]
    assert len(knee) == 4 * 4
    pooled: dict[float, list[int]] = {}  # rate -> [met, counted] over its runs: the share of all its requests
    for record in knee:
        met, n, _ = counted(record, slo)
        pooled.setdefault(record["workload"]["rate"], [0, 0])
        pooled[record["workload"]["rate"]][0] += met
        pooled[record["workload"]["rate"]][1] += n
    # every rate at or below the lower bound kept the SLO, pooled over its runs; at or above the upper, broke it
    assert all(m / n >= 0.9 for rate, (m, n) in pooled.items() if rate <= low)
    assert all(m / n < 0.9 for rate, (m, n) in pooled.items() if rate >= high)
    assert [r["attainment"] for r in summary["rates"]] == [m / n for _, (m, n) in sorted(pooled.items())]
    for record in read_records(tmp_path / "cap" / "replicates.jsonl"):  # arrivals over at least run_s (20 s)
        rate = record["workload"]["rate"]
        assert record["workload"]["num_requests"] == max(100, math.ceil(rate * 20)) == len(record["requests_s"])
    tokens = summary["output_tokens_per_request"]
    assert summary["goodput_tokens_per_s"] == pytest.approx(summary["capacity_rps"] * 0.9 * tokens)
    assert summary["usd_per_mtok_at_capacity"] == pytest.approx(1.39 / 3600 / summary["goodput_tokens_per_s"] * 1e6)
    assert f"capacity: {summary['capacity_rps']:.3g} req/s, 95% CI [{low:.3g}, {high:.3g}]" in said
    # what the capacity depends on is said with it (#46 item 1): the runs' length and the warm-up each dropped
    line = next(x for x in said.splitlines() if x.startswith("capacity: "))
    low_w, high_w = summary["warmup_s"]
    assert f"runs of at least 20 s, warm-up {low_w:.1f}-{high_w:.1f} s chosen per run (MSER-5)" in line
    assert summary["run_s"] == 20.0 and 0 <= low_w <= high_w < 10  # at most half a run
    assert (tmp_path / "cap" / "capacity.png").stat().st_size > 10_000


def test_a_rerun_reads_the_runs_back_and_measures_nothing_again(tmp_path):
    assert run(tmp_path, *SMALL, *SLO, "plots=false")[0] == 0
    first = read_records(tmp_path / "cap" / "replicates.jsonl")
    code, said = run(tmp_path, *SMALL, *SLO, "plots=false")
    assert code == 0 and f"resuming: {len(first)} runs already measured" in said
    assert read_records(tmp_path / "cap" / "replicates.jsonl") == first
    refused = pytest.raises(ConfigError, match="holds records of another configuration")
    with refused:
        run(tmp_path, *SMALL, "slo.p95_ttft_s=0.3", "slo.p95_tpot_s=0.05", "plots=false")


def test_an_slo_no_rate_keeps_says_the_best_attainment_and_where(tmp_path):
    code, said = run(tmp_path, *SMALL, "slo.p95_ttft_s=0.001", "capacity.min_rate=0.5", "plots=false")
    assert code == 1 and "no rate down to capacity.min_rate=0.5 req/s kept the SLO" in said
    assert "the best attainment was 0.0% at" in said


def test_an_slo_kept_at_every_rate_up_to_the_limit_says_so(tmp_path):
    code, said = run(tmp_path, *SMALL, "slo.p95_ttft_s=100", "capacity.max_rate=5", "plots=false")
    assert code == 1 and "held up to capacity.max_rate=5 req/s: raise it" in said


@pytest.mark.parametrize(("args", "words"), [
    ((), "mode=capacity needs a latency SLO"),
    (("slo.p95_ttft_s=-1",), "slo.p95_ttft_s must be a positive number"),
    (("slo.p95_ttft_s=1", "capacity.rate_start=0"), "capacity.rate_start must be a positive number"),
    (("slo.p95_ttft_s=1", "slo.attainment=1.5"), "slo.attainment"),
    (("slo.p95_ttft_s=1", "capacity.knee_replicates=1"), "capacity.knee_replicates must be an even integer >= 2"),
    # half the runs at a knee rate ascend, half descend, so that drift cancels (#46: 3 was accepted)
    (("slo.p95_ttft_s=1", "capacity.knee_replicates=3"), "capacity.knee_replicates must be an even integer"),
    # the rate is the user's, whatever the loop: named as such, never as a key the user did not set (#46)
    (("slo.p95_ttft_s=1", "workload.rate=0"), "workload.rate must be a positive number"),
    (("slo.p95_ttft_s=1", "workload.rate=-1"), "workload.rate must be a positive number"),
    (("slo.p95_ttft_s=1", "workload=open_loop", "workload.rate=0"), "workload.rate must be a positive number"),
    (("slo.p95_ttft_s=1", "workload.num_requests=5"), "too few to tell a share"),
    (("slo.p95_ttft_s=1", "workload.num_requests=100", "capacity.run_s=0"), "capacity.run_s must be a positive"),
    # a fixed share dropped from every run proved nothing of steady state (#46 item 1): its replacement is named
    (("slo.p95_ttft_s=1", "capacity.settle_share=0.2"), "settle_share=0.2: .*chosen from its own requests \\(MSER-5"),
])
def test_bad_input_is_refused_by_name_before_any_engine_starts(tmp_path, args, words):
    with pytest.raises(ConfigError, match=words):
        run(tmp_path, "backend=fake", *args)
    assert not (tmp_path / "cap").exists()


def test_two_runs_a_rate_are_warned_of_before_the_spend(tmp_path):
    """With two runs a rate (1 df) no rate holds beyond doubt, not even one met by every request twice: said
    before any run, as compare.replicates=2 is."""
    code, said = run(tmp_path, *SMALL, *SLO, "capacity.knee_replicates=2", "plots=false")
    first_run = said.index("req/s")
    note = said.find("capacity.knee_replicates=2")
    assert 0 <= note < first_run and "1 degree of freedom" in said[note:first_run], said[:first_run + 200]


def test_a_misspelt_slo_key_is_named_with_the_nearest_valid_one():
    with pytest.raises(ConfigError, match="p95_ttft_s"):
        compose_or_explain(["mode=capacity", "slo.p95_ttf_s=1"], CONF_DIR)


def test_analyze_lists_capacity_runs_and_takes_none_for_a_comparison(tmp_path):
    from throttle_sweep.commands import analyze as analyze_cmd

    assert run(tmp_path, *SMALL, *SLO, "plots=false")[0] == 0
    runs = len(read_records(tmp_path / "cap" / "replicates.jsonl"))
    console = Console(record=True, width=200)
    cfg = compose_cfg("mode=analyze", f"input={tmp_path / 'cap' / 'replicates.jsonl'}", "plots=false",
                      tmp_path=tmp_path)
    analyze_cmd.run(cfg, console)
    said = console.export_text()
    assert f"{runs} runs of mode=capacity" in said and "not a comparison" in said


def test_replicates_at_one_rate_draw_their_own_arrival_schedules(tmp_path):
    """Requests within a run share its queue, so the run is the unit of noise, and which Poisson schedule was
    drawn is part of that noise: the knee's replicates at a rate each take another arrival seed (the same
    seeds at every rate), so their spread, and the interval, include it."""
    assert run(tmp_path, *SMALL, *SLO, "plots=false")[0] == 0
    knee = [r for r in read_records(tmp_path / "cap" / "replicates.jsonl") if r["search_stage"] == "knee"
            and not r.get("void")]
    seeds: dict[float, list[int]] = {}
    for record in knee:
        seeds.setdefault(record["workload"]["rate"], []).append(record["workload"]["arrival_seed"])
    assert len(seeds) == 4 and all(len(set(s)) == 4 for s in seeds.values())
    assert len({tuple(sorted(s)) for s in seeds.values()}) == 1
