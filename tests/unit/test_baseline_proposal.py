"""A proposal of the baseline's own configuration is the baseline, not a trial to measure (#45, finding 6c):
on an H100 the GPU baseline leaves the batch flags to vLLM, which serves (1024, 8192), and a sweep proposing
exactly that compared the baseline with itself. Known once the baseline ran (its record's served_defaults).
On a GPU no engine schedule is recorded (CUDA graphs), so only the resolved flags can tell; only a real GPU
resolves these values, given here."""

from __future__ import annotations

from types import SimpleNamespace

import optuna
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.trial import TrialState

from throttle_sweep.stats.schedule import BASELINE
from throttle_sweep.sweep.options import SweepSettings
from throttle_sweep.sweep.schedules import ScheduleIndex
from throttle_sweep.sweep.state import StudyView
from throttle_sweep.sweep.twins import tell_same_schedule

SERVED = {"max_num_seqs": 1024, "max_num_batched_tokens": 8192}
PROBE = {"status": "ok", "usd_per_mtok": 0.5, "preemptions": 0, "served_defaults": SERVED,
         "engine_flags": {"model": "m", **SERVED}}


def view() -> StudyView:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    dists = {"max_num_seqs": IntDistribution(64, 2048, log=True),
             "max_num_batched_tokens": CategoricalDistribution([2048, 8192])}
    made = StudyView(study=study, distributions=dists, settings=SweepSettings(), base_flags={"model": "m"},
                     baseline_flags={"model": "m"}, schedules=ScheduleIndex())
    made.findings.baseline_probe = dict(PROBE)
    return made


def test_the_baselines_served_defaults_proposed_are_told_the_baselines_answer_unmeasured(monkeypatch):
    v = view()
    monkeypatch.setattr("throttle_sweep.sweep.twins.p95", lambda record, metric: 0.1)
    v.study.enqueue_trial(SERVED)
    trial = v.study.ask(v.distributions)
    assert v.schedule_twin(trial.params) == BASELINE
    said: list[str] = []
    tell_same_schedule(SimpleNamespace(say=said.append), v, trial, BASELINE)
    (told,) = v.trials(TrialState.COMPLETE)
    assert told.values[0] == 1.0 and told.user_attrs["source"] == "baseline"
    assert "the baseline's own configuration" in told.user_attrs["notes"][0] and "not measured" in said[0]
    assert v.ranked(2) == []  # nothing to confirm: it is the baseline


def test_other_flags_are_not_the_baseline():
    v = view()
    assert v.schedule_twin({"max_num_seqs": 1024, "max_num_batched_tokens": 2048}) is None
    v.findings.baseline_probe = None  # before the baseline ran, its defaults are not known
    assert v.schedule_twin(SERVED) is None


def test_the_report_says_it_is_the_baseline_not_measured():
    from throttle_sweep.sweep.report import row_cells

    row = {"usd_per_mtok": 0.5, "ratio": 1.0, "ci": None, "status": "ok", "feasible": True, "reason": None,
           "source": "baseline", "same_schedule_as": "the baseline", "stopped": None}
    _, ratio, status = row_cells(row, "baseline")
    assert ratio == "1.000 (as baseline)" and "baseline's own configuration" in status and "not measured" in status


def test_a_proposal_that_leaves_a_flag_to_vllm_is_the_baseline_when_vllm_resolves_it_the_same():
    """A one-knob space on an H100: max_num_seqs=1024 with the token budget left to vLLM is (1024, 8192)."""
    v = view()
    v.distributions = {"max_num_seqs": IntDistribution(64, 2048, log=True)}
    assert v.is_baseline({"max_num_seqs": 1024})
    assert not v.is_baseline({"max_num_seqs": 512})
