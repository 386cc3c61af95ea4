"""The goodput sweep's answer, from the configurations' confirmed capacities: the cost of each (per million
output tokens at capacity, and of the replicas a target rate needs), the winner, and the ones it cannot be
told from. Pure: no I/O (tests/unit/test_goodput_sweep.py)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from throttle_sweep.capacity.knee import Knee
from throttle_sweep.measurement.cost import Price, usd_per_mtok_at


@dataclass(frozen=True)
class Costed:
    """One configuration's confirmed capacity and what serving with it costs."""
    label: str  # "baseline" | "trial N"
    params: dict
    price: Price  # charged for its flags: every GPU one replica holds
    knee: Knee  # from its confirmation runs, two-sided at alpha / (family): what is shown, and the ties
    tokens: float  # output tokens per request
    attainment: float  # the SLO's share: goodput counts the requests that meet it
    claim: Knee | None = None  # the same runs one-sided at alpha / (family) a side: the claim against the baseline
    confidence: float = 0.95  # 1 - alpha (compare.alpha): the family's, which its intervals hold together at

    def usd_per_mtok(self, rate: float | None) -> float | None:
        """Per million output tokens of requests meeting the SLO, one replica serving `rate`."""
        return usd_per_mtok_at(self.price, rate * self.attainment * self.tokens) if rate else None

    @property
    def rate(self) -> float | None:
        """The capacity estimate; where the knee runs' pooled share kept the target at every rate, the
        highest of them (`at_least`): a configuration its confirmation places too low is kept, censored there,
        whether or not a rate held beyond doubt (its interval says that)."""
        return self.knee.capacity_rps if self.knee.capacity_rps is not None else self.knee.at_least

    @property
    def at_least(self) -> bool:
        return self.knee.capacity_rps is None and self.knee.at_least is not None

    @property
    def cost(self) -> float | None:
        return self.usd_per_mtok(self.rate)

    @property
    def cost_ci(self) -> tuple[float | None, float | None]:
        """More capacity, cheaper: the interval's ends swap (None: unbounded on that side)."""
        return self.usd_per_mtok(self.knee.high), self.usd_per_mtok(self.knee.low)

    def replicas(self, target: float, rate: float | None) -> int | None:
        return math.ceil(target / rate - 1e-9) if rate else None

    def fleet(self, target: float) -> dict[str, object]:
        """Replicas for the target rate at the estimate, across the interval, and those its lower bound needs
        (`replicas_sure`: the estimate is where attainment just meets the target, with no headroom; None when
        no rate held beyond doubt), with their GPUs and $/h."""
        need = self.replicas(target, self.rate)
        most, fewest = self.replicas(target, self.knee.low), self.replicas(target, self.knee.high)
        per_hour = self.price.usd_per_gpu_hour * self.price.gpus
        return {"target_rps": target, "replicas": need, "replicas_ci": [fewest, most],
                "gpus": need * self.price.gpus if need else None, "usd_per_hour": need * per_hour if need else None,
                "replicas_sure": most, "usd_per_hour_sure": most * per_hour if most else None}


def sort_key(c: Costed, target: float | None) -> tuple[float, float]:
    """Cheapest first: the replicas' $/h at the target rate (if one is given), then per token."""
    per_token = c.cost if c.cost is not None else math.inf
    if target is None:
        return (per_token, per_token)
    fleet = c.fleet(target)["usd_per_hour"]
    return (fleet if fleet is not None else math.inf, per_token)


def overlaps(a: Costed, b: Costed) -> bool:
    """Can the two costs not be told apart? Their intervals (each at the family's alpha) overlap. Intervals that
    only meet are apart: a cost's upper end is a rate that held (capacity at least that), its lower end one
    that failed (capacity below it), so where one's held rate is the other's failed rate, they differ."""
    a_low, a_high = a.cost_ci
    b_low, b_high = b.cost_ci
    return (a_low or 0.0) < (b_high or math.inf) and (b_low or 0.0) < (a_high or math.inf)


def cheaper_beyond_doubt(a: Costed, b: Costed) -> bool:
    """a's capacity above b's beyond doubt, per dollar: a's lower bound against b's upper, one-sided bounds
    (`claim`) where known. Across a family of m, a false claim needs one of m one-sided misses (the winner
    selected among the candidates' lower sides, the baseline's upper side), each at alpha / m. Bounds that meet
    decide too: a's lower bound is a rate that held (capacity at least that), b's upper one a rate that failed
    (capacity below it)."""
    a_low, b_high = (a.claim or a.knee).low, (b.claim or b.knee).high
    a_cost, b_cost = a.usd_per_mtok(a_low), b.usd_per_mtok(b_high)
    return a_cost is not None and b_cost is not None and a_cost <= b_cost


def pick(candidates: Sequence[Costed], target: float | None) -> tuple[Costed | None, list[Costed]]:
    """The winner (the cheapest estimate among confirmed capacities) and those whose cost intervals overlap
    its own: the confirmation's intervals hold together (Bonferroni over the family), so disjoint ones
    differ beyond doubt."""
    known = [c for c in candidates if c.cost is not None]
    if not known:
        return None, []
    best = min(known, key=lambda c: sort_key(c, target))
    return best, [c for c in known if c is not best and overlaps(best, c)]
