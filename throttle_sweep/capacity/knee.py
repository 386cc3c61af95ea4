"""The capacity and its interval, from replicated runs at a few rates around the knee, assuming only that
attainment does not rise with the rate. A run is one observation (requests within a run share its queue, so
the run, not the request, carries the noise): its attainment's empirical logit. At each rate, a one-sided t
test on that rate's own runs says whether attainment is above the target (the SLO holds) or below it. The
lower bound is the highest rate of the run of rates, tested upward from the lowest, that all hold beyond
doubt; the upper bound the lowest of those, tested downward from the highest, that all fail beyond doubt.
Testing in a fixed order, each side errs with at most alpha/2 whatever the curve's shape (a line through the
knee was not: a queue collapses faster above its capacity than attainment falls below it, and one line over
the knee runs covered the capacity in 11% of simulated searches). The estimate interpolates the rates' mean
logits in log rate, made non-increasing first."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from throttle_sweep.stats import t_quantile


@dataclass(frozen=True)
class RateLevel:
    rate: float
    runs: int
    attainment: float  # the runs' mean share of requests that met the SLO
    logit: float  # the runs' mean empirical logit
    verdict: str  # holds | fails | unclear: beyond doubt, one-sided at alpha/2


@dataclass(frozen=True)
class Knee:
    capacity_rps: float | None  # where the mean logits cross the target (None: they do not, within the rates)
    low: float | None  # the interval; None: unbounded on that side within the rates run
    high: float | None
    levels: tuple[RateLevel, ...]
    above: bool = False  # the mean curve kept the target at every rate run: the capacity lies above them

    @property
    def at_least(self) -> float | None:
        """Where the capacity lies above every rate run, the highest of them: the estimate, censored there
        (beyond doubt or not: `low` says what is)."""
        return self.levels[-1].rate if self.above and self.levels else None


def empirical_logit(met: int, counted: int) -> float:
    return math.log((met + 0.5) / (counted - met + 0.5))


def binomial_variance(met: int, counted: int) -> float:
    """The variance of a run's empirical logit from its requests alone, were they independent."""
    return 1 / (met + 0.5) + 1 / (counted - met + 0.5)


def level(rate: float, runs: Sequence[tuple[int, int]], goal: float, alpha: float) -> RateLevel:
    """One rate's verdict from its own runs: their logits' variance, at least the binomial's (runs where every
    request, or none, met the SLO show no spread, yet say little more than their request count allows), on
    the rate's own df. Noise pooled over the rates let saturated rates lend a noisy knee rate their
    certainty: it was called holds or fails in 22-29% of runs each, where alpha/2 was claimed."""
    logits = [empirical_logit(m, n) for m, n in runs]
    mean = float(np.mean(logits))
    if len(runs) < 2:
        verdict = "unclear"
    else:
        var = max(float(np.var(logits, ddof=1)), float(np.mean([binomial_variance(m, n) for m, n in runs])))
        half = t_quantile(1 - alpha / 2, len(runs) - 1) * math.sqrt(var / len(runs))
        verdict = "holds" if mean - half > goal else "fails" if mean + half < goal else "unclear"
    return RateLevel(rate, len(runs), float(np.mean([m / n for m, n in runs])), mean, verdict)


def non_increasing(values: Sequence[float], weights: Sequence[float]) -> list[float]:
    """The closest non-increasing sequence (weighted least squares, pool-adjacent-violators): noise can
    make a higher rate's mean attainment exceed a lower one's, and the curve does not rise."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for v, w in zip(values, weights, strict=True):
        blocks.append([v, w, 1])
        while len(blocks) > 1 and blocks[-2][0] < blocks[-1][0]:
            (m1, w1, c1), (m2, w2, c2) = blocks.pop(-2), blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, c1 + c2])
    return [m for m, _, c in blocks for _ in range(int(c))]


def fit_knee(points: Sequence[tuple[float, int, int]], target: float, alpha: float = 0.05) -> Knee:
    """points: (rate, met, counted) per run; target: the SLO's attainment."""
    goal = math.log(target / (1 - target))
    rates = sorted({p[0] for p in points})
    levels = tuple(level(r, [(m, n) for x, m, n in points if x == r], goal, alpha) for r in rates)
    low = None
    for lv in levels:  # upward: every rate so far holds
        if lv.verdict != "holds":
            break
        low = lv.rate
    high = None
    for lv in reversed(levels):
        if lv.verdict != "fails":
            break
        high = lv.rate
    capacity = None
    curve = non_increasing([lv.logit for lv in levels], [lv.runs for lv in levels])
    for (a, za), (b, zb) in zip(zip(levels, curve, strict=True), zip(levels[1:], curve[1:], strict=True),
                                strict=False):
        if za >= goal >= zb and za > zb:
            w = (za - goal) / (za - zb)
            capacity = math.exp(math.log(a.rate) + w * (math.log(b.rate) - math.log(a.rate)))
            break
    if capacity is not None:  # the point estimate within its interval
        capacity = min(max(capacity, low or 0.0), high or math.inf)
    return Knee(capacity, low, high, levels, above=bool(curve) and curve[-1] > goal)
