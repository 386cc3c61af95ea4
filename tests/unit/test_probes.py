"""The probe stage on a GPU-sized range (max_num_seqs 1..2048): the first engine-minutes go to what decides the
plan. The boundary is predicted from the KV capacity the engine reports, probed only near the prediction with
work of a few waves, never at the slow low end, and not at all where no value in the range can preempt; the plan
is printed after the baseline's run; the budgets stop the probes with every record kept."""

from __future__ import annotations

from dataclasses import asdict

import optuna
import pytest
from optuna.distributions import IntDistribution

from tests.helpers import FakeOneSlot
from throttle_sweep.measurement.workload import WorkloadSpec
from throttle_sweep.sweep.boundary import NOISY_REPEATS, describe
from throttle_sweep.sweep.driver import Sweep
from throttle_sweep.sweep.events import Unseen
from throttle_sweep.sweep.options import SweepSettings
from throttle_sweep.sweep.probes import PROBE_WAVES
from throttle_sweep.sweep.runner import SweepStopped
from throttle_sweep.sweep.trials import engine_seconds

SPEC = WorkloadSpec(num_requests=2048, prompt_len=16, output_len=48, concurrency=2048, warmup_requests=0)
JITTER_SEED = 0  # the fake's jitter draws (seeds 0-2 show the noise at this work; 3 happens not to)
PER_REQUEST = 4  # blocks of 16 tokens that one request holds at its full length (16 + 48 tokens)


class Notes(Unseen):
    """What the sweep says, each line with how many records were written before it."""

    def __init__(self, records):
        self.records, self.lines = records, []

    def note(self, message):
        self.lines.append((len(self.records), message))


def gpu_range_sweep(blocks, *, tweak=None, **settings):
    flags = {"num_gpu_blocks_override": blocks, "block_size": 16, "max_model_len": 1024}
    records = []
    notes = Notes(records)
    sweep = Sweep(study=optuna.create_study(), distributions={"max_num_seqs": IntDistribution(1, 2048, log=True)},
                  base_flags=flags, baseline_flags={**flags, "max_num_seqs": 256},
                  workload_key={"workload": asdict(SPEC), "backend": "fake"}, pool=FakeOneSlot(SPEC, tweak=tweak),
                  write=records.append, existing=[], progress=notes,
                  settings=SweepSettings(boundary_knob="max_num_seqs", n_trials=0, confirm_top=0, **settings))
    return sweep, records, notes


def two_budget_sweep(flags):
    """A sweep of max_num_seqs 1..2048 at two token budgets, the baseline's (256 sequences) flags `flags`."""
    records = []
    sweep = Sweep(study=optuna.create_study(),
                  distributions={"max_num_seqs": IntDistribution(1, 2048, log=True),
                                 "max_num_batched_tokens": optuna.distributions.CategoricalDistribution([2048, 8192])},
                  base_flags=flags, baseline_flags={**flags, "max_num_seqs": 256},
                  workload_key={"workload": asdict(SPEC), "backend": "fake"}, pool=FakeOneSlot(SPEC),
                  write=records.append, existing=[],
                  settings=SweepSettings(boundary_knob="max_num_seqs", n_trials=0, confirm_top=0))
    return sweep, records


def probes_of(records):
    return [r for r in records if r["stage"] == "probe" and r["arm"] == "candidate"]


def test_a_large_range_is_probed_near_the_kv_prediction_with_short_work_and_never_at_the_slow_low_end():
    """Before: both ends first, max_num_seqs=1 running all 2048 requests one at a time (the GPU review's hour-long
    probe); the plan only after every probe. Now: the two values either side of the predicted boundary, each
    run twice (the determinism check), with PROBE_WAVES waves of its own batch; the plan after the baseline."""
    sweep, records, notes = gpu_range_sweep(2400)
    sweep.run()
    (found,) = sweep.view.study.user_attrs["boundaries"]
    capacity = 2400 // PER_REQUEST
    assert (found["last_clean"], found["first_preempting"], found["exact"], found["settled"]) == \
        (capacity, capacity + 1, True, True)
    assert found["predicted_last_clean"] == capacity
    probes = probes_of(records)
    assert sorted(r["flags"]["max_num_seqs"] for r in probes) == [capacity, capacity, capacity + 1, capacity + 1]
    assert all(r["requests_completed"] == PROBE_WAVES * r["flags"]["max_num_seqs"] for r in probes)
    first_plan = next(n for n, line in notes.lines if line.startswith("plan: "))
    assert first_plan == 1  # the baseline's run alone: the plan comes before any probe
    baseline = [r for r in records if r["stage"] == "probe" and r["arm"] == "baseline"]
    # every probe together costs about what the baseline's one run does (before: the max_num_seqs=1 probe
    # alone cost ten times it)
    assert engine_seconds(probes) < 3 * engine_seconds(baseline), (engine_seconds(probes), engine_seconds(baseline))


def test_a_range_whose_every_value_fits_the_kv_cache_is_not_probed():
    sweep, records, notes = gpu_range_sweep(2048 * PER_REQUEST)
    sweep.run()
    (found,) = sweep.view.study.user_attrs["boundaries"]
    assert not probes_of(records) and len(records) == 1  # the baseline's run only
    assert (found["last_clean"], found["first_preempting"], found["settled"]) == (2048, None, True)
    assert sweep.view.known_feasible({"max_num_seqs": 1}) and sweep.view.known_feasible({"max_num_seqs": 2048})
    assert "no probe" in describe(found, found["predicted_last_clean"])
    plans = [line for _, line in notes.lines if line.startswith("plan: ")]
    assert len(plans) == 1 and "again after" not in plans[0]  # no probe ran: nothing to say the plan again for


def test_the_dollar_budget_stops_the_probes_with_every_record_kept():
    sweep, records, notes = gpu_range_sweep(2400, budget_usd=1e-6)
    with pytest.raises(SweepStopped, match=r"study.budget_usd=1e-06 .* spent during the probes"):
        sweep.run()
    assert len(records) == len(sweep.runner.pool.jobs) == 1  # the baseline's run, kept; no probe started after


def test_the_wall_time_budget_stops_the_probes_with_every_record_kept():
    def late(job, record):  # the baseline's run ends past study.timeout_s
        sweep.runner.began -= 3600

    sweep, records, notes = gpu_range_sweep(2400, tweak=late, timeout_s=600)
    with pytest.raises(SweepStopped, match=r"study.timeout_s=600 .* during the probes"):
        sweep.run()
    assert len(records) == len(sweep.runner.pool.jobs) == 1


def test_preemption_counts_that_vary_by_run_make_feasibility_noisy_and_the_report_says_so():
    """The fake's `jitter` holds back admission in some steps, drawn per run, as timing does on a GPU whose engine
    core schedules asynchronously: near the boundary a value preempts in some runs and not others. The probes
    then replicate the last clean value and say that feasibility was noisy."""
    from throttle_sweep.engines import FakeKnobs

    spec = WorkloadSpec(num_requests=512, prompt_len=200, output_len=100, concurrency=512, warmup_requests=0)
    flags = {"num_gpu_blocks_override": 2400, "block_size": 16, "max_model_len": 1024, "max_num_batched_tokens": 2048}
    records = []
    sweep = Sweep(study=optuna.create_study(), distributions={"max_num_seqs": IntDistribution(1, 256, log=True)},
                  base_flags=flags, baseline_flags={**flags, "max_num_seqs": 64},
                  workload_key={"workload": asdict(spec), "backend": "fake"},
                  pool=FakeOneSlot(spec, knobs=FakeKnobs(jitter=0.2, seed=JITTER_SEED)), write=records.append,
                  existing=[], settings=SweepSettings(boundary_knob="max_num_seqs", n_trials=0, confirm_top=0))
    sweep.find_boundaries()
    (found,) = sweep.view.study.user_attrs["boundaries"]
    assert found["noisy"] and found["settled"] and found["exact"], found
    clean = found["probes"][str(found["last_clean"])]
    assert clean == [0] * NOISY_REPEATS
    assert "feasibility was noisy" in describe(found), found


def test_where_every_value_fits_but_another_knob_may_move_the_kv_capacity_one_probe_a_setting_confirms_it():
    """A token budget other than the baseline's may change what vLLM's memory profile leaves for the KV cache:
    the prediction is not taken on trust there, but confirmed with one probe at the top of the range for each
    setting (never a search of the whole range)."""
    flags = {"num_gpu_blocks_override": 2048 * PER_REQUEST, "block_size": 16, "max_model_len": 1024}
    sweep, records = two_budget_sweep(flags)
    sweep.find_boundaries()
    found = sweep.view.study.user_attrs["boundaries"]
    assert len(found) == 2 and all((b["last_clean"], b["first_preempting"], b["settled"]) == (2048, None, True)
                                   for b in found)
    assert sorted((r["flags"]["max_num_batched_tokens"], r["flags"]["max_num_seqs"]) for r in probes_of(records)) \
        == [(2048, 2048), (8192, 2048)]


def test_the_plan_after_the_probes_counts_each_run_at_the_whole_works_length():
    """A probe runs two waves of its batch, not the work a comparison runs: the plan scales each probe's measured
    time to the whole work, so that the search's runs are not projected as short as the probes."""
    from throttle_sweep.sweep.budget import projected

    sweep, records, notes = gpu_range_sweep(2400)
    sweep.find_boundaries()
    plan = projected(sweep.runner)
    probes = probes_of(records)
    clean = [r for r in probes if r["preemptions"] == 0]
    short = engine_seconds(clean) / len(clean)
    # the projected candidate run: its measured part times the requests the whole work has over the probe's
    scale = SPEC.num_requests / clean[0]["requests_completed"]
    whole = short + clean[0]["wall_s"] * (scale - 1)
    assert plan.per_trial_s == pytest.approx(SweepSettings().replicates * 2 * whole, rel=1e-6)


def test_the_gpu_time_before_the_plan_is_the_calibration_and_the_baselines_run():
    """What a twin sweep reports as spent before the plan: the plan is said once the baseline's probe is in."""
    from throttle_sweep.sweep.gpu_time import gpu_time

    def run(stage, arm, seconds, engine):
        return {"stage": stage, "arm": arm, "wall_s": seconds, "engine_lifetime": {"id": engine, "start_s": 10.0}}

    records = [run("calibration", "baseline", 40.0, "a"), run("probe", "baseline", 45.0, "b"),
               run("probe", "candidate", 5.0, "c"), run("search", "candidate", 45.0, "c")]
    spent = gpu_time(records)
    assert spent.before_plan_s == pytest.approx(40 + 10 + 45 + 10)
    assert spent.total_s == pytest.approx(40 + 45 + 5 + 45 + 3 * 10)


def test_a_kv_cache_twice_what_the_range_runs_is_not_probed_for_any_token_budget():
    """On the H100 twin (Qwen2.5-0.5B) the KV cache held 11724 requests of the default work, 2048 in flight: a
    token budget's activation memory cannot take half of it, so no setting is probed (before: a probe at the top
    for each of six budgets, 220 simulated s each)."""
    flags = {"num_gpu_blocks_override": 2 * 2048 * PER_REQUEST, "block_size": 16, "max_model_len": 1024}
    sweep, records = two_budget_sweep(flags)
    sweep.find_boundaries()
    found = sweep.view.study.user_attrs["boundaries"]
    assert len(found) == 2 and all((b["last_clean"], b["proven"], b["settled"]) == (2048, True, True) for b in found)
    assert not probes_of(records)
