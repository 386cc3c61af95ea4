"""How sure the pick is: the share of draws from the confirmations' fits (a flat prior on each candidate's
log ratio) in which the winner is the cheapest confirmed candidate, and in which it is within the margin of
the cheapest. Candidates confirmed on one joint schedule are drawn together: their ratios share the
baseline's runs, so their difference is known better than either ratio."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from rich.console import Console
from scipy import stats as sps

from tests.helpers import compose_cfg
from tests.unit.test_decisions import confirmation
from tests.unit.test_joint_confirmation import confirmed, simulate_joint
from throttle_sweep.commands import sweep as sweep_cmd
from throttle_sweep.stats.schedule import joint_schedule
from throttle_sweep.stats.verdict import CHEAPER, Observation, Thresholds, fit_joint
from throttle_sweep.sweep.winner import how_sure


def test_a_clear_gap_is_certain_and_two_equal_estimates_are_a_coin():
    best, next_ = confirmation(1, 0.70, 0.68, 0.72, CHEAPER), confirmation(2, 0.80, 0.78, 0.82, CHEAPER)
    sure = how_sure(best, [best, next_], margin=0.02)
    assert sure.best > 0.999 and sure.within > 0.999 and sure.rivals == 1
    a, b = confirmation(3, 0.80, 0.78, 0.82, CHEAPER), confirmation(4, 0.80, 0.78, 0.82, CHEAPER)
    coin = how_sure(a, [a, b], margin=0.02)
    assert coin.best == pytest.approx(0.5, abs=0.02)
    # the two log ratios' difference has sd sqrt(2) x se; within 2% of the cheaper: P(|d| <= log 1.02) / 2 + 1/2
    se = a.analysis.estimate.se_log
    expect = 0.5 + 0.5 * (2 * sps.t.cdf(math.log(1.02) / (math.sqrt(2) * se), 5) - 1)
    assert coin.within == pytest.approx(expect, abs=0.03)


def test_rivals_that_broke_a_constraint_do_not_count_and_a_lone_winner_says_nothing():
    a = confirmation(1, 0.80, 0.78, 0.82, CHEAPER)
    broken = confirmation(2, 0.60, 0.58, 0.62, CHEAPER, broken=["preemptions: 4 > 0"])
    assert how_sure(a, [a, broken], margin=0.02) is None


def test_candidates_on_one_joint_schedule_are_drawn_with_the_covariance_of_their_fit():
    """Two equal-cost candidates on a joint schedule: the share of draws in which the first is cheaper is the
    t probability of their direct contrast in the one fit, not of two independent ratios (which counts the
    shared baseline's noise twice and pulls it toward one half)."""
    rng = np.random.default_rng(4)
    records = simulate_joint(joint_schedule(2, 4), [0.80, 0.79], rng=rng, noise_sd=0.02)
    a, b = confirmed(records, 0, Thresholds(alpha=0.025)), confirmed(records, 1, Thresholds(alpha=0.025))
    obs = [Observation("baseline" if r["trial"] is None else f"t{r['trial']}", r["position"], r["usd_per_mtok"])
           for r in records]
    diff, se, df = fit_joint(obs).contrast("t0", "t1")
    expect = sps.t.cdf(-diff / se, df)
    assert how_sure(a, [a, b], margin=0.0).best == pytest.approx(expect, abs=0.02)


def test_the_sweep_says_how_sure_its_pick_is_and_keeps_it_with_the_winner(tmp_path):
    args = ["backend=fake", "+space=batching", "space.max_num_seqs.low=2", "space.max_num_seqs.high=8",
            "study.n_trials=3", "compare.replicates=2", "study.confirm_replicates=4", "study.confirm_top=2",
            "study.boundary=none", "study.sequential=false", "study.name=j", "plots=false", "workload.num_requests=8",
            "workload.output_len=16", "workload.prompt_len=16", "fake.noise_sd=0.01"]
    console = Console(record=True, width=250)
    assert sweep_cmd.run(compose_cfg(*args, tmp_path=tmp_path), console) == 0
    printed = console.export_text()
    line = next(x for x in printed.splitlines() if x.startswith("how sure:"))
    assert "the cheapest of the 2 confirmed" in line and "within the 2% margin of the cheapest" in line
    best = json.loads((tmp_path / "j" / "best" / "best.json").read_text())
    assert 0.0 <= best["p_best"] <= best["p_within_margin"] <= 1.0
    assert f"{100 * best['p_best']:.0f}%" in line


def separate_confirmations(ratios, sd, rng):
    """Each candidate confirmed alone against the baseline: abba x4 under +27% linear drift."""
    from throttle_sweep.stats.analysis import Analysis
    from throttle_sweep.stats.schedule import make_schedule
    from throttle_sweep.stats.verdict import estimate
    from throttle_sweep.sweep.winner import Confirmation

    order, adjusted, out = make_schedule("abba", 4), Thresholds(alpha=0.05 / len(ratios)), []
    for n, ratio in enumerate(ratios):
        obs = [Observation(a, i, (1 + 0.27 * i / 7) * (ratio if a == "candidate" else 1.0) * math.exp(rng.normal(0, sd)))
               for i, a in enumerate(order)]
        plain, quoted = estimate(obs), estimate(obs, adjusted)
        out.append(Confirmation(n, {}, Analysis(plain.verdict, plain, [], {}),
                                adjusted=Analysis(quoted.verdict, quoted, [], {})))
    return out


def joint_confirmations(ratios, sd, rng, lead):
    """All confirmed on one joint schedule (a warm-up run first), under the same drift."""
    from throttle_sweep.stats.analysis import analyse_joint
    from throttle_sweep.sweep.winner import Confirmation

    k = len(ratios)
    records = simulate_joint(joint_schedule(k, 4, lead=lead), list(ratios), rng=rng, noise_sd=sd)
    plain, quoted = analyse_joint(records, Thresholds()), analyse_joint(records, Thresholds(alpha=0.05 / k))
    return [Confirmation(t, {}, plain[t], adjusted=quoted[t], family=k, shared=list(range(k))) for t in range(k)]


@pytest.mark.calibration
@pytest.mark.parametrize("design", ["separate", "joint"])
@pytest.mark.parametrize("ratios, sd", [((0.93, 0.94, 0.95), 0.01), ((0.93, 0.95, 0.97), 0.02),
                                        ((0.93, 0.935, 0.96), 0.01), ((0.9, 0.9, 0.9), 0.02)])
def test_how_sure_is_not_far_surer_than_the_pick_turns_out_to_be(design, ratios, sd):
    """Three confirmed candidates: the shares the report quotes, averaged over the runs that export a winner,
    against how often the winner truly is the cheapest and within the 2% margin of it. Flat-prior draws
    centred on the lowest estimate carry the winner's curse, so they can be too sure where a rival sits just
    beyond the margin (measured, 400 runs a cell: within-margin 0.92 quoted, 0.84 true; the cheapest 0.74
    quoted, 0.69 true); elsewhere they are too modest. Neither by more than 0.10 (plus 3 MC errors)."""
    from throttle_sweep.sweep.winner import choose_winner

    rng = np.random.default_rng(21)
    quoted_best = quoted_within = true_best = true_within = runs = 0
    for i in range(300):
        confs = separate_confirmations(ratios, sd, rng) if design == "separate" else joint_confirmations(
            ratios, sd, rng, i)
        winner, _ = choose_winner(confs)
        sure = how_sure(winner, confs, margin=0.02, draws=4000, seed=i) if winner is not None else None
        if sure is None:
            continue
        truth = ratios[winner.source_trial]
        runs += 1
        quoted_best, quoted_within = quoted_best + sure.best, quoted_within + sure.within
        true_best, true_within = true_best + (truth <= min(ratios)), true_within + (truth <= 1.02 * min(ratios))
    print(f"\nhow sure, {design} {ratios} at {100 * sd:g}% noise, {runs} winners: the cheapest quoted "
          f"{quoted_best / runs:.3f}, true {true_best / runs:.3f}; within the margin quoted {quoted_within / runs:.3f}, "
          f"true {true_within / runs:.3f}")
    slack = 0.10 + 3 * math.sqrt(0.25 / runs)
    assert runs >= 150
    assert quoted_best / runs - true_best / runs <= slack and quoted_within / runs - true_within / runs <= slack
