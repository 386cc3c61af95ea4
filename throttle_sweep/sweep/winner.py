"""The winner rule: which confirmed candidate a sweep exports, and which it cannot tell from it. Pure
functions of the confirmations' analyses, no I/O (tests/unit/test_decisions.py simulates the rule;
tests/unit/test_joint_confirmation.py the direct contrast of candidates confirmed together)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from throttle_sweep.errors import ThrottleSweepError
from throttle_sweep.stats.analysis import Analysis
from throttle_sweep.stats.fit import JointFit, Observation, fit_joint
from throttle_sweep.stats.schedule import BASELINE, CANDIDATE
from throttle_sweep.stats.verdict import CHEAPER, check_observations, clearly_lower, t_quantile


@dataclass
class Confirmation:
    source_trial: int
    params: dict[str, Any]
    analysis: Analysis
    adjusted: Analysis | None = None  # the same records with alpha / (number confirmed): Bonferroni
    broken: list[str] = field(default_factory=list)  # why it cannot win: constraints over the limit, a failure
    family: int = 1  # candidates confirmed together
    looks: int = 1  # looks its comparison was planned with (alpha / (family x looks) per look)
    stopped: str | None = None  # why it stopped before its planned end
    shared: list[int] | None = None  # the trials whose confirmation shared these baseline runs (joint schedule)

    @property
    def significant(self) -> bool:
        """CHEAPER by the quoted (Bonferroni-adjusted) interval itself: the label and the interval agree."""
        return (self.adjusted or self.analysis).verdict == CHEAPER


def arm_of(c: Confirmation) -> str:
    """A confirmed candidate's arm in a fit over several (and in a tie-break's observations)."""
    return f"trial-{c.source_trial}"


def joint_fit_of(group: Sequence[Confirmation], tiebreak: Sequence[Observation] = ()) -> JointFit | None:
    """One fit over the runs of candidates confirmed on one joint schedule, and the baseline's (arms named by
    their source trials), with a tie-break's runs of some of them (their own schedule, level and drift), or
    None when too few runs are left to fit."""
    first = group[0].analysis
    runs = {r["position"]: Observation(BASELINE, r["position"], first.cost_of(r)) for r in first.replicates(BASELINE)}
    for c in group:
        runs.update({r["position"]: Observation(arm_of(c), r["position"], c.analysis.cost_of(r))
                     for r in c.analysis.replicates(CANDIDATE)})
    mine = {arm_of(c) for c in group}
    observations = [*runs.values(), *(o for o in tiebreak if o.arm in mine)]
    with contextlib.suppress(ThrottleSweepError, ValueError, np.linalg.LinAlgError):
        check_observations(observations, [BASELINE, *mine])
        fitted = fit_joint(observations)
        if fitted.df > 0:
            return fitted
    return None


def cheaper_than(a: Confirmation, b: Confirmation, alpha: float) -> bool:
    """Is a cheaper than b beyond doubt? Two candidates confirmed on one joint schedule are contrasted
    directly, in one fit over their runs and the baseline's (every pair of arms is balanced): their ratios to
    the baseline share its runs' noise, which the contrast of two ratios would count twice, and the fit gets
    the df of all three arms' runs (simulated, 4% apart at 2% noise: told apart in 67% of runs by the
    contrast of ratios, 82% by a's runs against b's alone, 88% this way). Otherwise, the contrast of the two
    ratios to the baseline (clearly_lower)."""
    if a.shared and a.shared == b.shared and (fitted := joint_fit_of([a, b])) is not None:
        diff, se, df = fitted.contrast(arm_of(a), arm_of(b))
        return diff + t_quantile(1 - alpha / 2, df) * se < 0
    return clearly_lower(a.analysis.estimate, b.analysis.estimate, alpha)


def choose_winner(confirmations: Sequence[Confirmation], alpha: float = 0.05, tiebreak: Sequence[Observation] = ()
                  ) -> tuple[Confirmation | None, list[Confirmation]]:
    """The winner rule, and the candidates it could not tell the winner from. Eligible: confirmed savings
    (the adjusted interval below 1 - margin, a CHEAPER) that kept every constraint in confirmation too. The
    one with the lowest estimate wins; those a direct contrast cannot show it cheaper than are named as tied
    with it. Not the lowest upper bound: the estimated error varies about +-32% run to run at 5 df, so that
    rule lets noise decide among near-ties and systematically prefers quieter, pricier points
    (tests/unit/test_decisions.py: a 2% pricier point with half the noise was exported in 63% of runs that
    way, in 20% this way)."""
    eligible = [c for c in confirmations if c.significant and not c.broken]
    if not eligible:
        return None, []

    def est(c: Confirmation) -> Any:
        return c.analysis.estimate

    lowest = min(eligible, key=lambda c: est(c).ratio)
    tied = [c for c in eligible if c is not lowest and not cheaper_than(lowest, c, alpha)]
    if tiebreak and tied:
        return broken_tie([lowest, *tied], tiebreak, alpha) or (lowest, tied)
    return lowest, tied


def broken_tie(contenders: Sequence[Confirmation], tiebreak: Sequence[Observation], alpha: float
               ) -> tuple[Confirmation, list[Confirmation]] | None:
    """The winner and the ones still tied with it, ranked on one fit over the tie-break's runs and the joint
    confirmation's (None: they did not share one, or the runs do not fit). Each contender's claim against the
    baseline stays its confirmation's: a tie-break reorders confirmed savings, it makes none."""
    ran = {o.arm for o in tiebreak}
    if not (contenders[0].shared and all(c.shared == contenders[0].shared and arm_of(c) in ran
                                         for c in contenders)):
        return None
    fitted = joint_fit_of(contenders, tiebreak)
    if fitted is None:
        return None
    pick = min(contenders, key=lambda c: fitted.effect(arm_of(c))[0])

    def told_apart(c: Confirmation) -> bool:
        diff, se, df = fitted.contrast(arm_of(pick), arm_of(c))
        return diff + t_quantile(1 - alpha / 2, df) * se < 0

    return pick, [c for c in contenders if c is not pick and not told_apart(c)]


WINNER_RULE = ("winner rule: among confirmed savings (adjusted interval wholly below 1 - margin) that kept every "
               "constraint in confirmation too, the lowest estimate; those a direct contrast cannot show it cheaper "
               "than are named as tied with it")


@dataclass(frozen=True)
class Certainty:
    """How sure the pick is, from the confirmations' fits with a flat prior on each log ratio: the share of
    draws in which the winner is the cheapest of the candidates that kept every constraint, and in which it
    is within the margin of the cheapest (the question a deployment asks: is there a better one worth it?)."""
    best: float
    within: float
    rivals: int  # the other candidates it was drawn against
    margin: float


def how_sure(winner: Confirmation, confirmations: Sequence[Confirmation], margin: float, draws: int = 20_000,
             seed: int = 0, tiebreak: Sequence[Observation] = ()) -> Certainty | None:
    """None when the winner has no rival that kept every constraint, or a fit has no noise estimate.
    Candidates confirmed on one joint schedule are drawn together, from one fit's effects and covariance (their
    shared baseline runs make their difference surer than either ratio); others independently, each its t."""
    rivals = [c for c in confirmations if c is not winner and not c.broken and c.analysis.estimate is not None]
    if not rivals:
        return None
    groups: dict[tuple[int, ...], list[Confirmation]] = {}
    for c in (winner, *rivals):
        groups.setdefault(tuple(c.shared) if c.shared else (-1 - c.source_trial,), []).append(c)
    rng = np.random.default_rng(seed)
    drawn: dict[int, np.ndarray] = {}
    for group in groups.values():
        fitted = joint_fit_of(group, tiebreak) if len(group) > 1 else None
        if fitted is not None:
            arms = [arm_of(c) for c in group]
            mean, cov, df = effects(fitted, arms)
            if not (np.all(np.isfinite(cov)) and df > 0):
                return None
            z = rng.multivariate_normal(np.zeros(len(arms)), cov, size=draws, method="eigh")
            scale = np.sqrt(df / rng.chisquare(df, size=draws))[:, None]  # a multivariate t on the smallest df
            drawn.update({c.source_trial: column for c, column in zip(group, (mean + z * scale).T, strict=True)})
            continue
        for c in group:
            est = c.analysis.estimate
            if not (math.isfinite(est.se_log) and est.df > 0):
                return None
            drawn[c.source_trial] = math.log(est.ratio) + est.se_log * rng.standard_t(est.df, size=draws)
    mine = drawn.pop(winner.source_trial)
    cheapest_rival = np.min(np.vstack(list(drawn.values())), axis=0)
    return Certainty(best=float(np.mean(mine <= cheapest_rival)),
                     within=float(np.mean(mine <= np.minimum(mine, cheapest_rival) + math.log1p(margin))),
                     rivals=len(rivals), margin=margin)


def effects(fitted: JointFit, arms: Sequence[str]) -> tuple[np.ndarray, np.ndarray, float]:
    """The arms' log ratios, their covariance (each run weighted by its own arm's residual variance, as the
    fit's standard errors are) and the smallest of their df."""
    rows = [1 + fitted.arms.index(arm) for arm in arms]
    cov = fitted.welch_cov()[np.ix_(rows, rows)]
    return fitted.coef[rows], cov, min(fitted.effect(arm)[2] for arm in arms)
