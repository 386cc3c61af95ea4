"""Noise pooled across a sweep's comparisons (#27): each comparison's residual variance is shrunk toward the
sweep's pooled estimate (a moderated t, as limma's: a prior of s0^2 on d0 df, d0 estimated from how much the
comparisons' variances scatter, at most 10), unless its own residuals disagree with the pool (an F check),
when it is judged on its own noise alone. Simulated sweeps: 8 other comparisons of abba x4 give the pool."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.unit.test_stats import perturbed, simulate
from throttle_sweep.stats.schedule import make_schedule
from throttle_sweep.stats.verdict import CHEAPER, PRICIER, Thresholds, estimate, pooled_prior

ORDER = make_schedule("abba", 4)


def pool_of(rng, sds, order=ORDER):
    """The prior from comparisons of these noise levels (A/A, +27% drift)."""
    return pooled_prior([(e.resid_var, e.df) for e in
                         (estimate(simulate(order, 1.0, drift_total=0.27, noise_sd=sd, rng=rng)) for sd in sds)])


def test_the_prior_recovers_the_common_noise_and_trusts_it_more_when_the_variances_agree():
    rng = np.random.default_rng(1)
    same = pool_of(rng, [0.02] * 40)
    assert same.s2 == pytest.approx(0.02**2, rel=0.25) and same.df == 10  # capped
    spread = pool_of(rng, list(np.exp(rng.uniform(np.log(0.005), np.log(0.08), 40))))
    assert spread.df < same.df  # variances that scatter more than chance: a weaker prior
    assert pooled_prior([(0.0004, 5)] * 3) is None  # too few comparisons to pool


def test_a_pooled_estimate_has_more_df_and_keeps_the_ratio():
    rng = np.random.default_rng(2)
    prior = pool_of(rng, [0.02] * 8)
    obs = simulate(ORDER, 0.95, drift_total=0.27, noise_sd=0.02, rng=rng)
    own, pooled = estimate(obs), estimate(obs, prior=prior)
    assert pooled.ratio == pytest.approx(own.ratio) and pooled.df == own.df + prior.df
    first = simulate(make_schedule("abba", 2), 0.95, drift_total=0.1, noise_sd=0.02, rng=rng)
    assert estimate(first, prior=prior).df == 1  # a first look (1 own df) keeps its own noise
    assert any("pooled" in w for w in pooled.warnings)


def test_a_comparison_whose_residuals_disagree_with_the_pool_is_judged_on_its_own_noise():
    rng = np.random.default_rng(3)
    prior = pool_of(rng, [0.01] * 8)
    obs = simulate(ORDER, 1.0, drift_total=0.27, noise_sd=0.01, rng=rng)
    obs[3] = type(obs[3])(obs[3].arm, obs[3].position, obs[3].cost * 1.10)  # one run 10% slow
    est = estimate(obs, prior=prior)
    assert est.df == 5 and any("disagree" in w for w in est.warnings)


N_SIM = 2000
SIDE = 0.025 + 3 * math.sqrt(0.025 * 0.975 / N_SIM)
COVER = 0.95 - 3 * math.sqrt(0.05 * 0.95 / N_SIM)


@pytest.mark.calibration
@pytest.mark.parametrize("noise", ["2% everywhere", "1-3% from comparison to comparison"])
@pytest.mark.parametrize("kind", ["none", "curvature 3%", "alternation 1.1%", "one run 10% slow"])
def test_pooled_comparisons_are_calibrated(noise, kind):
    """A/A with the pool of 8 other comparisons: coverage >= 0.95 and each false verdict <= alpha/2 (less or
    plus 3 Monte-Carlo standard errors), also when the noise differs between comparisons and with one run of
    the comparison 10% slow (the guard's case)."""
    rng = np.random.default_rng(31)
    covered = cheaper = pricier = 0
    for _ in range(N_SIM):
        sds = [0.02] * 9 if noise.startswith("2%") else list(rng.uniform(0.01, 0.03, 9))
        prior = pool_of(rng, sds[1:])
        if kind == "one run 10% slow":
            obs = perturbed(ORDER, 1.0, "none", noise_sd=sds[0], rng=rng, warmup=False)
            k = int(rng.integers(len(obs)))
            obs[k] = type(obs[k])(obs[k].arm, obs[k].position, obs[k].cost * 1.10)
        else:
            obs = perturbed(ORDER, 1.0, kind, noise_sd=sds[0], rng=rng, warmup=False)
        est = estimate(obs, Thresholds(equivalence_margin=0.0), prior=prior)  # no margin: see test_stats' EDGE
        covered += est.ci_low <= 1.0 <= est.ci_high
        cheaper += est.verdict == CHEAPER
        pricier += est.verdict == PRICIER
    print(f"\npooled A/A, {noise}, {kind}: coverage {covered / N_SIM:.3f}, false CHEAPER {cheaper / N_SIM:.4f}, "
          f"false PRICIER {pricier / N_SIM:.4f}")
    assert covered / N_SIM >= COVER and cheaper / N_SIM <= SIDE and pricier / N_SIM <= SIDE


@pytest.mark.calibration
def test_a_pool_of_mostly_first_looks_stays_calibrated():
    """A sweep's screens often stop at their first look (B C C B: 1 own df), and those enter the pool: their
    chi-square(1) variances scatter widely, which the prior's df estimate allows for. With 4 of the 8 others
    first looks, A/A stays calibrated, and a pool forms in about 0.95 of runs (too scattered otherwise). The
    alternative, leaving first looks out of the pool, measured no better (4,000 runs: coverage 0.961 against
    0.962) and, with 6 of 8 first looks, left too few to pool: power at a 5% saving 0.82 against 0.86."""
    rng = np.random.default_rng(33)
    first = make_schedule("abba", 2)
    covered = cheaper = pricier = pooled = 0
    for _ in range(N_SIM):
        pool = [estimate(simulate(first if i < 4 else ORDER, 1.0, drift_total=0.27, noise_sd=0.02, rng=rng))
                for i in range(8)]
        prior = pooled_prior([(e.resid_var, e.resid_df) for e in pool])  # None: too scattered to pool
        pooled += prior is not None
        est = estimate(simulate(ORDER, 1.0, drift_total=0.27, noise_sd=0.02, rng=rng),
                       Thresholds(equivalence_margin=0.0), prior=prior)
        covered += est.ci_low <= 1.0 <= est.ci_high
        cheaper += est.verdict == CHEAPER
        pricier += est.verdict == PRICIER
    print(f"\npool with 4 first looks of 8: coverage {covered / N_SIM:.3f}, false CHEAPER {cheaper / N_SIM:.4f}, "
          f"false PRICIER {pricier / N_SIM:.4f}, a pool in {pooled / N_SIM:.3f}")
    assert pooled / N_SIM > 0.8
    assert covered / N_SIM >= COVER and cheaper / N_SIM <= SIDE and pricier / N_SIM <= SIDE


@pytest.mark.calibration
def test_pooling_buys_power_at_the_default_size_and_at_the_first_look():
    """A 5% saving at 2% noise, abba x4: CHEAPER in clearly more runs pooled than alone (the review measured
    0.82 alone, 0.93 with a prior of about 10 df). A first look (B C C B, 1 df) is not pooled."""
    rng = np.random.default_rng(32)
    alone = pooled = 0
    for _ in range(N_SIM):
        prior = pool_of(rng, [0.02] * 8)
        obs = simulate(ORDER, 0.95, drift_total=0.27, noise_sd=0.02, rng=rng)
        alone += estimate(obs).verdict == CHEAPER
        pooled += estimate(obs, prior=prior).verdict == CHEAPER
    print(f"\npower, 5% saving at 2% noise, abba x4: alone {alone / N_SIM:.3f}, pooled {pooled / N_SIM:.3f}")
    assert pooled / N_SIM >= alone / N_SIM + 0.05


def test_a_sweep_pools_its_search_comparisons_noise_and_quotes_confirmation_on_its_own(tmp_path):
    """On the noisy fake engine, once 4 search comparisons are in, later ones are judged with the pooled noise
    (more df, said in their notes); confirmation keeps its own (the answer is quoted on fresh runs alone);
    study.pooled_noise=false turns it off."""
    import optuna
    from rich.console import Console

    from tests.helpers import compose_cfg
    from throttle_sweep.commands import sweep as sweep_cmd
    from throttle_sweep.sweep.trials import measured

    args = ["backend=fake", "+space=batching", "space.max_num_seqs.low=2", "space.max_num_seqs.high=16",
            "~space.max_num_batched_tokens", "space.max_num_seqs.log=false", "study.sampler=grid", "study.n_trials=8", "study.boundary=none",
            "study.confirm_top=1", "fake.noise_sd=0.02", "workload.num_requests=16", "workload.output_len=16",
            "workload.prompt_len=16", "workload.concurrency=16", "study.sequential=false", "plots=false"]
    for pooled in (True, False):
        name = f"pool-{pooled}"
        cfg = compose_cfg(*args, f"study.name={name}", f"study.pooled_noise={str(pooled).lower()}", tmp_path=tmp_path)
        assert sweep_cmd.run(cfg, Console(quiet=True)) == 0
        study = optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path / name / 'study.db'}")
        trials = sorted((t for t in study.trials if measured(t) and t.user_attrs.get("df")), key=lambda t: t.number)
        own = {t.user_attrs["resid_df"] for t in trials}
        assert own == {5}  # 4 + 4 runs each
        pooled_ones = [t for t in trials if t.user_attrs["df"] > 5]
        if pooled:
            assert pooled_ones and all(any("noise pooled" in n for n in t.user_attrs["notes"]) for t in pooled_ones)
            assert all(t.user_attrs["df"] == 5 for t in trials[:4])  # too few to pool before them
        else:
            assert not pooled_ones
