"""The statistics: properties (hypothesis) and calibration by simulated runs."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from throttle_sweep.errors import ConfigError
from throttle_sweep.stats.schedule import make_schedule, with_warmup
from throttle_sweep.stats.verdict import (
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


@given(st.lists(st.floats(0.5, 2.0), min_size=8, max_size=8), st.floats(0.1, 10))
@settings(max_examples=60, deadline=None)
def test_scale_invariance_and_interval_contains_estimate(costs, scale):
    order = make_schedule("abba", 4)
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


def test_min_effect_demands_a_larger_saving_and_is_the_margin_of_no_difference_too():
    """A saving under min_effect is not worth a change, as one under the margin is: pinned there, it is NO
    DIFFERENCE, not INCONCLUSIVE however many runs are added."""
    t = Thresholds(min_effect=0.05, equivalence_margin=0.02)
    assert decide(0.90, 0.94, t) == CHEAPER
    assert decide(0.93, 0.97, t) == INCONCLUSIVE
    assert decide(0.964, 0.966, t) == NO_DIFFERENCE


@pytest.mark.parametrize("kind", ["aba-bab", "abba", "random"])
@given(n=st.integers(2, 12), seed=st.integers(0, 1000), lead=st.sampled_from(["baseline", "candidate"]))
@settings(max_examples=30, deadline=None)
def test_schedules_are_balanced_and_start_with_the_lead(kind, n, seed, lead):
    if kind == "abba" and n % 2:
        with pytest.raises(ConfigError, match="complete B C C B blocks.*must be even, but got"):
            make_schedule(kind, n, seed=seed, lead=lead)
        return
    order = make_schedule(kind, n, seed=seed, lead=lead)
    assert order.count("baseline") == order.count("candidate") == n
    assert kind == "random" or order[0] == lead


def test_schedule_shapes():
    assert make_schedule("aba-bab", 3) == ["baseline", "candidate"] * 3
    assert make_schedule("abba", 4) == ["baseline", "candidate", "candidate", "baseline",
                                        "candidate", "baseline", "baseline", "candidate"]
    assert make_schedule("abba", 2, lead="candidate") == ["candidate", "baseline", "baseline", "candidate"]
    assert with_warmup(make_schedule("abba", 2)) == ["baseline", "baseline", "candidate", "candidate", "baseline"]


def perturbed(order, ratio, kind, *, noise_sd, rng, warmup):
    """Costs in run order under one of the review's perturbations, +27% linear drift; with `warmup` one more
    run goes first and is dropped, as the tool drops its warm-up record."""
    runs = ([order[0]] if warmup else []) + list(order)
    n = len(runs)
    obs = []
    for i, arm in enumerate(runs):
        factor = 1 + 0.27 * i / (n - 1)
        factor *= {"none": 1.0, "slow first 5%": 1.05 if i == 0 else 1.0, "slow first 10%": 1.10 if i == 0 else 1.0,
                   "slow start fading 8-4-2%": {0: 1.08, 1: 1.04, 2: 1.02}.get(i, 1.0),
                   "curvature 3%": 1 + 0.03 * (2 * i / (n - 1) - 1) ** 2,
                   "alternation 1.1%": 1.011 if i % 2 == 0 else 0.989}[kind]
        obs.append(Observation(arm, i, factor * (ratio if arm == "candidate" else 1.0)
                               * math.exp(rng.normal(0, noise_sd))))
    return obs[1:] if warmup else obs


PERTURBATIONS = ["none", "slow first 5%", "slow first 10%", "slow start fading 8-4-2%", "curvature 3%",
                 "alternation 1.1%"]


@pytest.mark.calibration
@pytest.mark.parametrize("kind", PERTURBATIONS)
def test_calibration_of_the_default_schedule_under_the_reviews_perturbations(kind):
    """The default (abba, 4 per arm, a warm-up run, the lead alternating across comparisons), A/A: the 95%
    interval covers the truth in >= 95% of runs (less 3 MC standard errors), and neither false verdict
    exceeds alpha/2 (plus 3 MC standard errors); the table is printed for the README."""
    rng = np.random.default_rng(7)
    covered = cheaper = pricier = 0
    for i in range(N_SIM):
        order = make_schedule("abba", 4, lead="candidate" if i % 2 else "baseline")
        est = estimate(perturbed(order, 1.0, kind, noise_sd=rng.uniform(0.01, 0.03), rng=rng, warmup=True), EDGE)
        covered += est.ci_low <= 1.0 <= est.ci_high
        cheaper += est.verdict == CHEAPER
        pricier += est.verdict == PRICIER
    coverage, cheaper, pricier = covered / N_SIM, cheaper / N_SIM, pricier / N_SIM
    print(f"\nA/A abba x4 + warm-up + alternating lead, {kind}: coverage {coverage:.3f}, false CHEAPER "
          f"{cheaper:.4f}, false PRICIER {pricier:.4f}")
    assert coverage >= 0.95 - 3 * math.sqrt(0.05 * 0.95 / N_SIM)
    assert cheaper <= 0.025 + MC_SLACK and pricier <= 0.025 + MC_SLACK


@pytest.mark.calibration
def test_the_old_default_fails_under_an_alternating_rhythm():
    """aba-bab ties the arm to odd and even positions: a machine that alternates +-1.1% (as the real engine
    seemed to) reads as a saving. This is why abba is the default. (A difference, not a CHEAPER: 1.1% lies
    inside the 2% margin a CHEAPER must clear.)"""
    rng = np.random.default_rng(8)
    order = make_schedule("aba-bab", 3)
    below_one = sum(estimate(perturbed(order, 1.0, "alternation 1.1%", noise_sd=0.01, rng=rng, warmup=False)).ci_high
                    < 1 for _ in range(N_SIM)) / N_SIM
    assert below_one > 0.2


# A/A with no margin: a false verdict is then the interval's one-sided miss, which bounds the error a claim
# makes for a ratio exactly at the margin's edge (with the default margin, an A/A run is almost never claimed)
EDGE = Thresholds(equivalence_margin=0.0)
N_SIM = 2000
MC_SLACK = 3 * math.sqrt(0.025 * 0.975 / N_SIM)  # three Monte-Carlo standard errors


def verdict_rate(order, ratio, verdict, *, drift_total, noise, seed, analyse=estimate):
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(N_SIM):
        sd = rng.uniform(*noise) if isinstance(noise, tuple) else noise
        hits += analyse(simulate(order, ratio, drift_total=drift_total, noise_sd=sd, rng=rng)).verdict == verdict
    return hits / N_SIM


@pytest.mark.calibration
@pytest.mark.parametrize("kind, n", [("aba-bab", 3), ("abba", 4)])
def test_calibration_aa_with_27pct_drift_rarely_says_either_way(kind, n):
    order = make_schedule(kind, n)
    edge = functools.partial(estimate, thresholds=EDGE)
    cheaper = verdict_rate(order, 1.0, CHEAPER, drift_total=0.27, noise=(0.01, 0.03), seed=1, analyse=edge)
    pricier = verdict_rate(order, 1.0, PRICIER, drift_total=0.27, noise=(0.01, 0.03), seed=1, analyse=edge)
    print(f"\nA/A {kind} x{n}, 27% drift, 1-3% noise: false CHEAPER {cheaper:.4f}, false PRICIER {pricier:.4f} "
          "(alpha/2 = 0.025)")
    assert cheaper <= 0.025 + MC_SLACK and pricier <= 0.025 + MC_SLACK


@pytest.mark.calibration
def test_power_true_5pct_saving_detected_in_90pct_of_default_runs():
    """CHEAPER needs the whole interval beyond the 2% margin, so a 5% saving has 3% of room: 0.9145 here."""
    order = make_schedule("abba", 4)
    rate = verdict_rate(order, 0.95, CHEAPER, drift_total=0.27, noise=0.01, seed=2)
    print(f"\npower, 5% saving, 1% noise, abba x4: {rate:.4f}")
    assert rate >= 0.90


def test_tool_warns_when_the_order_confounds_arm_with_time():
    rng = np.random.default_rng(0)
    naive = estimate(simulate(["baseline"] * 3 + ["candidate"] * 3, 1.0, drift_total=0.1, noise_sd=0.01, rng=rng))
    interleaved = estimate(simulate(make_schedule("aba-bab", 3), 1.0, drift_total=0.1, noise_sd=0.01, rng=rng))
    assert any("confounds arm with time" in w for w in naive.warnings)
    assert interleaved.warnings == ()


def test_inconclusive_says_how_many_more_replicates():
    rng = np.random.default_rng(5)
    ests = [estimate(simulate(make_schedule("aba-bab", 2), 0.97, drift_total=0.0, noise_sd=0.02, rng=rng))
            for _ in range(50)]
    undecided = [e for e in ests if e.verdict == INCONCLUSIVE]
    assert len(undecided) > 10  # the case is exercised, not skipped by luck
    assert all(e.more_replicates_per_arm is None or e.more_replicates_per_arm > 0 for e in undecided)
    assert any(e.more_replicates_per_arm for e in undecided)


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


def test_lack_of_fit_is_flagged_for_curvature_and_rarely_for_linear_drift():
    rng = np.random.default_rng(9)
    order = make_schedule("abba", 4)

    def run(kind):
        return estimate(perturbed(order, 1.0, kind, noise_sd=0.005, rng=rng, warmup=False))

    def flagged(est):
        return any("more than linear drift" in w for w in est.warnings)

    def linear_in_log():  # drift exactly linear in log cost: what the model assumes
        return estimate([Observation(a, i, math.exp(0.24 * i / 7 + rng.normal(0, 0.005))) for i, a in enumerate(order)])

    clean = sum(flagged(linear_in_log()) for _ in range(400)) / 400
    curved = [run("curvature 3%") for _ in range(400)]
    print(f"\nlack-of-fit flagged: linear drift {clean:.3f}, 3% curvature {sum(map(flagged, curved)) / 400:.3f}")
    assert clean <= 0.08, clean
    assert sum(map(flagged, curved)) / 400 >= 0.5
    assert all("balanced against it" in " ".join(e.warnings) for e in curved if flagged(e))  # abba x4 is balanced
