"""The plan a sweep prints after the baseline's run and again after its probes, and the dollar budget that stops the search before it is spent."""

from __future__ import annotations

import pytest
from rich.console import Console

from tests.helpers import compose_cfg
from throttle_sweep.commands import sweep as sweep_cmd
from throttle_sweep.store.records import read_records
from throttle_sweep.sweep.plan import project
from throttle_sweep.sweep.trials import engine_seconds


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

    from throttle_sweep.sweep import budget

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


def test_the_budgets_keep_what_the_confirmation_needs():
    """A comparison is started only if the confirmation of the best so far still fits after it, in dollars and
    in wall time: a search that spends the whole budget leaves no answer to quote."""
    from types import SimpleNamespace

    from throttle_sweep.sweep import budget

    plan = project(trials=4, replicates=4, warmup=False, confirm=2, confirm_replicates=4, joint=True, slots=1,
                   baseline_s=10.0, yardstick_s=5.0, candidate_s=5.0, usd_per_s=0.01)
    assert plan.per_trial_s == 40.0 and plan.confirm_s == 4 * 10.0 + 2 * 4 * 5.0  # 80 s, alone
    assert plan.confirm_usd == pytest.approx(0.80)
    view = SimpleNamespace(measured_trials=lambda: 1)
    dollars = SimpleNamespace(n_trials=10, timeout_s=None, budget_usd=1.3, usd_per_gpu_hour=36.0)  # $0.01/s
    runner = SimpleNamespace(settings=dollars, view=view, records=[], began=0.0)
    assert budget.budget_left(runner, plan) is None  # 0.40 + 0.80 of 1.30
    dollars.budget_usd = 1.1  # a comparison fits, but not with the confirmation after it
    why = budget.budget_left(runner, plan)
    assert why is not None and "dollar budget" in why and "confirmation up to about $0.8000" in why
    clock = SimpleNamespace(n_trials=10, timeout_s=100.0, budget_usd=None, usd_per_gpu_hour=1.39)
    runner = SimpleNamespace(settings=clock, view=view, records=[], began=budget.time.monotonic())
    why = budget.budget_left(runner, plan)  # 40 s + 80 s > 100 s
    assert why is not None and "wall-time budget" in why and "confirmation up to about 80 s" in why


def test_a_dollar_budget_binds_the_confirmation_too(tmp_path):
    """What the whole sweep spent, confirmation included, stays within study.budget_usd, and it still ends with
    an answer (the search stopped early enough to confirm its best)."""
    console = Console(record=True, width=300)
    settings = ["study.n_trials=6", "compare.replicates=4", "study.sequential=false"]
    assert sweep_cmd.run(compose_cfg(*DEMO, *settings, "study.name=free", tmp_path=tmp_path), console) == 0
    records = read_records(tmp_path / "free" / "replicates.jsonl")
    usd = {stage: engine_seconds([r for r in records if r["stage"] == stage]) / 3600 * 1.39
           for stage in ("probe", "search", "confirm")}
    one = usd["search"] / len({r["trial"] for r in records if r["stage"] == "search"})
    budget = usd["probe"] + 1.5 * one + usd["confirm"]  # without the confirmation's share kept: three comparisons
    console = Console(record=True, width=300)
    code = sweep_cmd.run(compose_cfg(*DEMO, *settings, "study.name=capped", f"study.budget_usd={budget}",
                                     tmp_path=tmp_path), console)
    said = console.export_text()
    records = read_records(tmp_path / "capped" / "replicates.jsonl")
    assert code == 0 and [r for r in records if r["stage"] == "confirm"], said
    assert engine_seconds(records) / 3600 * 1.39 <= budget, said
    assert "and the confirmation up to about" in said


def test_a_confirmation_started_with_its_budget_spent_runs_nothing_and_says_who_is_left_unconfirmed():
    """On a resume whose budget is already spent (the search keeps the confirmation's share only within one
    run), the confirmation starts no comparison that needs a run; the sweep says which trials stay unconfirmed."""
    from types import SimpleNamespace

    from throttle_sweep.sweep.confirm import Confirm

    said: list[str] = []
    settings = SimpleNamespace(timeout_s=None, budget_usd=0.01, usd_per_gpu_hour=36.0, shared_baseline=False,
                               confirm_replicates=4)
    runner = SimpleNamespace(settings=settings, records=[{"wall_s": 2.0}], began=0.0, say=said.append,
                             pool=SimpleNamespace(slots=[0], shares_machine=True),  # $0.02 spent of $0.01
                             comparison=lambda *args, **kwargs: SimpleNamespace(done=lambda: False))
    view = SimpleNamespace(settings=settings)
    trials = [SimpleNamespace(number=n, params={}, user_attrs={}) for n in (3, 5)]
    stage = Confirm(runner, view, trials, family=2, ranked=True)
    assert stage.next(0) is None and stage.next(0) is None
    assert stage.stopped_by is not None and "study.budget_usd" in stage.stopped_by
    assert said == ["confirm: stopped, dollar budget spent ($0.0200 of $0.01 at the assumed price) "
                    "(study.budget_usd=0.01); not confirmed: trial 3, trial 5"]


def test_a_resume_with_its_budget_spent_still_reads_the_confirmation_and_tie_break_it_recorded(tmp_path):
    """What a finished sweep measured is its answer on a resume whose budget is spent: the recorded
    confirmation and tie-break are read, nothing new runs, the same winner is exported."""
    args = ["backend=fake", "+space=batching", "space.max_num_seqs.low=6", "space.max_num_seqs.high=8",
            "space.max_num_batched_tokens.choices=[1024,2048,4096]", "workload.concurrency=8",
            "study.same_schedule=false", "study.n_trials=9", "study.sampler=grid", "compare.replicates=2",
            "study.confirm_replicates=4", "study.confirm_top=3", "study.tiebreak_replicates=4",
            "study.boundary=none", "study.sequential=false", "study.name=t", "plots=false",
            "workload.num_requests=16", "workload.output_len=16", "workload.prompt_len=16", "fake.noise_sd=0.02"]
    assert sweep_cmd.run(compose_cfg(*args, tmp_path=tmp_path), Console(quiet=True)) == 0
    records = read_records(tmp_path / "t" / "replicates.jsonl")
    assert [r for r in records if r["stage"] == "tiebreak"]  # the first run broke a tie
    best = (tmp_path / "t" / "best" / "best.json").read_text()
    console = Console(record=True, width=250)
    assert sweep_cmd.run(compose_cfg(*args, "study.budget_usd=0.000001", tmp_path=tmp_path), console) == 0
    said = console.export_text()
    assert len(read_records(tmp_path / "t" / "replicates.jsonl")) == len(records), said
    assert "not confirmed" not in said and "tie-break: not run" not in said, said
    assert (tmp_path / "t" / "best" / "best.json").read_text() == best


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
