"""The least-squares model every comparison is judged on: log cost on [1, one indicator per candidate arm,
position]. Pure functions, no I/O; the verdicts built on it are in verdict.py."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from throttle_sweep.stats.schedule import BASELINE


@dataclass(frozen=True)
class Observation:
    arm: str
    position: float
    cost: float
    segment: int = 0  # which schedule ran it: a later one (a tie-break) gets its own level and drift


def fit(observations: Sequence[Observation]) -> tuple[np.ndarray, np.ndarray, int]:
    """Least squares of log cost on [1, candidate, position]: coefficients, their covariance, residual df (the
    joint fit of the two arms, which check_observations has made sure are baseline and candidate)."""
    joint = fit_joint(observations)
    return joint.coef, joint.cov, joint.df


@dataclass(frozen=True)
class JointFit:
    """log cost = a + sum_k d_k [arm k] + g * position over several arms at once (a joint schedule): the drift
    from all the runs. With one candidate, one residual variance (the balanced two-arm t). With several,
    each run is weighted by its own arm's residual variance (Welch-Satterthwaite df): one variance over all
    the runs lent a candidate 3x noisier than the rest the quiet arms' precision (coverage 0.88, 5-6% false
    verdicts a side), and a pretest of equal noise at 4 runs an arm caught only a third of such cases."""
    arms: tuple[str, ...]  # the arms other than the baseline, in the order of their coefficients
    coef: np.ndarray  # [a, d_1 .. d_K, g]
    cov: np.ndarray
    df: int
    unscaled: np.ndarray  # (X'X)^-1: the coefficients' covariance per unit of residual variance
    resid: np.ndarray  # the runs' residuals, in the order of the observations
    leverage: np.ndarray  # the hat matrix's diagonal: how much each run pulls the fit toward itself
    run_arms: tuple[str, ...]  # each run's arm, in the order of the observations
    weights: np.ndarray  # (X'X)^-1 X': each coefficient as a weighted sum of the runs

    @property
    def sigma2(self) -> float:
        """The residual variance (NaN with no residual df)."""
        return float(self.resid @ self.resid) / self.df if self.df > 0 else float("nan")

    def arm_noise(self) -> dict[str, tuple[float, float]]:
        """Each arm's residual variance and its share of the residual df (its runs less their leverage)."""
        out = {}
        for arm in dict.fromkeys(self.run_arms):
            mine = np.array([a == arm for a in self.run_arms])
            df = float(mine.sum() - self.leverage[mine].sum())
            out[arm] = (float(self.resid[mine] @ self.resid[mine]) / df if df > 0 else float("nan"), df)
        return out

    def spread(self, w: np.ndarray) -> tuple[float, float]:
        """The standard error of the coefficients' combination w, and its df: with one candidate, the residual
        variance's; with several, each run weighted by its own arm's variance, on the Satterthwaite df."""
        if self.df <= 0:
            return float("nan"), self.df
        if len(self.arms) < 2:
            return math.sqrt(max(float(w @ self.cov @ w), 0.0)), self.df
        a2 = (w @ self.weights) ** 2
        parts = [(v * float(a2[np.array([r == arm for r in self.run_arms])].sum()), df)
                 for arm, (v, df) in self.arm_noise().items() if df > 0]  # w @ self.welch_cov() @ w, by arm
        var = sum(p for p, _ in parts)
        spread = sum(p**2 / df for p, df in parts)
        return math.sqrt(var), round(max(1.0, var**2 / spread), 2) if spread > 0 else self.df

    def welch_cov(self) -> np.ndarray:
        """The coefficients' covariance with each run weighted by its own arm's residual variance (an arm with
        no residual df adds none), as `spread` weighs them; with one candidate, the residual variance's."""
        if len(self.arms) < 2:
            return self.cov
        noise = self.arm_noise()
        per_run = np.array([noise[arm][0] if noise[arm][1] > 0 else 0.0 for arm in self.run_arms])
        return (self.weights * per_run) @ self.weights.T

    def effect(self, arm: str) -> tuple[float, float, float]:
        """The arm's log ratio to the baseline, its standard error and df."""
        i = 1 + self.arms.index(arm)
        w = np.zeros(len(self.coef))
        w[i] = 1
        return (float(self.coef[i]), *self.spread(w))

    def contrast(self, a: str, b: str) -> tuple[float, float, float]:
        """log(a / b), its standard error and df (their shared baseline cancels)."""
        i, j = 1 + self.arms.index(a), 1 + self.arms.index(b)
        w = np.zeros(len(self.coef))
        w[i], w[j] = 1, -1
        return (float(self.coef[i] - self.coef[j]), *self.spread(w))


def fit_joint(observations: Sequence[Observation]) -> JointFit:
    """Least squares of log cost on [1, one indicator per arm other than the baseline, position]. Runs of a
    later schedule (segment > 0, a tie-break of candidates alone) add their schedule's own level and drift
    (columns after the first schedule's drift): they inform the arms' contrasts, not their ratio to the
    baseline, which the first schedule alone runs."""
    arms = tuple(sorted({o.arm for o in observations} - {BASELINE}))
    y = np.log([o.cost for o in observations])
    pos = np.array([o.position for o in observations], dtype=float)
    seg = np.array([o.segment for o in observations])
    drifts = []
    for k in sorted(set(seg.tolist())):
        mine = seg == k
        centred = np.where(mine, pos - pos[mine].mean(), 0.0)
        drifts += [centred] if k == seg.min() else [mine.astype(float), centred]
    x = np.column_stack([np.ones(len(y)), *([o.arm == arm for o in observations] for arm in arms), *drifts])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    df = len(y) - x.shape[1]
    resid = y - x @ coef
    sigma2 = float(resid @ resid) / df if df > 0 else float("nan")
    unscaled = np.linalg.inv(x.T @ x)
    weights = unscaled @ x.T
    leverage = np.einsum("ij,ji->i", x, weights)  # diag(X (X'X)^-1 X')
    return JointFit(arms, coef, sigma2 * unscaled, df, unscaled, resid, leverage,
                    tuple(o.arm for o in observations), weights)
