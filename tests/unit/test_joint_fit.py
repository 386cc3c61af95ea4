"""One least-squares fit over a joint confirmation's runs (every candidate's arm, the baseline's, the drift):
each candidate keeps the estimate its own view gives (every arm is balanced against position), and its
interval gets the residual df of all the runs, not of its view's 8 runs alone (#27)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.unit.test_joint_confirmation import simulate_joint, view_estimate
from throttle_sweep.analysis import analyse_joint
from throttle_sweep.schedule import joint_schedule
from throttle_sweep.stats import CHEAPER, PRICIER, Thresholds


@pytest.mark.parametrize("candidates", [2, 3])
def test_one_fit_keeps_each_candidates_estimate_and_gains_the_df_of_all_runs(candidates):
    rng = np.random.default_rng(3)
    records = simulate_joint(joint_schedule(candidates, 4), [0.9, 1.0, 1.05][:candidates], rng=rng, noise_sd=0.02)
    joint = analyse_joint(records, Thresholds())
    assert sorted(joint) == list(range(candidates))
    for trial, analysis in joint.items():
        alone = view_estimate(records, trial)
        assert analysis.estimate.ratio == pytest.approx(alone.ratio, rel=1e-9)
        assert (alone.df, analysis.estimate.df) == (8 - 3, 4 * (candidates + 1) - (candidates + 2))
        assert analysis.verdict == analysis.estimate.verdict
        assert any("one fit over the joint schedule" in note for note in analysis.notes)


def test_the_joint_fit_narrows_the_intervals_on_average():
    """Three candidates, 2% noise: the 95% interval narrows by about an eighth on average, as the t quantile
    at 11 df against 5 (2.201 / 2.571) and the smaller downward bias of s at 11 df predict (0.88)."""
    rng = np.random.default_rng(4)
    alone, joint = [], []
    for _ in range(300):
        records = simulate_joint(joint_schedule(3, 4), [0.95, 1.0, 1.0], rng=rng, noise_sd=0.02)
        fitted = analyse_joint(records, Thresholds())
        for trial in range(3):
            a, j = view_estimate(records, trial), fitted[trial].estimate
            alone.append(math.log(a.ci_high / a.ci_low))
            joint.append(math.log(j.ci_high / j.ci_low))
    assert 0.84 < np.mean(joint) / np.mean(alone) < 0.91


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
        for trial, analysis in analyse_joint(records, Thresholds()).items():
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
