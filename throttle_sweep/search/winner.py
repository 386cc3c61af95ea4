"""The winner rule: which confirmed candidate a sweep exports, and which it cannot tell from it. Pure
functions of the confirmations' analyses, no I/O (tests/unit/test_decisions.py simulates the rule;
tests/unit/test_joint_confirmation.py the direct contrast of candidates confirmed together)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from throttle_sweep.analysis import Analysis
from throttle_sweep.errors import ThrottleSweepError
from throttle_sweep.schedule import BASELINE, CANDIDATE
from throttle_sweep.stats import CHEAPER, Observation, check_observations, clearly_lower, fit_joint, t_quantile


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


def cheaper_than(a: Confirmation, b: Confirmation, alpha: float) -> bool:
    """Is a cheaper than b beyond doubt? Two candidates confirmed on one joint schedule are contrasted
    directly, in one fit over their runs and the baseline's (every pair of arms is balanced): their ratios to
    the baseline share its runs' noise, which the contrast of two ratios would count twice, and the fit gets
    the df of all three arms' runs (simulated, 4% apart at 2% noise: told apart in 67% of runs by the
    contrast of ratios, 82% by a's runs against b's alone, 88% this way). Otherwise, the contrast of the two
    ratios to the baseline (clearly_lower)."""
    if a.shared and a.shared == b.shared:
        runs = {r["position"]: Observation(BASELINE, r["position"], a.analysis.cost_of(r))
                for r in a.analysis.replicates(BASELINE)}
        for c, arm in ((a, "a"), (b, "b")):
            runs.update({r["position"]: Observation(arm, r["position"], c.analysis.cost_of(r))
                         for r in c.analysis.replicates(CANDIDATE)})
        with contextlib.suppress(ThrottleSweepError, ValueError, np.linalg.LinAlgError):  # too few runs left
            check_observations(list(runs.values()), [BASELINE, "a", "b"])
            fitted = fit_joint(list(runs.values()))
            if fitted.df > 0:
                diff, se, df = fitted.contrast("a", "b")
                return diff + t_quantile(1 - alpha / 2, df) * se < 0
    return clearly_lower(a.analysis.estimate, b.analysis.estimate, alpha)


def choose_winner(confirmations: Sequence[Confirmation], alpha: float = 0.05
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
    return lowest, [c for c in eligible if c is not lowest and not cheaper_than(lowest, c, alpha)]


WINNER_RULE = ("winner rule: among confirmed savings (adjusted interval wholly below 1 - margin) that kept every "
               "constraint in confirmation too, the lowest estimate; those a direct contrast cannot show it cheaper "
               "than are named as tied with it")
