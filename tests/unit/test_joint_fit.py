"""One least-squares fit over a joint confirmation's runs (every candidate's arm, the baseline's, the drift):
each candidate keeps the estimate its own view gives (every arm is balanced against position), the drift
comes from all the runs, and each arm's noise is its own (Welch-Satterthwaite), so that a noisy candidate
does not borrow the quiet ones' precision (#27)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.unit.test_joint_confirmation import simulate_joint, view_estimate
from throttle_sweep.stats.analysis import analyse_joint
from throttle_sweep.stats.schedule import joint_schedule
from throttle_sweep.stats.verdict import CHEAPER, PRICIER, Thresholds

EDGE = Thresholds(equivalence_margin=0.0)  # A/A with no margin: the interval's one-sided miss (see test_stats)


@pytest.mark.parametrize("candidates", [2, 3])
def test_one_fit_keeps_each_candidates_estimate_on_each_arms_own_noise(candidates):
    rng = np.random.default_rng(3)
    records = simulate_joint(joint_schedule(candidates, 4), [0.9, 1.0, 1.05][:candidates], rng=rng, noise_sd=0.02)
    joint = analyse_joint(records, Thresholds())
    assert sorted(joint) == list(range(candidates))
    for trial, analysis in joint.items():
        alone = view_estimate(records, trial)
        assert analysis.estimate.ratio == pytest.approx(alone.ratio, rel=1e-9)
        # Satterthwaite's df: at least 1, at most the residual df of all the runs
        assert alone.df == 5 and 1 <= analysis.estimate.df <= 4 * (candidates + 1) - (candidates + 2)
        assert analysis.verdict == analysis.estimate.verdict
        assert any("one fit over the joint schedule" in note and "Welch-Satterthwaite" in note
                   for note in analysis.notes)


def test_each_arms_own_noise_costs_little_width_at_equal_noise():
    """Three candidates, 2% noise each: the price of not pooling the arms' noise is a 95% interval about 5%
    wider on average than a view's own (its 5 df pool the baseline's and the candidate's)."""
    rng = np.random.default_rng(4)
    alone, joint = [], []
    for _ in range(300):
        records = simulate_joint(joint_schedule(3, 4), [0.95, 1.0, 1.0], rng=rng, noise_sd=0.02)
        fitted = analyse_joint(records, Thresholds())
        for trial in range(3):
            a, j = view_estimate(records, trial), fitted[trial].estimate
            alone.append(math.log(a.ci_high / a.ci_low))
            joint.append(math.log(j.ci_high / j.ci_low))
    assert 0.98 < np.mean(joint) / np.mean(alone) < 1.10


N_SIM = 2000


@pytest.mark.calibration
@pytest.mark.parametrize("candidates", [2, 3])
@pytest.mark.parametrize("kind", ["none", "curvature 3%", "alternation 1.1%"])
def test_the_joint_fit_is_calibrated_for_every_candidate(candidates, kind):
    """A/A, every candidate equal to the baseline, 1-3% noise, +27% drift, the lead rotating: each candidate's
    95% interval covers the truth in >= 95% of runs and neither false verdict exceeds alpha/2 (each less or
    plus 3 Monte-Carlo standard errors)."""
    rng = np.random.default_rng(21)
    counts = {trial: [0, 0, 0] for trial in range(candidates)}
    for i in range(N_SIM):
        records = simulate_joint(joint_schedule(candidates, 4, lead=i % (candidates + 1)), [1.0] * candidates,
                                 rng=rng, noise_sd=rng.uniform(0.01, 0.03), kind=kind)
        for trial, analysis in analyse_joint(records, EDGE).items():
            est = analysis.estimate
            counts[trial][0] += est.ci_low <= 1.0 <= est.ci_high
            counts[trial][1] += est.verdict == CHEAPER
            counts[trial][2] += est.verdict == PRICIER
    rates = {t: [c / N_SIM for c in v] for t, v in counts.items()}
    print(f"\nA/A joint fit ({candidates} candidates) x4, {kind}: " + "; ".join(
        f"trial {t}: coverage {r[0]:.3f}, CHEAPER {r[1]:.4f}, PRICIER {r[2]:.4f}" for t, r in rates.items()))
    se_cover, se_side = 3 * math.sqrt(0.05 * 0.95 / N_SIM), 3 * math.sqrt(0.025 * 0.975 / N_SIM)
    for coverage, cheaper, pricier in rates.values():
        assert coverage >= 0.95 - se_cover and cheaper <= 0.025 + se_side and pricier <= 0.025 + se_side


@pytest.mark.calibration
@pytest.mark.parametrize("candidates", [2, 3])
def test_one_noisier_arm_keeps_its_own_noise(candidates):
    """A/A, the first candidate's runs 3% noisy, every other arm's 1%: one residual variance over all the runs
    lent the noisy arm the quiet arms' precision (coverage 0.85-0.90, false verdicts 4.5-7.4% a side). Its
    interval must still cover
    >= 95% with neither false verdict above alpha/2 (each less or plus 3 Monte-Carlo standard errors)."""
    rng = np.random.default_rng(22)
    cover = cheaper = pricier = 0
    for i in range(N_SIM):
        records = simulate_joint(joint_schedule(candidates, 4, lead=i % (candidates + 1)), [1.0] * candidates,
                                 rng=rng, noise_sd=0.01, trial_noise={0: 0.03})
        est = analyse_joint(records, EDGE)[0].estimate
        cover += est.ci_low <= 1.0 <= est.ci_high
        cheaper += est.verdict == CHEAPER
        pricier += est.verdict == PRICIER
    rates = cover / N_SIM, cheaper / N_SIM, pricier / N_SIM
    print(f"\none arm 3% noisy, the rest 1% ({candidates} candidates): coverage {rates[0]:.3f}, "
          f"CHEAPER {rates[1]:.4f}, PRICIER {rates[2]:.4f}")
    se_cover, se_side = 3 * math.sqrt(0.05 * 0.95 / N_SIM), 3 * math.sqrt(0.025 * 0.975 / N_SIM)
    assert rates[0] >= 0.95 - se_cover and rates[1] <= 0.025 + se_side and rates[2] <= 0.025 + se_side
