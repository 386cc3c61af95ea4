"""Which arrival rate to run next, from what the runs so far said: a bracket (doubling or halving from the start
until one rate keeps the SLO and one does not), bisection in log rate with single runs until the two are
within `rel_tol`, then replicated runs at `knee_rates` rates spanning the bracket and `knee_margin` beyond it
on either side, in alternating order (ascending, then descending: with an even number of replicates, linear
drift lands on every rate alike). Only these knee runs enter the fit (knee.py). Deterministic: replaying the
recorded runs in order resumes it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

FOUND, NEVER_MET, ALWAYS_MET = "found", "never met", "always met"


@dataclass
class Run:
    rate: float
    met: int
    counted: int
    stage: str  # bracket | bisect | knee

    @property
    def attainment(self) -> float:
        return self.met / self.counted if self.counted else 0.0


@dataclass
class RateSearch:
    start: float
    target: float  # the SLO's attainment
    rel_tol: float = 0.1
    knee_rates: int = 5
    knee_replicates: int = 4
    knee_margin: float = 0.2  # the knee's rates reach this far beyond the bracket, each side
    min_rate: float = 1e-3
    max_rate: float = 1e4
    runs: list[Run] = field(default_factory=list)
    plan: list[float] | None = None  # the knee's rates, in run order, once the bracket is narrow

    def holds(self, run: Run) -> bool:
        return run.attainment >= self.target

    @property
    def low(self) -> float | None:
        """The highest rate a bracket or bisection run kept the SLO at, below every rate it failed at."""
        ok = [r.rate for r in self.runs if r.stage != "knee" and self.holds(r)]
        bad = [r.rate for r in self.runs if r.stage != "knee" and not self.holds(r)]
        below = [x for x in ok if not bad or x < min(bad)]
        return max(below) if below else None

    @property
    def high(self) -> float | None:
        bad = [r.rate for r in self.runs if r.stage != "knee" and not self.holds(r)]
        return min(bad) if bad else None

    @property
    def status(self) -> str | None:
        """FOUND, NEVER_MET (not even at min_rate), ALWAYS_MET (even at max_rate), or None while searching."""
        low, high = self.low, self.high
        if low is None and high is not None and high / 2 < self.min_rate:
            return NEVER_MET
        if high is None and low is not None and low * 2 > self.max_rate:
            return ALWAYS_MET
        if self.plan is not None and len(self.knee_runs) >= len(self.plan):
            return FOUND
        return None

    @property
    def knee_runs(self) -> list[Run]:
        return [r for r in self.runs if r.stage == "knee"]

    def next(self) -> tuple[float, str] | None:
        """The next rate to run and its stage, or None when the search is over."""
        if self.status is not None:
            return None
        if not self.runs:
            return self.start, "bracket"
        low, high = self.low, self.high
        if low is None:
            return high / 2, "bracket"
        if high is None:
            return low * 2, "bracket"
        if self.plan is None and high / low > 1 + self.rel_tol:
            return math.sqrt(low * high), "bisect"
        if self.plan is None:
            step = 1 + self.knee_margin
            grid = list(np.geomspace(low / step, high * step, self.knee_rates))
            self.plan = [x for rep in range(self.knee_replicates) for x in (grid if rep % 2 == 0 else grid[::-1])]
        return float(self.plan[len(self.knee_runs)]), "knee"

    def replicate_of(self, rate: float) -> int:
        """How many runs at this rate came before: the next one's replicate index (its arrival schedule)."""
        return sum(abs(r.rate - rate) <= 1e-9 * rate for r in self.runs)

    def tell(self, rate: float, met: int, counted: int, stage: str) -> None:
        self.runs.append(Run(rate, met, counted, stage))

    def best(self) -> Run | None:
        """The run with the highest attainment (the lowest rate among ties): what an SLO never met came to."""
        return max(self.runs, key=lambda r: (r.attainment, -r.rate), default=None)
