"""The replicas a day of demand needs, from one replica's measured capacity: per bucket, the estimate
(ceil(demand / capacity)) and the count sure to keep the SLO (ceil(demand / the interval's lower bound), none
where the bound is open); the day's GPU-hours and dollars for each; and the peak's replicas held all day
against the plan that follows the demand (the price of not autoscaling). Pure: no I/O."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from throttle_sweep.replica_plan.demand import Bucket
from throttle_sweep.replica_plan.studied import Served


def replicas_for(rps: float, capacity: float | None) -> int | None:
    """Replicas that serve `rps` at `capacity` each; None where the capacity is unknown (an open bound)."""
    if not capacity:
        return None
    return math.ceil(rps / capacity - 1e-9) if rps > 0 else 0


@dataclass(frozen=True)
class Row:
    bucket: Bucket
    replicas: int  # at the capacity estimate
    sure: int | None  # at its lower bound: None where no rate held beyond doubt


@dataclass(frozen=True)
class Cost:
    """Replicas held over hours, in GPU-hours and dollars."""
    gpu_hours: float
    usd: float


@dataclass(frozen=True)
class DayPlan:
    served: Served
    rows: tuple[Row, ...]

    @property
    def hours(self) -> float:
        return sum(r.bucket.hours for r in self.rows)

    @property
    def mean_rps(self) -> float:
        """The demand's time-weighted mean: what the day's requests would need if they came evenly."""
        return sum(r.bucket.rps * r.bucket.hours for r in self.rows) / self.hours

    def cost(self, counts: Sequence[int | None]) -> Cost | None:
        """The replicas counted per bucket, held for its hours; None if a count is unknown."""
        if any(n is None for n in counts):
            return None
        gpu_hours = sum(n * self.served.gpus * r.bucket.hours for n, r in zip(counts, self.rows, strict=True))
        return Cost(gpu_hours, gpu_hours * self.served.usd_per_gpu_hour)

    def estimate(self) -> Cost:
        return self.cost([r.replicas for r in self.rows])  # type: ignore[return-value]  # never None

    def sure(self) -> Cost | None:
        return self.cost([r.sure for r in self.rows])

    def peak(self, sure: bool = False) -> int | None:
        counts = [r.sure if sure else r.replicas for r in self.rows]
        return None if any(n is None for n in counts) else max(counts)  # type: ignore[type-var]

    def held(self, sure: bool = False) -> Cost | None:
        """The peak's replicas held all day: a fleet that does not autoscale."""
        peak = self.peak(sure)
        return None if peak is None else self.cost([peak] * len(self.rows))

    def average_replicas(self) -> int:
        """The replicas the mean demand needs: too few at the peak, which is why the peak is provisioned."""
        return replicas_for(self.mean_rps, self.served.rate)  # type: ignore[return-value]


def plan_day(buckets: Sequence[Bucket], served: Served) -> DayPlan:
    return DayPlan(served, tuple(Row(b, replicas_for(b.rps, served.rate), replicas_for(b.rps, served.low))  # type: ignore[arg-type]
                                 for b in buckets))


def totals(plan: DayPlan) -> dict[str, Any]:
    """The day in numbers (plan.json): hours, demand, and for the estimate and the sure count the plan's and
    the peak-all-day fleet's GPU-hours and dollars."""
    out: dict[str, Any] = {"hours": plan.hours, "mean_rps": plan.mean_rps,
                           "peak_rps": max(r.bucket.rps for r in plan.rows),
                           "average_demand_replicas": plan.average_replicas()}
    for key, sure in (("estimate", False), ("sure", True)):
        cost, held = (plan.sure(), plan.held(True)) if sure else (plan.estimate(), plan.held())
        out[key] = None if cost is None or held is None else {
            "gpu_hours": cost.gpu_hours, "usd": cost.usd, "peak_replicas": plan.peak(sure),
            "peak_all_day": {"gpu_hours": held.gpu_hours, "usd": held.usd},
            "not_autoscaling_usd": held.usd - cost.usd}
    return out


def plan_json(plan: DayPlan, demand: str) -> dict[str, Any]:
    s = plan.served
    return {"demand": demand, "config": s.label, "params": s.params, "capacity_rps": s.rate,
            "capacity_at_least": s.at_least, "capacity_ci": [s.low, s.high], "gpus_per_replica": s.gpus,
            "usd_per_gpu_hour": s.usd_per_gpu_hour,
            "buckets": [{"start_s": r.bucket.start_s, "duration_s": r.bucket.duration_s, "requests_per_s": r.bucket.rps,
                         "replicas": r.replicas, "replicas_sure": r.sure} for r in plan.rows],
            "totals": totals(plan)}
