"""Where an open-loop run's steady state begins, and whether it has one, from the run's own requests.

A run starts with an empty queue, so its first requests wait less than they would in steady state: they are
not counted. How many is chosen per run by MSER-5 (White 1997): the requests' latencies, taken in arrival
order in batches of 5, are cut at the batch d (at most half of them) that minimises the variance of the
mean of what remains, sum((z_i - mean)^2) / (n - d)^2. A fixed share cannot be right for every rate and run
length: the warm-up is a time of the queue's, not a share of the run.

Below its capacity a queue at a fixed rate is stationary; above the rate it can sustain, it grows through
the run and every later request waits longer. That is a trend, not a warm-up: the trend test compares the
first and second halves of the counted requests (batch means, one-sided Welch t: the second half worse
beyond doubt), and counts only where the share that met the SLO fell with it. What a trend means for the
rate: `counted` and `undecided` below (docs/statistics.md).

The series is each request's latency against its limit, the worse of TTFT and TPOT (met when at most 1),
capped at CAP: a request far beyond its limit counts as missed whatever its size, and the cap keeps one
such request from ruling the variance MSER minimises. A request that never finished reads CAP."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from throttle_sweep.capacity.slo import Slo
from throttle_sweep.stats.verdict import t_quantile

BATCH = 5  # MSER-5's batch of requests
CAP = 2.0  # latency over its limit, capped here
TREND_BATCHES = 5  # batch means per half for the trend test
TREND_ALPHA = 0.01  # one-sided: a trend found by chance lengthens or sinks a run, so it must be rare


def mser(series: Sequence[float], batch: int = BATCH) -> int:
    """How many leading values to drop (a multiple of `batch`, at most half the series): MSER-`batch`."""
    n = len(series) // batch
    if n < 4:
        return 0
    z = np.asarray(series[: n * batch], dtype=float).reshape(n, batch).mean(axis=1)
    best, cut = math.inf, 0
    for d in range(n // 2 + 1):
        rest = z[d:]
        if d and z[:d].mean() > rest.mean():  # worse than what follows: a burst, not the empty queue's start
            continue
        score = float(((rest - rest.mean()) ** 2).sum()) / len(rest) ** 2
        if score < best - 1e-15:  # the earliest of equal scores: drop no more than the data ask
            best, cut = score, d
    return cut * batch


@dataclass(frozen=True)
class Trend:
    first: float  # the halves' means
    second: float
    t: float  # Welch's t of second - first on the halves' batch means
    df: float
    fires: bool  # the second half worse beyond doubt, one-sided at TREND_ALPHA


def trend(series: Sequence[float], batches: int = TREND_BATCHES, alpha: float = TREND_ALPHA) -> Trend:
    """Whether the second half of `series` is higher than the first beyond doubt: each half cut into
    `batches` batch means in order (requests near each other share the queue; batches far apart less so)."""
    half = len(series) // 2
    a, b = np.asarray(series[:half], dtype=float), np.asarray(series[len(series) - half:], dtype=float)
    if half < 2 * batches:
        return Trend(float(a.mean()) if half else 0.0, float(b.mean()) if half else 0.0, 0.0, 0.0, False)
    ma, mb = (np.array([c.mean() for c in np.array_split(x, batches)]) for x in (a, b))
    va, vb = ma.var(ddof=1) / batches, mb.var(ddof=1) / batches
    diff = float(mb.mean() - ma.mean())
    if va + vb <= 0:
        return Trend(float(a.mean()), float(b.mean()), math.inf if diff > 0 else 0.0, 2.0 * (batches - 1), diff > 0)
    df = (va + vb) ** 2 / (va ** 2 / (batches - 1) + vb ** 2 / (batches - 1)) if va and vb else batches - 1.0
    t = diff / math.sqrt(va + vb)
    return Trend(float(a.mean()), float(b.mean()), t, df, t > t_quantile(1 - alpha, df))


def slack(row: Sequence[Any], slo: Slo) -> float:
    """One request's latency over its limit, the worse of the two, capped at CAP (CAP: never finished)."""
    ttft, tpot = row[1], row[2]
    if ttft is None:
        return CAP
    worst = max(ttft / slo.p95_ttft_s if slo.p95_ttft_s else 0.0,
                tpot / slo.p95_tpot_s if slo.p95_tpot_s and tpot is not None else 0.0)
    return min(worst, CAP)


@dataclass(frozen=True)
class Steady:
    """One run read for its steady state: its warm-up, the trend test, and (met, counted) of each half."""
    warmup: int  # requests dropped, in arrival order
    warmup_s: float  # the first counted request's arrival offset: the warm-up in seconds
    met: int
    counted: int
    trend: Trend
    second_met: int  # the second half of the counted requests
    second_counted: int

    @property
    def trending(self) -> bool:
        """Latency grew through the run beyond doubt, and the share that met the SLO fell with it: a rise
        far within the limits (seen on the real engine: TTFT from 1.9% to 2.2% of its limit) is no trend of
        the SLO's."""
        first_met, first_counted = self.met - self.second_met, self.counted - self.second_counted
        return self.trend.fires and self.second_met * first_counted < first_met * self.second_counted


def steady_state(record: Mapping[str, Any], slo: Slo) -> Steady | None:
    """The run's steady state: MSER-5 on its requests' slack by arrival order, then the trend test on what
    remains. None when the record keeps no per-request latencies (a failed run, or an older version)."""
    rows = sorted(record.get("requests_s") or [], key=lambda row: row[0])
    if not rows:
        return None
    series = [slack(row, slo) for row in rows]
    cut = mser(series)
    counted, rest = rows[cut:], series[cut:]
    met = [slo.met(row[1], row[2]) for row in counted]
    second = met[len(met) - len(met) // 2:]
    return Steady(cut, float(counted[0][0]), sum(met), len(met), trend(rest), sum(second), len(second))


SECOND_HALF = "second half"  # how a run was counted: its later half, the state its queue went to


def counted(record: Mapping[str, Any], slo: Slo) -> tuple[int, int, Steady] | None:
    """(met, counted, the reading) of a run: its requests after the warm-up, or, where the trend test fired
    and the rate fails anyway or the run was already lengthened once, its second half (docs/statistics.md)."""
    s = steady_state(record, slo)
    if s is None:
        return None
    if s.trending and (s.met < slo.attainment * s.counted or record.get("lengthened")
                          or not lengthenable(record)):
        return s.second_met, s.second_counted, s
    return s.met, s.counted, s


def lengthenable(record: Mapping[str, Any]) -> bool:
    return (record.get("workload") or {}).get("trace") is None  # a trace's window is what it is


def undecided(record: Mapping[str, Any], slo: Slo) -> str | None:
    """Why a run must be run again twice as long, or None: the trend test fired, yet the run as a whole kept
    the SLO, so whether the rate holds depends on how long the run was."""
    s = steady_state(record, slo)
    if s is None or not s.trending or record.get("lengthened") or not lengthenable(record):
        return None
    if s.met < slo.attainment * s.counted:
        return None
    return (f"latency grew through the run (second half {s.trend.second:.2f} of the limit against "
            f"{s.trend.first:.2f}, t = {s.trend.t:.1f}), yet it kept the SLO as a whole ({s.met}/{s.counted}): "
            "whether the rate holds depends on the run's length, so it runs again twice as long")


def summary_of(readings: Sequence[tuple[Mapping[str, Any], Steady]]) -> dict[str, Any]:
    """What the runs' warm-ups and trends were, for summary.json and the capacity line."""
    warm = [s.warmup_s for _, s in readings]
    return {"warmup_s": [min(warm), max(warm)] if warm else None,
            "trend_runs": sum(s.trending for _, s in readings),
            "lengthened_runs": sum(bool(r.get("lengthened")) for r, _ in readings)}
