"""Confirmations that share the baseline's runs: one joint schedule (B C1 C2 C2 C1 B, C1 C2 B B C2 C1) where
they would run one after another anyway. The baseline is the slowest configuration of a sweep, so this is
where a sweep's engine time goes; each pair of arms must stay balanced, each candidate's interval calibrated,
and the records must still say everything needed to recompute each answer offline."""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter

import numpy as np
import optuna
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from optuna.distributions import IntDistribution
from rich.console import Console

from tests.helpers import FakeOneSlot, compose_cfg
from throttle_sweep.commands import analyze as analyze_cmd
from throttle_sweep.commands import sweep as sweep_cmd
from throttle_sweep.engines import FakeKnobs
from throttle_sweep.errors import ConfigError
from throttle_sweep.measurement.workload import WorkloadSpec
from throttle_sweep.stats.analysis import Analysis, analyse, analyse_joint, candidate_view, split_joint
from throttle_sweep.stats.fit import fit_joint
from throttle_sweep.stats.schedule import BASELINE, CANDIDATE, joint_schedule, make_schedule
from throttle_sweep.stats.verdict import (
    CHEAPER,
    PRICIER,
    Observation,
    Thresholds,
    clearly_lower,
    estimate,
    lack_of_fit,
)
from throttle_sweep.store.records import read_records
from throttle_sweep.sweep.driver import Sweep
from throttle_sweep.sweep.options import SweepSettings
from throttle_sweep.sweep.winner import Confirmation, cheaper_than

SPEC = WorkloadSpec(num_requests=8, prompt_len=16, output_len=16, concurrency=8, warmup_requests=0)


@given(st.integers(1, 4), st.sampled_from([2, 4, 6, 8]), st.integers(0, 7))
@settings(max_examples=80, deadline=None)
def test_a_joint_schedule_balances_every_pair_of_arms(candidates, replicates, lead):
    """Every arm runs `replicates` times; for every pair of arms the mean run positions are equal (linear drift
    cancels) and each arm has as many odd as even positions (an alternating rhythm cancels)."""
    order = joint_schedule(candidates, replicates, lead=lead)
    arms = sorted(set(order))
    assert len(arms) == candidates + 1 and BASELINE in arms and CANDIDATE in arms
    assert Counter(order) == {arm: replicates for arm in arms}
    where = {arm: [i for i, a in enumerate(order) if a == arm] for arm in arms}
    for a, b in itertools.combinations(arms, 2):
        assert sum(where[a]) == sum(where[b])
    assert all(sum(p % 2 for p in positions) == replicates // 2 for positions in where.values())


def test_a_joint_schedule_reads_as_the_mirrored_blocks_and_refuses_odd_counts():
    assert joint_schedule(2, 4) == ["baseline", "candidate", "candidate-2", "candidate-2", "candidate", "baseline",
                                    "candidate-2", "candidate", "baseline", "baseline", "candidate", "candidate-2"]
    assert joint_schedule(1, 4) == make_schedule("abba", 4)  # one candidate: the two-arm default
    with pytest.raises(ConfigError, match="study.confirm_replicates must be even and at least 2, but got 3"):
        joint_schedule(2, 3)


def simulate_joint(order, ratios, *, rng, noise_sd, kind="none", trial_noise=None):
    """Records of a joint schedule, a warm-up run first (dropped, as the tool drops it), under +27% linear
    drift and one of the review's perturbations; candidate arm labels map to trials 0, 1, ... `trial_noise`:
    {trial: sd} for arms noisier (or quieter) than `noise_sd`."""
    runs = [order[0], *order]
    n = len(runs)
    out = []
    for i, arm in enumerate(runs):
        factor = 1 + 0.27 * i / (n - 1)
        factor *= {"none": 1.0, "first measured run 10% slow": 1.10 if i == 1 else 1.0,
                   "curvature 3%": 1 + 0.03 * (2 * i / (n - 1) - 1) ** 2,
                   "alternation 1.1%": 1.011 if i % 2 == 0 else 0.989}[kind]
        trial = None if arm == BASELINE else (0 if arm == CANDIDATE else int(arm.rsplit("-", 1)[1]) - 1)
        ratio = 1.0 if trial is None else ratios[trial]
        out.append({"arm": BASELINE if trial is None else CANDIDATE, "trial": trial, "position": i,
                    "usd_per_mtok": factor * ratio * math.exp(rng.normal(0, (trial_noise or {}).get(trial, noise_sd))),
                    "status": "ok"})
    return out[1:]


PLAIN = Thresholds()
EDGE = Thresholds(equivalence_margin=0.0)  # A/A with no margin: the interval's one-sided miss (see test_stats)


def view_estimate(records, trial, thresholds=PLAIN):
    return estimate([Observation(r["arm"], r["position"], r["usd_per_mtok"]) for r in candidate_view(records, trial)],
                    thresholds)


N_SIM = 2000
MC_SLACK = 3 * math.sqrt(0.025 * 0.975 / N_SIM)


@pytest.mark.calibration
@pytest.mark.parametrize("kind", ["none", "first measured run 10% slow", "curvature 3%", "alternation 1.1%"])
def test_each_candidates_view_of_a_joint_schedule_is_calibrated(kind):
    """A/A for two candidates sharing the baseline's runs (4 each, a warm-up run, the turn rotating over the
    three leads): in every cell (lead x candidate) the 95% interval covers the truth in >= 95% of runs and
    neither false verdict exceeds alpha/2, each less or plus 3 Monte-Carlo standard errors of the cell. A slow
    first measured run favours whichever arm does not lead, here as in the two-arm default (simulated per
    lead: abba 3.5% and 4.1%, joint at most 4.5%): rotating the lead across comparisons is what cancels it,
    so that case is judged per candidate over the leads."""
    rng = np.random.default_rng(11)
    cells = {(lead, trial): [0, 0, 0] for lead in range(3) for trial in (0, 1)}  # covered, cheaper, pricier
    for i in range(N_SIM):
        lead = i % 3
        records = simulate_joint(joint_schedule(2, 4, lead=lead), [1.0, 1.0], rng=rng,
                                 noise_sd=rng.uniform(0.01, 0.03), kind=kind)
        for trial in (0, 1):
            est = view_estimate(records, trial, EDGE)
            cell = cells[lead, trial]
            cell[0] += est.ci_low <= 1.0 <= est.ci_high
            cell[1] += est.verdict == CHEAPER
            cell[2] += est.verdict == PRICIER
    n = N_SIM / 3
    if kind == "first measured run 10% slow":  # pooled over the leads (see above)
        cells = {(None, trial): [sum(cells[lead, trial][j] for lead in range(3)) for j in range(3)] for trial in (0, 1)}
        n = N_SIM
    rates = {k: [v / n for v in c] for k, c in cells.items()}
    print(f"\nA/A joint (2 candidates) x4 + warm-up, {kind}: worst cell coverage "
          f"{min(r[0] for r in rates.values()):.3f}, false CHEAPER {max(r[1] for r in rates.values()):.4f}, "
          f"false PRICIER {max(r[2] for r in rates.values()):.4f}")
    for (lead, trial), (coverage, cheaper, pricier) in rates.items():
        assert coverage >= 0.95 - 3 * math.sqrt(0.05 * 0.95 / n), (lead, trial)
        assert cheaper <= 0.025 + 3 * math.sqrt(0.025 * 0.975 / n) and pricier <= 0.025 + 3 * math.sqrt(
            0.025 * 0.975 / n), (lead, trial)


def confirmed(records, trial, adjusted):
    view = candidate_view(records, trial)
    obs = [Observation(r["arm"], r["position"], r["usd_per_mtok"]) for r in view]
    plain, quoted = estimate(obs), estimate(obs, adjusted)
    return Confirmation(trial, {"trial": trial}, Analysis(plain.verdict, plain, view, {}),
                        adjusted=Analysis(quoted.verdict, quoted, view, {}), family=2, shared=[0, 1])


@pytest.mark.calibration
def test_joint_confirmation_keeps_the_power_and_contrasts_its_candidates_directly():
    """Bonferroni for 2, one fit over the joint schedule: a true 7% saving at 1% noise (5% beyond the 2%
    margin that CHEAPER must clear) is CHEAPER in >= 95% of runs (a 5% saving: 0.78). The winner rule contrasts
    two candidates confirmed together directly (their runs share the baseline's, whose noise a contrast of
    the two ratios would count twice): equal candidates are told apart either way in <= alpha/2 of runs
    each (plus 3 MC standard errors), and a true 4% gap at 2% noise is told apart clearly more often than
    by the contrast of ratios (measured: 0.79 against 0.67, each arm's noise its own; one variance over
    all three arms gave 0.88, but lent a noisy arm the quiet arms' precision)."""
    rng = np.random.default_rng(12)
    adjusted = Thresholds(alpha=0.05 / 2)
    found = first = second = direct = of_ratios = 0
    for i in range(N_SIM):
        saving = simulate_joint(joint_schedule(2, 4, lead=i), [0.93, 1.0], rng=rng, noise_sd=0.01)
        found += analyse_joint(saving, adjusted)[0].verdict == CHEAPER  # one fit over the 12 runs
        equal = simulate_joint(joint_schedule(2, 4, lead=i), [0.8, 0.8], rng=rng, noise_sd=rng.uniform(0.01, 0.03))
        a, b = confirmed(equal, 0, adjusted), confirmed(equal, 1, adjusted)
        first += cheaper_than(a, b, 0.05)
        second += cheaper_than(b, a, 0.05)
        gap = simulate_joint(joint_schedule(2, 4, lead=i), [0.76, 0.8], rng=rng, noise_sd=0.02)
        a, b = confirmed(gap, 0, adjusted), confirmed(gap, 1, adjusted)
        direct += cheaper_than(a, b, 0.05)
        of_ratios += clearly_lower(a.analysis.estimate, b.analysis.estimate, 0.05)
    print(f"\njoint x4, Bonferroni for 2: power {found / N_SIM:.4f}; equal candidates told apart "
          f"{first / N_SIM:.4f} / {second / N_SIM:.4f}; a 4% gap at 2% noise told apart directly "
          f"{direct / N_SIM:.3f}, by the contrast of ratios {of_ratios / N_SIM:.3f}")
    assert found / N_SIM >= 0.95
    assert first / N_SIM <= 0.025 + MC_SLACK and second / N_SIM <= 0.025 + MC_SLACK
    assert direct / N_SIM >= of_ratios / N_SIM + 0.08


def OneSlot(fail=None, stop_after=None, fail_arm=CANDIDATE):  # noqa: N802 - reads as the pool it builds
    """One slot on the fake engine (1% noise), confirming one at a time; `fail` makes the confirmation runs of
    `fail_arm` with that max_num_seqs fail at start."""
    def failing(job, record):
        if job.context["stage"] == "confirm" and job.arm == fail_arm and job.flags["max_num_seqs"] == fail:
            record.update(status="failed", reason="it would not start", failed_at="start")

    return FakeOneSlot(SPEC, knobs=FakeKnobs(noise_sd=0.01), tweak=failing, stop_after=stop_after)


def new_study():
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for n in (8, 4):
        study.enqueue_trial({"max_num_seqs": n})
    return study


def confirming(pool, *, records=None, study=None, shared=True):
    """A two-trial sweep (max_num_seqs 8 and 4 against 1, no probes) confirming both; `records` (appended to)
    and `study` carry over from an earlier run."""
    study = new_study() if study is None else study
    records = [] if records is None else records
    sweep = Sweep(study=study, distributions={"max_num_seqs": IntDistribution(1, 8)}, base_flags={"max_model_len": 1024},
                  baseline_flags={"max_model_len": 1024, "max_num_seqs": 1}, workload_key={}, pool=pool,
                  write=records.append, existing=list(records),
                  settings=SweepSettings(n_trials=2, replicates=2, confirm_top=2, confirm_replicates=4,
                                         shared_baseline=shared, sequential=False))
    return sweep.run(), records, study


@pytest.mark.parametrize("shared, baseline_runs", [(True, 4), (False, 8)])
def test_two_confirmations_on_one_slot_share_four_baseline_runs(shared, baseline_runs):
    result, records, _ = confirming(OneSlot(), shared=shared)
    confirm = [r for r in records if r["stage"] == "confirm"]
    by_arm = Counter((r["arm"], r["flags"]["max_num_seqs"]) for r in confirm)
    assert by_arm == {(BASELINE, 1): baseline_runs, (CANDIDATE, 8): 4, (CANDIDATE, 4): 4}
    assert len(result.confirmations) == 2 and all(c.analysis.estimate is not None for c in result.confirmations)
    assert result.winner is not None and result.winner.params == {"max_num_seqs": 8}  # the fake: 8 is cheaper
    if shared:
        assert {r["comparison"] for r in confirm} == {confirm[0]["comparison"]}
        trials = sorted(c.source_trial for c in result.confirmations)
        assert all(r["confirmed_together"] == trials for r in confirm)
        assert all(c.shared == trials for c in result.confirmations)
        # each answer is the plain two-arm analysis of its view of the records, as `mode=analyze` recomputes it
        for c in result.confirmations:
            again = analyse(candidate_view(confirm, c.source_trial), Thresholds())
            assert again.estimate.ratio == pytest.approx(c.analysis.estimate.ratio, rel=1e-12)
            assert {r["trial"] for r in again.records if r["arm"] == CANDIDATE} == {c.source_trial}


def test_a_candidate_that_fails_in_a_joint_confirmation_is_out_and_the_other_is_confirmed_again_alone():
    result, records, _ = confirming(OneSlot(fail=8))
    by_n = {c.params["max_num_seqs"]: c for c in result.confirmations}
    assert by_n[8].broken and by_n[8].broken[0].startswith("failed in confirmation (candidate: it would not start")
    assert by_n[4].broken == [] and by_n[4].analysis.estimate is not None
    four = [r for r in records if r["stage"] == "confirm" and r["comparison"] == by_n[4].analysis.records[0]["comparison"]]
    assert Counter(r["arm"] for r in four) == {BASELINE: 4, CANDIDATE: 4} and "confirmed_together" not in four[0]
    assert result.winner is not None and result.winner.params == {"max_num_seqs": 4}


def test_a_baseline_that_keeps_failing_in_a_joint_confirmation_leaves_every_candidate_unconfirmed():
    """The baseline's fault is nobody's flags: the joint comparison starts again (3 attempts), then every
    candidate in it is reported as failed in confirmation, and the sweep ends without a winner, no crash."""
    result, records, _ = confirming(OneSlot(fail=1, fail_arm=BASELINE))
    assert len(result.confirmations) == 2 and result.winner is None
    assert all(c.broken and c.broken[0].startswith("failed in confirmation (baseline: it would not start")
               for c in result.confirmations)
    joint = {r["comparison"] for r in records if r["stage"] == "confirm"}
    assert len(joint) == 3  # the first attempt and two more, each stopped at its first baseline run


def test_a_joint_confirmation_cut_short_starts_afresh_on_resume_keeping_what_was_measured():
    """Stopped after 7 of the joint schedule's 12 runs, the next run keeps those records, measures the joint
    comparison again from scratch under a fresh id, and measures no (comparison, position) twice."""
    study, records = new_study(), []
    with pytest.raises(KeyboardInterrupt):
        confirming(OneSlot(stop_after=4 + 4 + 7), records=records, study=study)  # two 2+2 searches, 7 confirm runs
    before = list(records)
    assert sum(r["stage"] == "confirm" for r in before) == 7
    result, after, _ = confirming(OneSlot(), records=records, study=study)
    assert after[: len(before)] == before
    assert max(Counter((r["comparison"], r["position"]) for r in after).values()) == 1
    confirm = [r for r in after if r["stage"] == "confirm"]
    first, again = dict.fromkeys(r["comparison"] for r in confirm)
    assert sum(r["comparison"] == again for r in confirm) == 12
    assert {c.analysis.records[0]["comparison"] for c in result.confirmations} == {again}
    assert len(result.confirmations) == 2 and result.winner is not None


def test_the_sweep_command_shares_the_baseline_and_analyze_recomputes_each_candidate(tmp_path):
    args = ["backend=fake", "+space=batching", "space.max_num_seqs.low=2", "space.max_num_seqs.high=8",
            "study.n_trials=3", "compare.replicates=2", "study.confirm_replicates=4", "study.confirm_top=2",
            "study.boundary=none", "study.sequential=false", "study.name=j", "plots=false", "workload.num_requests=8", "workload.output_len=16",
            "workload.prompt_len=16"]
    assert sweep_cmd.run(compose_cfg(*args, tmp_path=tmp_path), Console(quiet=True)) == 0
    records = read_records(tmp_path / "j" / "replicates.jsonl")
    confirm = [r for r in records if r["stage"] == "confirm" and not r.get("warmup")]
    assert Counter(r["arm"] for r in confirm) == {BASELINE: 4, CANDIDATE: 8}
    views = split_joint(confirm)
    assert [len(view) for _, view in views] == [8, 8]
    console = Console(record=True, width=200)
    assert analyze_cmd.run(compose_cfg("mode=analyze", f"input={tmp_path / 'j' / 'replicates.jsonl'}", "plots=false",
                                       tmp_path=tmp_path), console) == 0
    printed = console.export_text()
    for trial, view in views:
        assert f"{view[0]['comparison']}-trial-{trial}" in printed
        ratio = analyse(view, Thresholds()).estimate.ratio
        assert f"ratio candidate/baseline {ratio:.3f}" in printed
    assert printed.count("Welch-Satterthwaite") == 2  # one fit over the 12 runs (two candidates, the baseline, drift)
    winner = json.loads((tmp_path / "j" / "best" / "best.json").read_text())
    assert winner["params"]["max_num_seqs"] in {r["flags"]["max_num_seqs"] for r in confirm if r["arm"] == CANDIDATE}


def test_the_rhythm_check_reads_a_views_true_positions_not_its_ranks():
    """A joint view has gaps (B at 0, 5, 8, 9; C1 at 1, 4, 7, 10): the machine's odd/even rhythm follows the
    run's position, which the view's ranks do not (they alternate where the positions go odd, odd)."""
    rng = np.random.default_rng(3)
    view = [(a, p) for p, a in enumerate(joint_schedule(2, 4)) if a in (BASELINE, CANDIDATE)]
    obs = [Observation(a, p, (1.04 if p % 2 else 0.96) * (1 + 0.01 * p) * math.exp(rng.normal(0, 0.002)))
           for a, p in view]
    assert any("odd/even rhythm" in w for w in lack_of_fit(obs)), lack_of_fit(obs)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), noise=st.lists(st.floats(0.005, 0.08), min_size=3, max_size=3))
def test_the_joint_fits_covariance_gives_the_standard_errors_it_reports(seed, noise):
    """One weighting of the runs (each by its own arm's residual variance) for every combination: the
    covariance the pick's certainty draws from says the same standard error as each effect and contrast."""
    rng = np.random.default_rng(seed)
    arms = ["baseline", "t0", "t1"]
    order = [arms[i % 3] for i in (0, 1, 2, 2, 1, 0, 0, 1, 2, 2, 1, 0)]
    obs = [Observation(arm, pos, math.exp(rng.normal(0, noise[arms.index(arm)]))) for pos, arm in enumerate(order)]
    fitted = fit_joint(obs)
    cov = fitted.welch_cov()
    for w in ([0, 1, 0, 0], [0, 0, 1, 0], [0, 1, -1, 0], [0, 0.5, 0.5, 0]):
        w = np.array(w, dtype=float)
        assert math.sqrt(w @ cov @ w) == pytest.approx(fitted.spread(w)[0], rel=1e-9)
