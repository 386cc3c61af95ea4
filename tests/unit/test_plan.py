"""The plan a sweep prints after the baseline's run and again after its probes, and the dollar budget that stops the search before it is spent."""

from __future__ import annotations

import pytest
from rich.console import Console

from tests.helpers import compose_cfg
from throttle_sweep.commands import sweep as sweep_cmd
from throttle_sweep.records import read_records
from throttle_sweep.search.plan import project
from throttle_sweep.search.trials import engine_seconds


def test_the_projection_counts_each_arm_at_its_own_run_time():
    plan = project(trials=2, replicates=4, warmup=False, confirm=2, confirm_replicates=4, joint=True, slots=2,
                   baseline_s=10.0, yardstick_s=2.0, candidate_s=1.0, usd_per_s=0.01)
    search, confirm = 2 * 4 * (2.0 + 1.0), 4 * 10.0 + 2 * 4 * 1.0
    assert plan.runs == 2 * 8 + (1 + 2) * 4
    assert plan.engine_s == pytest.approx(search + confirm) and plan.usd == pytest.approx((search + confirm) * 0.01)
    assert plan.wall_s == pytest.approx(search / 2 + confirm)  # confirmation runs alone
    separate = project(trials=0, replicates=4, warmup=True, confirm=2, confirm_replicates=4, joint=False, slots=1,
                       baseline_s=10.0, yardstick_s=2.0, candidate_s=1.0, usd_per_s=1.0)
    assert separate.runs == 2 * (2 * 4 + 1) and separate.engine_s == pytest.approx(2 * (40 + 4 + 10))
    # "up to": a tie-break among all the jointly confirmed (candidate runs alone), should confirmation need one
    tie = project(trials=2, replicates=4, warmup=False, confirm=2, confirm_replicates=4, joint=True, slots=2,
                  baseline_s=10.0, yardstick_s=2.0, candidate_s=1.0, usd_per_s=0.01, tiebreak_replicates=8)
    assert tie.runs == plan.runs + 2 * 8 and tie.engine_s == pytest.approx(plan.engine_s + 2 * 8 * 1.0)
    assert tie.wall_s == pytest.approx(plan.wall_s + 16.0)


DEMO = ["backend=fake", "+experiment=demo", "slots=1", "plots=false"]


def test_the_sweep_prints_its_plan_after_the_baseline_and_again_after_the_probes_and_the_budget_stops_the_search(
        tmp_path):
    console = Console(record=True, width=300)
    assert sweep_cmd.run(compose_cfg(*DEMO, "study.name=plan", tmp_path=tmp_path), console) == 0
    shown = console.export_text()
    assert shown.count("plan: up to ") == 2
    assert shown.index("plan: ") < shown.index("probe max_num_seqs") < shown.rindex("plan: ")
    assert "projected from the baseline's run time" in shown
    records = read_records(tmp_path / "plan" / "replicates.jsonl")
    one = engine_seconds([r for r in records if r["stage"] == "search"][:8]) / 3600 * 1.39  # a whole comparison
    probes = engine_seconds([r for r in records if r["stage"] == "probe"]) / 3600 * 1.39
    budget = probes + 1.5 * one  # room for one comparison, not two
    console = Console(record=True, width=300)
    assert sweep_cmd.run(compose_cfg(*DEMO, "study.name=budget", f"study.budget_usd={budget}", "study.n_trials=6",
                                     "compare.replicates=4", "study.sequential=false", tmp_path=tmp_path),
                         console) == 0
    records = read_records(tmp_path / "budget" / "replicates.jsonl")
    spent = engine_seconds([r for r in records if r["stage"] != "confirm"]) / 3600 * 1.39
    assert spent <= budget, (spent, budget)
    assert "a comparison costs up to about" in console.export_text()


def test_the_wall_time_budget_starts_no_comparison_that_would_run_past_it(monkeypatch):
    """study.timeout_s stops the search before a comparison would end after it, not only once it is spent."""
    from types import SimpleNamespace

    from throttle_sweep.search import budget

    plan = project(trials=4, replicates=4, warmup=False, confirm=0, confirm_replicates=4, joint=False, slots=1,
                   baseline_s=10.0, yardstick_s=5.0, candidate_s=5.0, usd_per_s=0.0)  # a comparison: 40 s
    settings = SimpleNamespace(n_trials=10, timeout_s=300.0, budget_usd=None, usd_per_gpu_hour=1.39)
    view = SimpleNamespace(measured_trials=lambda: 1)
    monkeypatch.setattr(budget.time, "monotonic", lambda: 1000.0)
    runner = SimpleNamespace(settings=settings, view=view, records=[], began=1000.0 - 250.0)  # 50 s left
    assert budget.budget_left(runner, plan) is None
    runner.began = 1000.0 - 270.0  # 30 s left, less than a comparison takes
    why = budget.budget_left(runner, plan)
    assert why is not None and "wall-time budget" in why and "40 s" in why


def test_a_calibration_run_of_the_very_work_is_the_baselines_probe_and_the_plan_follows_it(tmp_path):
    """Work sized by time whose size comes out as configured (the loop's concurrency is the floor): the
    calibration run is the baseline's run of this work, so it is not run again before the plan."""
    console = Console(record=True, width=300)
    assert sweep_cmd.run(compose_cfg(*DEMO, "study.name=cal", "workload.replicate_s=0.001", tmp_path=tmp_path),
                         console) == 0
    records = read_records(tmp_path / "cal" / "replicates.jsonl")
    assert [r["stage"] for r in records[:1]] == ["calibration"]
    assert not [r for r in records if r["stage"] == "probe" and r["arm"] == "baseline"]
    shown = console.export_text()
    assert "projected from the calibration run's time" in shown
    assert shown.index("plan: ") < shown.index("probe max_num_seqs")
