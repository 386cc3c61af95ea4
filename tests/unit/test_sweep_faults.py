"""Faults in the sweep driver, injected through a scripted pool on the fake engine: what is lost (nothing),
what is repeated (nothing), and who is blamed (only a candidate whose own flags failed)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import optuna
import pytest
from optuna.distributions import IntDistribution
from optuna.trial import TrialState

from tests.helpers import PoolBasics
from throttle_sweep.engines import FakeEngine, FakeKnobs
from throttle_sweep.measurement.cost import Price
from throttle_sweep.measurement.replicate import measure_replicate, record_header
from throttle_sweep.measurement.workload import WorkloadSpec
from throttle_sweep.stats.comparison import MAX_ATTEMPTS, settle
from throttle_sweep.sweep.driver import Sweep
from throttle_sweep.sweep.options import SweepSettings
from throttle_sweep.sweep.runner import BaselineFails

SPEC = WorkloadSpec(num_requests=8, prompt_len=16, output_len=16, concurrency=8, warmup_requests=0)
BASE = {"max_model_len": 1024}
BASELINE = {**BASE, "max_num_seqs": 1}


class ScriptedPool(PoolBasics):
    """`slots` slots measuring on the noiseless fake; `script(job, n)` may return a record to use instead of a
    measurement (a fault), or raise (the driver is interrupted there). n counts jobs from 1."""

    def __init__(self, script: Callable[[Any, int], dict | None] = lambda job, n: None, slots: int = 1) -> None:
        self.engine, self.script, self.n = FakeEngine(FakeKnobs()), script, 0
        self.slots, self.size, self.queue, self.jobs = list(range(slots)), slots, [], []

    def submit(self, job):
        self.queue.append(job)

    def wait(self):
        job = self.queue.pop(0)
        self.n += 1
        self.jobs.append(job)
        context = {**job.context, "slot": f"s{job.slot}"}
        scripted = self.script(job, self.n)
        if scripted is not None:
            return [(job, {**record_header(self.engine, job.flags, SPEC, Price(), run_id="t", arm=job.arm,
                                           position=job.position, context=context), **scripted})]
        return [(job, measure_replicate(self.engine, job.flags, SPEC, Price(), run_id="t", arm=job.arm,
                                        position=job.position, environment={}, context=context))]

    def close(self):
        pass


def lost(reason="node 10.0.0.2 died under slot 0"):
    return {"status": "failed", "reason": reason, "infrastructure": True}


def failed(reason):
    return {"status": "failed", "reason": reason, "failed_at": "start"}


def make_sweep(study, pool, records, *, n_trials=3, grid=None, high=8):
    written = list(records)
    sweep = Sweep(study=study, distributions={"max_num_seqs": IntDistribution(2, high)}, base_flags=BASE,
                  baseline_flags=BASELINE, workload_key={}, pool=pool, write=written.append, existing=records,
                  settings=SweepSettings(n_trials=n_trials, replicates=2, confirm_top=1, confirm_replicates=2),
                  grid=grid)
    return sweep, written


def enqueued(*values):
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for n in values:
        study.enqueue_trial({"max_num_seqs": n})
    return study


def interrupt_at(k):
    def script(job, n):
        if n == k:
            raise KeyboardInterrupt
        return None
    return script


def rec(arm, position, status="ok", **extra):
    return {"arm": arm, "position": position, "status": status, **extra}


@pytest.mark.parametrize("records, expected", [
    ({}, "fresh"),
    ({0: rec("baseline", 0), 1: rec("candidate", 1), 2: rec("candidate", 2), 3: rec("baseline", 3)}, "complete"),
    ({0: rec("baseline", 0), 1: rec("candidate", 1)}, "redo"),  # left partial by an earlier driver
    ({0: rec("baseline", 0), 1: rec("candidate", 1, "failed")}, "complete"),  # the candidate's own failure
    ({0: rec("baseline", 0, "failed")}, "redo"),  # the baseline's failure is not the candidate's
    ({0: rec("baseline", 0), 1: rec("candidate", 1, "failed", infrastructure=True)}, "redo"),  # the slot was lost
])
def test_what_the_records_of_a_comparison_say(records, expected):
    assert settle(records, 4) == expected


def test_a_driver_killed_after_a_lost_node_resumes_without_blaming_the_candidate():
    """The node dies under trial 0's first replicate; the driver is killed before it can start that work
    again. The next driver reads the infrastructure record and measures the trial afresh under a new key."""
    study = enqueued(4, 6, 3)
    pool = ScriptedPool(lambda job, n: lost() if n == 1 else (_ for _ in ()).throw(KeyboardInterrupt) if n == 2
                        else None)
    first, written = make_sweep(study, pool, [])
    with pytest.raises(KeyboardInterrupt):
        first.run()
    assert [r.get("infrastructure") for r in written] == [True]
    second, written = make_sweep(study, ScriptedPool(), written)
    result = second.run()
    trial0 = result.study.trials[0]
    assert trial0.state == TrialState.COMPLETE and trial0.user_attrs.get("blame") is None
    assert trial0.user_attrs["discarded_comparisons"] == [written[0]["comparison"]]
    assert {r["key"] for r in written if r["comparison"] == trial0.user_attrs["comparison"]} == {"trial-0~1"}
    assert not [t for t in result.study.trials if t.state == TrialState.FAIL]


def test_a_transient_baseline_failure_is_retried_and_does_not_fail_the_candidate():
    study = enqueued(4, 6, 3)
    pool = ScriptedPool(lambda job, n: failed("CUDA error: an illegal memory access") if n == 1 else None)
    sweep, written = make_sweep(study, pool, [])
    result = sweep.run()
    assert written[0]["arm"] == "baseline" and written[0]["status"] == "failed"  # kept, not dropped
    assert all(t.state == TrialState.COMPLETE for t in result.study.trials)
    assert result.study.trials[0].user_attrs["discarded_comparisons"] == [written[0]["comparison"]]


def test_a_baseline_that_keeps_failing_stops_the_sweep_without_blaming_the_candidate():
    study = enqueued(4, 5)
    pool = ScriptedPool(lambda job, n: failed("baseline refused") if job.arm == "baseline" else None)
    sweep, written = make_sweep(study, pool, [], n_trials=2)
    with pytest.raises(BaselineFails, match="failed again .3 attempts at this comparison.*the last: baseline refused"):
        sweep.search()
    first = study.trials[0]
    assert first.state == TrialState.FAIL and first.user_attrs["blame"] == "baseline"
    assert not first.user_attrs["attempts_exhausted"]  # the flags are measured again once the baseline is fixed
    assert f"{MAX_ATTEMPTS} attempts" in first.user_attrs["reason"]
    asked = [t for t in study.trials if t.state != TrialState.WAITING]
    assert len(written) == MAX_ATTEMPTS and len(asked) == 1  # nothing more was spent on a broken baseline


def test_the_attempts_are_capped_across_resumes_too():
    """The driver is killed right after each lost replicate is written, before it can act on it: a resume
    must still give up after MAX_ATTEMPTS, not grant a fourth attempt."""
    study = enqueued(4)
    records: list[dict] = []

    def write_then_die(record):
        records.append(record)
        raise KeyboardInterrupt  # stands for a SIGKILL right after the record was made durable

    for _ in range(MAX_ATTEMPTS):
        sweep = Sweep(study=study, distributions={"max_num_seqs": IntDistribution(2, 8)}, base_flags=BASE,
                      baseline_flags=BASELINE, workload_key={}, pool=ScriptedPool(lambda job, n: lost()),
                      write=write_then_die, existing=list(records),
                      settings=SweepSettings(n_trials=1, replicates=2, confirm_top=0))
        with pytest.raises(KeyboardInterrupt):
            sweep.search()
    final, records = make_sweep(study, ScriptedPool(lambda job, n: pytest.fail("a fourth attempt")), records,
                                n_trials=1)
    final.search()
    trial = study.trials[0]
    assert trial.state == TrialState.FAIL and trial.user_attrs["attempts_exhausted"]
    assert f"{MAX_ATTEMPTS} attempts" in trial.user_attrs["reason"]
    assert len(records) == MAX_ATTEMPTS and all(r.get("infrastructure") for r in records)


def test_a_candidate_that_fails_is_blamed_and_its_flags_are_not_measured_again():
    study = enqueued(4, 4, 5)
    pool = ScriptedPool(lambda job, n: failed("engine refused max_num_seqs=4")
                        if job.arm == "candidate" and job.flags["max_num_seqs"] == 4 else None)
    sweep, written = make_sweep(study, pool, [], n_trials=2)
    sweep.search()
    t0, t1, t2 = study.trials[:3]
    assert t0.state == TrialState.FAIL and t0.user_attrs["blame"] == "candidate"
    assert t1.user_attrs["duplicate_of"] == 0 and t2.state == TrialState.COMPLETE
    assert sum(1 for j in pool.jobs if j.flags.get("max_num_seqs") == 4) == 1  # the repeat measured nothing


def test_an_interrupted_grid_trial_is_taken_over_first_and_no_waiting_trials_are_left():
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    grid = [{"max_num_seqs": n} for n in (5, 2, 7, 3, 8, 4, 6)]
    first, written = make_sweep(study, ScriptedPool(interrupt_at(7)), [], n_trials=3, grid=grid)
    with pytest.raises(KeyboardInterrupt):
        first.run()  # interrupted in trial 1 (max_num_seqs=2), after two of its runs
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.RUNNING]
    second, written = make_sweep(study, ScriptedPool(), written, n_trials=3, grid=grid)
    second.search()
    states = Counter(t.state for t in study.trials)
    assert states == {TrialState.COMPLETE: 3}, states
    assert [t.params["max_num_seqs"] for t in study.trials] == [5, 2, 7]  # the grid's order, the interrupted first
    assert sum(1 for r in written if r["stage"] == "search") == 2 + 3 * 4  # the partial one kept, 3 whole trials


def test_flags_in_flight_on_another_slot_are_not_measured_twice_at_once():
    study = enqueued(4, 4, 6)
    sweep, written = make_sweep(study, ScriptedPool(slots=2), [], n_trials=2)
    sweep.search()
    measured = Counter(r["flags"]["max_num_seqs"] for r in written if r["arm"] == "candidate")
    assert measured == {4: 2, 6: 2}
    assert study.trials[1].user_attrs["duplicate_of"] == 0


def test_a_resumed_study_does_not_propose_the_points_of_its_first_run_again(tmp_path):
    from rich.console import Console

    from tests.helpers import compose_cfg
    from throttle_sweep.commands import sweep as sweep_cmd

    # 64 in flight: the space keeps all of max_num_seqs 1..64 (8 would leave 8 values, where random draws collide)
    args = ["backend=fake", "workload.num_requests=64", "workload.concurrency=64", "workload.prompt_len=16",
            "workload.output_len=16", "workload.warmup_requests=0", "+space=batching", "~space.max_num_batched_tokens",
            "space.max_num_seqs.log=false", "study.sampler=random", "study.name=r", "compare.replicates=2", "study.confirm_top=0", "plots=false"]
    assert sweep_cmd.run(compose_cfg(*args, "study.n_trials=3", tmp_path=tmp_path), Console(quiet=True)) == 0
    assert sweep_cmd.run(compose_cfg(*args, "study.n_trials=6", tmp_path=tmp_path), Console(quiet=True)) == 0
    study = optuna.load_study(study_name="r", storage=f"sqlite:///{tmp_path / 'r' / 'study.db'}")
    assert not [t for t in study.trials if "duplicate_of" in t.user_attrs]
    assert len({t.params["max_num_seqs"] for t in study.trials}) == 6
