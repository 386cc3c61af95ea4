"""The statistics: properties (hypothesis) and calibration by simulated runs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from throttle_sweep.errors import ConfigError
from throttle_sweep.schedule import make_schedule
from throttle_sweep.stats import (
    CHEAPER,
    INCONCLUSIVE,
    NO_DIFFERENCE,
    PRICIER,
    Observation,
    Thresholds,
    decide,
    estimate,
)


def simulate(order, ratio, *, drift_total, noise_sd, rng, base=1.0):
    """Costs for a run order: linear drift of `drift_total` across the run, lognormal noise."""
    n = len(order)
    obs = []
    for i, arm in enumerate(order):
        drift = 1 + drift_total * i / (n - 1)
        cost = base * drift * (ratio if arm == "candidate" else 1.0) * math.exp(rng.normal(0, noise_sd))
        obs.append(Observation(arm, i, cost))
    return obs


@given(st.floats(0.3, 3.0), st.floats(-0.5, 1.0), st.floats(0.01, 100))
@settings(max_examples=60, deadline=None)
def test_exact_ratio_is_recovered_under_any_linear_log_drift(ratio, slope, base):
    """With no noise and drift linear in log cost, the fit returns the true ratio exactly."""
    order = make_schedule("aba-bab", 3)
    obs = [Observation(a, i, base * math.exp(slope * i / 5) * (ratio if a == "candidate" else 1))
           for i, a in enumerate(order)]
    est = estimate(obs)
    assert est.ratio == pytest.approx(ratio, rel=1e-9)
    assert est.drift_per_position == pytest.approx(math.exp(slope / 5) - 1, rel=1e-6, abs=1e-12)


@given(st.lists(st.floats(0.5, 2.0), min_size=6, max_size=6), st.floats(0.1, 10))
@settings(max_examples=60, deadline=None)
def test_scale_invariance_and_interval_contains_estimate(costs, scale):
    order = make_schedule("abba", 3)
    obs = [Observation(a, i, c) for i, (a, c) in enumerate(zip(order, costs, strict=False))]
    scaled = [Observation(o.arm, o.position, o.cost * scale) for o in obs]
    a, b = estimate(obs), estimate(scaled)
    assert a.ratio == pytest.approx(b.ratio) and a.ci_low == pytest.approx(b.ci_low)
    assert a.ci_low <= a.ratio <= a.ci_high


@given(st.lists(st.floats(0.5, 2.0), min_size=6, max_size=6))
@settings(max_examples=60, deadline=None)
def test_swapping_arms_inverts_the_ratio(costs):
    order = make_schedule("aba-bab", 3)
    obs = [Observation(a, i, c) for i, (a, c) in enumerate(zip(order, costs, strict=False))]
    swapped = [Observation("baseline" if o.arm == "candidate" else "candidate", o.position, o.cost) for o in obs]
    a, b = estimate(obs), estimate(swapped)
    assert a.ratio * b.ratio == pytest.approx(1.0)
    assert a.ci_low * b.ci_high == pytest.approx(1.0)


@pytest.mark.parametrize("lo, hi, verdict", [
    (0.90, 0.95, CHEAPER), (1.05, 1.10, PRICIER), (0.99, 1.01, NO_DIFFERENCE), (0.95, 1.01, INCONCLUSIVE),
])
def test_verdict_thresholds(lo, hi, verdict):
    assert decide(lo, hi, Thresholds(min_effect=0.0, equivalence_margin=0.02)) == verdict


def test_min_effect_demands_a_larger_saving():
    assert decide(0.96, 0.98, Thresholds(min_effect=0.05)) == INCONCLUSIVE


@pytest.mark.parametrize("kind", ["aba-bab", "abba", "random"])
@given(n=st.integers(2, 12), seed=st.integers(0, 1000))
@settings(max_examples=30, deadline=None)
def test_schedules_are_balanced(kind, n, seed):
    order = make_schedule(kind, n, seed=seed)
    assert order.count("baseline") == order.count("candidate") == n


def test_schedule_shapes():
    assert make_schedule("aba-bab", 3) == ["baseline", "candidate"] * 3
    assert make_schedule("abba", 4) == ["baseline", "candidate", "candidate", "baseline",
                                        "candidate", "baseline", "baseline", "candidate"]


N_SIM = 2000
MC_SLACK = 3 * math.sqrt(0.025 * 0.975 / N_SIM)  # three Monte-Carlo standard errors


def verdict_rate(order, ratio, verdict, *, drift_total, noise, seed, analyse=estimate):
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(N_SIM):
        sd = rng.uniform(*noise) if isinstance(noise, tuple) else noise
        hits += analyse(simulate(order, ratio, drift_total=drift_total, noise_sd=sd, rng=rng)).verdict == verdict
    return hits / N_SIM


@pytest.mark.parametrize("kind", ["aba-bab", "abba"])
def test_calibration_aa_with_27pct_drift_rarely_says_cheaper(kind, record_property):
    order = make_schedule(kind, 3)
    rate = verdict_rate(order, 1.0, CHEAPER, drift_total=0.27, noise=(0.01, 0.03), seed=1)
    record_property("false_cheaper_rate", rate)
    print(f"\nA/A false CHEAPER rate, {kind}, 27% drift, 1-3% noise: {rate:.4f} (alpha/2 = 0.025)")
    assert rate <= 0.025 + MC_SLACK


def test_power_true_5pct_saving_detected_in_90pct_of_aba_bab_runs():
    order = make_schedule("aba-bab", 3)
    rate = verdict_rate(order, 0.95, CHEAPER, drift_total=0.27, noise=0.01, seed=2)
    print(f"\npower, 5% saving, 1% noise, aba-bab x3: {rate:.4f}")
    assert rate >= 0.90


def naive_welch(obs):
    """What a plain before/after does: a Welch t-test treating the runs as independent."""
    b = np.log([o.cost for o in obs if o.arm == "baseline"])
    c = np.log([o.cost for o in obs if o.arm == "candidate"])
    res = sps.ttest_ind(c, b, equal_var=False)
    return type("R", (), {"verdict": CHEAPER if res.statistic < 0 and res.pvalue / 2 < 0.025 else "other"})


def test_naive_order_analysed_as_independent_fails_calibration():
    order = ["baseline"] * 3 + ["candidate"] * 3
    # drift makes the later (candidate) runs look pricier; a downward drift makes them look cheaper
    rate = verdict_rate(order, 1.0, CHEAPER, drift_total=-0.27 / 1.27, noise=(0.01, 0.03), seed=3,
                        analyse=naive_welch)
    print(f"\nnaive B B B C C C, Welch t-test, A/A: false CHEAPER rate {rate:.3f}")
    assert rate > 0.5


def test_tool_warns_when_the_order_confounds_arm_with_time():
    rng = np.random.default_rng(0)
    naive = estimate(simulate(["baseline"] * 3 + ["candidate"] * 3, 1.0, drift_total=0.1, noise_sd=0.01, rng=rng))
    interleaved = estimate(simulate(make_schedule("aba-bab", 3), 1.0, drift_total=0.1, noise_sd=0.01, rng=rng))
    assert any("confounds arm with time" in w for w in naive.warnings)
    assert interleaved.warnings == ()


def test_inconclusive_says_how_many_more_replicates():
    rng = np.random.default_rng(5)
    est = estimate(simulate(make_schedule("aba-bab", 2), 0.97, drift_total=0.0, noise_sd=0.02, rng=rng))
    if est.verdict == INCONCLUSIVE:
        assert est.more_replicates_per_arm is None or est.more_replicates_per_arm > 0


@pytest.mark.parametrize("obs, message", [
    ([Observation("baseline", i, 1.0) for i in range(4)], "at least 2 replicates of the candidate"),
    ([Observation("baseline", 0, 1.0), Observation("candidate", 1, 1.0)] * 2, "positions must be unique"),
    ([Observation("baseline", 0, 1.0), Observation("baseline", 1, 1.0), Observation("candidate", 2, 1.0),
      Observation("candidate", 3, -1.0)], "cost must be a positive number"),
    ([Observation("base", 0, 1.0)], "arm must be 'baseline' or 'candidate'"),
])
def test_bad_observations(obs, message):
    with pytest.raises(ConfigError, match=message):
        estimate(obs)
