"""The capacity search's pure parts (#26): a run's SLO attainment, the rates it runs (bracket, bisection,
replicated knee), and the capacity's interval from the knee runs, calibrated by simulation."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from throttle_sweep.capacity.knee import fit_knee
from throttle_sweep.capacity.rates import ALWAYS_MET, FOUND, NEVER_MET, RateSearch
from throttle_sweep.capacity.slo import Slo
from throttle_sweep.capacity.steady import counted
from throttle_sweep.errors import ConfigError
from throttle_sweep.stats.verdict import t_quantile


def test_attainment_counts_requests_meeting_both_limits():
    slo = Slo(p95_ttft_s=0.5, p95_tpot_s=0.05, attainment=0.9)
    rows = [[0.0, 9.0, 0.01],  # a queue from empty cannot start worse than it goes on: counted, not a warm-up
            [2.0, 0.4, 0.04], [4.0, 0.6, 0.01], [6.0, 0.1, 0.06], [8.0, None, None], [10.0, 0.2, None]]
    assert counted({"requests_s": rows}, slo)[:2] == (2, 6)
    assert counted({"requests_s": rows}, Slo(p95_ttft_s=0.5))[:2] == (3, 6)
    assert counted({"status": "failed"}, slo) is None


@pytest.mark.parametrize(("slo", "words"), [
    (Slo(), "needs a latency SLO"),
    (Slo(p95_ttft_s=0), "slo.p95_ttft_s must be a positive number"),
    (Slo(p95_tpot_s=-1), "slo.p95_tpot_s must be a positive number"),
    (Slo(p95_ttft_s=1, attainment=1.0), "slo.attainment"),
    (Slo(p95_ttft_s=1, attainment=0), "slo.attainment"),
])
def test_an_slo_that_cannot_be_kept_or_read_is_refused_by_name(slo, words):
    with pytest.raises(ConfigError, match=words):
        slo.check()


def attainment_at(rate, capacity, target, slope, rng, n=200, tau=0.3, kink=1.0):
    """A run's (met, counted) at `rate`: logit attainment falls linearly in log rate through `target` at
    `capacity` (`kink` x steeper above it, as a queue collapses), with run-to-run noise tau on the logit."""
    u = math.log(rate / capacity)
    logit = math.log(target / (1 - target)) - slope * u * (kink if u > 0 else 1.0) + rng.normal(0, tau)
    return int(rng.binomial(n, 1 / (1 + math.exp(-logit)))), n


def search(capacity, rng, *, start=1.0, target=0.9, slope=8.0, kink=1.0, **kw):
    s = RateSearch(start=start, target=target, **kw)
    while (step := s.next()) is not None:
        rate, stage = step
        s.tell(rate, *attainment_at(rate, capacity, target, slope, rng, kink=kink), stage)
    return s


def test_the_search_brackets_bisects_then_replicates_around_the_knee():
    s = search(13.0, np.random.default_rng(1), start=1.0, rel_tol=0.1, knee_rates=4, knee_replicates=2,
               knee_margin=0.1)
    stages = [r.stage for r in s.runs]
    assert s.status == FOUND
    assert stages[:5] == ["bracket"] * 5  # 1, 2, 4, 8 kept, 16 not
    assert set(stages[5:-8]) == {"bisect"} and stages[-8:] == ["knee"] * 8
    knee = [r.rate for r in s.knee_runs]
    assert knee[:4] == sorted(knee[:4]) and knee[4:8] == knee[:4][::-1]  # ascending, then descending
    assert knee[0] < 13.0 < knee[3] and s.high / s.low <= 1.1


def test_a_search_says_when_no_rate_or_every_rate_keeps_the_slo():
    never = search(1e-6, np.random.default_rng(2), start=1.0, min_rate=0.01)
    assert never.status == NEVER_MET and never.next() is None and never.best() is not None
    always = search(1e9, np.random.default_rng(3), start=1.0, max_rate=100)
    assert always.status == ALWAYS_MET and max(r.rate for r in always.runs) == 64


def test_the_knee_is_bracketed_by_rates_that_hold_and_fail_beyond_doubt():
    points = [(10.0, 198, 200), (10.0, 197, 200), (10.0, 199, 200),  # holds
              (11.0, 185, 200), (11.0, 178, 200), (11.0, 182, 200),  # ~0.91: unclear
              (12.0, 150, 200), (12.0, 120, 200), (12.0, 140, 200),  # fails
              (13.0, 20, 200), (13.0, 40, 200), (13.0, 10, 200)]  # fails
    knee = fit_knee(points, 0.9)
    assert [lv.verdict for lv in knee.levels] == ["holds", "unclear", "fails", "fails"]
    assert (knee.low, knee.high) == (10.0, 12.0) and 11.0 < knee.capacity_rps < 12.0


def test_a_rate_s_attainment_is_the_pooled_share_of_its_requests_and_the_estimate_reads_that_curve():
    """One estimand (#46): the share of all counted requests that met the SLO, pooled over a rate's runs: not
    the mean of the runs' shares, nor of their logits (which made a perfect run's worth depend on its count)."""
    knee = fit_knee([(5.0, 90, 100), (5.0, 10, 20), (6.0, 47, 47), (6.0, 470, 470)], 0.9)
    assert knee.levels[0].attainment == pytest.approx(100 / 120) and knee.levels[1].attainment == 1.0
    assert (knee.levels[0].met, knee.levels[0].counted) == (100, 120)
    points = [(6.7, 42, 47), (6.7, 43, 47), (8.4, 47, 47), (8.4, 46, 47), (10.5, 41, 47), (10.5, 38, 47)]
    knee = fit_knee(points, 0.9)  # 6.7 falls below 8.4: the two pool, and the crossing is between 8.4 and 10.5
    pooled, last = (42 + 43 + 47 + 46) / (4 * 47), (41 + 38) / (2 * 47)
    w = (pooled - 0.9) / (pooled - last)
    assert knee.capacity_rps == pytest.approx(math.exp(math.log(8.4) + w * math.log(10.5 / 8.4)))


def test_knee_runs_that_kept_the_slo_at_every_rate_place_the_capacity_above_them_even_unproven():
    """Two runs a rate where every request met the SLO: on one df none holds beyond doubt, yet the mean
    curve never falls to the target, so the capacity lies above the rates run (`above`), not below them."""
    points = [(r, n, n) for r, n in ((98.0, 79), (181.0, 145), (333.0, 273)) for _ in range(2)]
    knee = fit_knee(points, 0.9, alpha=0.025)
    assert (knee.capacity_rps, knee.low, knee.high) == (None, None, None)
    assert knee.above and not fit_knee([(r, 0, n) for r, _, n in points], 0.9).above


def test_a_flat_attainment_gives_no_bounded_interval():
    rng = np.random.default_rng(4)
    points = [(float(r), int(rng.binomial(100, 0.9)), 100) for r in (10, 11, 12, 13) * 3]
    knee = fit_knee(points, 0.9)
    assert knee.low is None or knee.high is None


N_SIM = 1000


@pytest.mark.calibration
@pytest.mark.parametrize("kink", [1.0, 3.0])
def test_the_capacity_interval_covers_the_true_capacity(kink):
    """The whole search (start 1 req/s, capacity drawn in 2-60 req/s), the interval from its 20 knee runs
    (5 rates x 4): it covers the true capacity in >= 95% of runs (less 3 Monte-Carlo standard errors), also
    when the attainment collapses 3x faster above the capacity than it falls below it; bounded on both sides
    in >= 90%, and its median width under 30% (measured: coverage 0.997-0.998, bounded 0.95-0.975, width
    25%)."""
    rng = np.random.default_rng(7)
    cover = bounded = 0
    widths = []
    for _ in range(N_SIM):
        capacity = float(np.exp(rng.uniform(math.log(2), math.log(60))))
        s = search(capacity, rng, kink=kink)
        knee = fit_knee([(r.rate, r.met, r.counted) for r in s.knee_runs], 0.9)
        if knee.low is not None and knee.high is not None:
            bounded += 1
            widths.append(knee.high / knee.low - 1)
        cover += (knee.low or 0) <= capacity <= (knee.high or math.inf)
    print(f"\ncapacity interval, kink {kink}: coverage {cover / N_SIM:.3f}, bounded {bounded / N_SIM:.3f}, "
          f"median width {100 * np.median(widths):.1f}%")
    assert cover / N_SIM >= 0.95 - 3 * math.sqrt(0.05 * 0.95 / N_SIM)
    assert bounded / N_SIM >= 0.9 and np.median(widths) < 0.3


@pytest.mark.calibration
def test_saturated_rates_beside_a_noisy_knee_do_not_lend_it_their_certainty():
    """A fixed grid of 7 rates x 3 runs: three rates where every request meets the SLO, three where none does
    (no spread at all), and one exactly at the target, noisy. Noise pooled over the rates called the middle
    one 'holds' or 'fails' in 22-29% of runs each (a statistician's review); each rate's own noise, at least
    the binomial's, keeps both under alpha/2 (plus 3 Monte-Carlo standard errors)."""
    rng = np.random.default_rng(9)
    holds = fails = 0
    for _ in range(N_SIM):
        points = [(float(r), 200, 200) for r in (1, 2, 3) for _ in range(3)]
        points += [(4.0, int(rng.binomial(200, 1 / (1 + math.exp(-(math.log(9) + rng.normal(0, 0.5)))))), 200)
                   for _ in range(3)]
        points += [(float(r), 0, 200) for r in (5, 6, 7) for _ in range(3)]
        verdict = fit_knee(points, 0.9).levels[3].verdict
        holds += verdict == "holds"
        fails += verdict == "fails"
    print(f"\nthe knee rate at the target beside saturated rates: holds {holds / N_SIM:.4f}, fails {fails / N_SIM:.4f}")
    slack = 3 * math.sqrt(0.025 * 0.975 / N_SIM)
    assert holds / N_SIM <= 0.025 + slack and fails / N_SIM <= 0.025 + slack


def mean_logit_holds(runs, target, alpha=0.05):
    """The rule #46 replaced, for comparison: a t test on the mean of the runs' empirical logits (+0.5 each)."""
    z = [math.log((m + 0.5) / (n - m + 0.5)) for m, n in runs]
    var = max(float(np.var(z, ddof=1)), float(np.mean([1 / (m + 0.5) + 1 / (n - m + 0.5) for m, n in runs])))
    half = t_quantile(1 - alpha / 2, len(runs) - 1) * math.sqrt(var / len(runs))
    return float(np.mean(z)) - half > math.log(target / (1 - target))


@pytest.mark.calibration
@pytest.mark.parametrize("share", [0.900, 0.904])
def test_four_of_the_fake_engines_runs_at_the_target_are_called_holds_less_often_than_by_mean_logits(share):
    """The fake engine's own runs around its knee (tests/unit/data/fake_knee_runs.json, made by
    benchmarks/fake_knee_runs.py: 240 arrival schedules at each of 3 rates), each run's met count moved so that
    the pooled share is `share`; four runs drawn at random, as the knee runs a rate. A rate at the target is
    called 'fails' at most alpha/2 = 0.025 of the time, and 'holds' less often than the mean of the runs'
    logits called it, though still above alpha/2: four skewed runs often miss the few a burst sank (the
    figures, and what steeper scales cost, are in docs/statistics.md). Plus 3 Monte-Carlo standard errors."""
    data = json.loads((Path(__file__).parent / "data" / "fake_knee_runs.json").read_text())["rates"]
    rng = np.random.default_rng(11)
    draws, holds, fails, before = 4000, 0, 0, 0
    for runs in data.values():
        met, counted = np.array(runs).T
        met = np.clip(met + np.round((share - met.sum() / counted.sum()) * counted), 0, counted).astype(int)
        for _ in range(draws):
            drawn = [(int(met[i]), int(counted[i])) for i in rng.integers(0, len(counted), 4)]
            verdict = fit_knee([(1.0, m, n) for m, n in drawn], 0.9).levels[0].verdict
            holds += verdict == "holds"
            fails += verdict == "fails"
            before += mean_logit_holds(drawn, 0.9)
    n = draws * len(data)
    print(f"\nthe fake engine's runs at a pooled share of {share}: holds {holds / n:.4f} (by mean logits "
          f"{before / n:.4f}), fails {fails / n:.4f} ({n} draws of 4 runs)")
    slack = 3 * math.sqrt(0.025 * 0.975 / n)
    assert holds < before and holds / n <= 2 * 0.025
    assert fails / n <= 0.025 + slack


def test_knee_runs_that_kept_the_slo_at_every_rate_give_a_capacity_of_at_least_the_highest():
    """A capacity above every knee rate is censored there, and mode=capacity says 'at least' as the goodput
    sweep does (it said 'did not cross: no capacity to report'); one below every knee rate says 'below'."""
    from throttle_sweep.capacity.report import sentences, summary
    from throttle_sweep.measurement.cost import Price

    slo = Slo(p95_ttft_s=1.0, attainment=0.9)
    search = RateSearch(start=1.0, target=0.9)
    kept = fit_knee([(r, 100, 100) for r in (2.0, 3.0, 4.0) for _ in range(4)], 0.9)
    result = summary(search, kept, [], slo, Price())
    assert result["capacity_rps"] == 4.0 and result["capacity_at_least"] is True
    said = " ".join(sentences({**result, "status": FOUND}, search, slo))
    assert "capacity: at least 4 req/s" in said and "did not cross" not in said
    broke = fit_knee([(r, 10, 100) for r in (2.0, 3.0, 4.0) for _ in range(4)], 0.9)
    result = summary(search, broke, [], slo, Price())
    assert result["capacity_rps"] is None and not result.get("capacity_at_least")
    said = " ".join(sentences(result, search, slo))
    assert "capacity: below 2 req/s" in said


def test_each_run_at_a_rate_draws_its_own_prompts_and_the_kth_run_shares_them_across_rates(tmp_path):
    """The k-th run at a rate draws its own prompts as well as its own arrivals (#46: every run repeated the
    same prompts, so the interval missed their variance); the k-th run at every rate draws the same ones, so
    rates differ in rate, not in what was asked."""
    from dataclasses import replace

    from tests.helpers import compose_cfg
    from throttle_sweep.measurement.workload import make_requests
    from throttle_sweep.settings.capacity import capacity_from
    from throttle_sweep.settings.sections import workload_from

    cfg = compose_cfg("mode=capacity", "backend=fake", "slo.p95_ttft_s=1", "workload.num_requests=40",
                      "workload.length_dist=uniform", tmp_path=tmp_path)
    settings = capacity_from(cfg, workload_from(cfg))

    def prompts(rate, k):
        return [r.prompt_token_ids or r.prompt_text for r in make_requests(replace(settings.spec, **settings.at(rate, k)))]

    assert prompts(4.0, 0) != prompts(4.0, 1)
    assert prompts(4.0, 1)[:40] == prompts(8.0, 1)[:40]
