"""The capacity and its interval, from replicated runs at a few rates around the knee, assuming only that
attainment does not rise with the rate. One estimand everywhere: a rate's attainment is the pooled share of
its runs' counted requests that met the SLO (DistServe's goodput: the share of all requests, not a mean of
runs' shares or of their logits). A run is the unit of variance (requests within a run share its queue, so the
run, not the request, carries the noise): the share's standard error is the ratio estimator's, from how far
each run's met count lies from the pooled share times its count. At each rate, a one-sided t test on that
rate's own runs says whether the share is above the target (the SLO holds) or below it. It is taken on the
log of the share of requests that missed, not on the share itself: runs' shares are skewed (most near the
top, a few that a burst of arrivals sank), and a t test of the share on a handful of such runs says 'holds'
too often near the target; the log corrects part of that. Far below the allowance the log's slope is capped
(at a third of the allowed misses): there a rate whose few misses fell in one run would otherwise never hold
(docs/statistics.md). Its variance is at least the binomial's at the target. The
lower bound is the highest rate of the run of rates, tested upward from the lowest, that all hold beyond
doubt; the upper bound the lowest of those, tested downward from the highest, that all fail beyond doubt.
Testing in a fixed order, each side errs with at most alpha/2 whatever the curve's shape (a line through the
knee was not: a queue collapses faster above its capacity than attainment falls below it). The estimate
interpolates the rates' pooled shares in log rate, made non-increasing first."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from throttle_sweep.stats.verdict import t_quantile


@dataclass(frozen=True)
class RateLevel:
    rate: float
    runs: int
    attainment: float  # the pooled share: requests that met the SLO over requests counted, all runs together
    verdict: str  # holds | fails | unclear: beyond doubt, one-sided at alpha/2
    met: int = 0
    counted: int = 0
    se: float = 0.0  # the share's standard error, runs as the unit (0 with one run: unknown)


@dataclass(frozen=True)
class Knee:
    capacity_rps: float | None  # where the pooled shares cross the target (None: they do not, within the rates)
    low: float | None  # the interval; None: unbounded on that side within the rates run
    high: float | None
    levels: tuple[RateLevel, ...]
    above: bool = False  # the curve kept the target at every rate run: the capacity lies above them

    @property
    def at_least(self) -> float | None:
        """Where the capacity lies above every rate run, the highest of them: the estimate, censored there
        (beyond doubt or not: `low` says what is)."""
        return self.levels[-1].rate if self.above and self.levels else None


def pooled_share(runs: Sequence[tuple[int, int]]) -> tuple[float, float]:
    """(share, its standard error) of (met, counted) runs: all met over all counted, and the ratio estimator's
    variance with the run as the unit, sum((met_i - share * counted_i)^2) / (k (k - 1) mean(counted)^2)
    (0 for a single run)."""
    met, counted, k = sum(m for m, _ in runs), sum(n for _, n in runs), len(runs)
    share = met / counted
    if k < 2:
        return share, 0.0
    spread = sum((m - share * n) ** 2 for m, n in runs)
    return share, math.sqrt(spread / (k * (k - 1) * (counted / k) ** 2))


SLOPE_FLOOR = 1 / 3  # the log's slope is taken at no fewer missed than this share of the allowed


def verdict(runs: Sequence[tuple[int, int]], target: float, alpha: float) -> str:
    """holds | fails | unclear: the pooled share above or below `target` beyond doubt, one-sided at alpha/2
    on the runs' k - 1 df, on the log of the share that missed (no misses read as half a miss over all
    counted), by the delta method with its slope capped at SLOPE_FLOOR of the allowed share; its variance at
    least the binomial's at the target (runs where every request, or none, met the SLO show no spread, yet say
    no more than their request count allows)."""
    if len(runs) < 2:
        return "unclear"
    share, se = pooled_share(runs)
    counted = sum(n for _, n in runs)
    missed, allowed = max(1 - share, 0.5 / counted), 1 - target
    var = max((se / max(missed, SLOPE_FLOOR * allowed)) ** 2, target / (allowed * counted))
    margin = math.log(allowed / missed)  # > 0: fewer missed than the SLO allows
    half = t_quantile(1 - alpha / 2, len(runs) - 1) * math.sqrt(var)
    return "holds" if margin > half else "fails" if margin < -half else "unclear"


def level(rate: float, runs: Sequence[tuple[int, int]], target: float, alpha: float) -> RateLevel:
    """One rate's pooled share and verdict from its own runs: noise pooled over the rates would let saturated
    rates (no spread at all) lend a noisy knee rate their certainty."""
    share, se = pooled_share(runs)
    return RateLevel(rate, len(runs), share, verdict(runs, target, alpha), sum(m for m, _ in runs),
                     sum(n for _, n in runs), se)


def non_increasing(values: Sequence[float], weights: Sequence[float]) -> list[float]:
    """The closest non-increasing sequence (weighted least squares, pool-adjacent-violators): noise can
    make a higher rate's share exceed a lower one's, and the curve does not rise."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for v, w in zip(values, weights, strict=True):
        blocks.append([v, w, 1])
        while len(blocks) > 1 and blocks[-2][0] < blocks[-1][0]:
            (m1, w1, c1), (m2, w2, c2) = blocks.pop(-2), blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, c1 + c2])
    return [m for m, _, c in blocks for _ in range(int(c))]


def fit_knee(points: Sequence[tuple[float, int, int]], target: float, alpha: float = 0.05) -> Knee:
    """points: (rate, met, counted) per run; target: the SLO's attainment."""
    rates = sorted({p[0] for p in points})
    levels = tuple(level(r, [(m, n) for x, m, n in points if x == r], target, alpha) for r in rates)
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
    # weighted by requests counted: pooling two rates pools their requests, as the share does
    curve = non_increasing([lv.attainment for lv in levels], [lv.counted for lv in levels])
    for (a, za), (b, zb) in zip(zip(levels, curve, strict=True), zip(levels[1:], curve[1:], strict=True),
                                strict=False):
        if za >= target >= zb and za > zb:
            w = (za - target) / (za - zb)
            capacity = math.exp(math.log(a.rate) + w * (math.log(b.rate) - math.log(a.rate)))
            break
    if capacity is not None:  # the point estimate within its interval
        capacity = min(max(capacity, low or 0.0), high or math.inf)
    return Knee(capacity, low, high, levels, above=bool(curve) and curve[-1] > target)
