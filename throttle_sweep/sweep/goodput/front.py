"""What serving a target rate costs against the latency users see: each confirmed configuration at the fewest
replicas that hold the rate and at a few more (each replica then carries less), its p95 latencies read from its
own runs at that per-replica rate, and the Pareto front of $/h against p95 latency: TTFT, or TPOT where the SLO
limits only that (a third axis kept points that were no choice: the baseline at its capacity, a TTFT beyond
the SLO's limit, on the front for a TPOT 0.2 ms lower). Pure: no I/O (tests/unit/test_goodput_front.py)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

EXTRA_REPLICAS = 2  # beyond the fewest that hold the rate: what more money buys in latency


@dataclass(frozen=True)
class FleetPoint:
    label: str
    params: dict[str, Any]
    replicas: int
    usd_per_hour: float
    per_replica_rps: float
    p95_ttft_s: float
    p95_tpot_s: float
    below_runs: bool  # the per-replica rate is below every rate it ran: its lowest rate's latencies (at most)


def latency_at(records: Sequence[Mapping[str, Any]], rate: float) -> tuple[float, float, bool] | None:
    """(p95 TTFT, p95 TPOT, below_runs) at `rate`, from usable runs: the median of each rate's runs,
    interpolated in log rate and log latency between the two measured rates around it; below every measured
    rate, the lowest's (latency does not rise as load falls); above every one, None (not measured)."""
    by_rate: dict[float, list[tuple[float, float]]] = {}
    for r in records:
        lat = r.get("latency_s") or {}
        ttft, tpot = (lat.get("ttft") or {}).get("p95"), (lat.get("tpot") or {}).get("p95")
        if ttft and tpot:
            by_rate.setdefault(float(r["workload"]["rate"]), []).append((ttft, tpot))
    if not by_rate:
        return None
    levels = [(x, statistics.median(t for t, _ in v), statistics.median(p for _, p in v))
              for x, v in sorted(by_rate.items())]
    if rate <= levels[0][0]:
        return levels[0][1], levels[0][2], rate < levels[0][0]
    for (a, ta, pa), (b, tb, pb) in zip(levels, levels[1:], strict=False):
        if a <= rate <= b:
            w = math.log(rate / a) / math.log(b / a)
            return math.exp(math.log(ta) + w * math.log(tb / ta)), math.exp(math.log(pa) + w * math.log(pb / pa)), False
    return None


def fleet_points(configs: Sequence[tuple[str, dict[str, Any], float | None, float, Sequence[Mapping[str, Any]]]],
                 target: float) -> list[FleetPoint]:
    """configs: (label, params, capacity estimate, $/h of one replica, its runs). Each at the fewest replicas
    its capacity needs for `target` and up to EXTRA_REPLICAS more, where its runs say what latency that is."""
    points = []
    for label, params, capacity, per_hour, records in configs:
        if not capacity:
            continue
        fewest = math.ceil(target / capacity - 1e-9)
        for n in range(fewest, fewest + EXTRA_REPLICAS + 1):
            found = latency_at(records, target / n)
            if found is not None:
                points.append(FleetPoint(label, params, n, n * per_hour, target / n, *found))
    return points


def pareto(points: Sequence[FleetPoint], latency: str = "ttft") -> list[FleetPoint]:
    """The points no other beats on cost and p95 `latency` (ttft | tpot) at once (no worse on both, better on
    one), cheapest first."""
    def key(p: FleetPoint) -> tuple[float, float]:
        return p.usd_per_hour, p.p95_ttft_s if latency == "ttft" else p.p95_tpot_s

    def beats(a: FleetPoint, b: FleetPoint) -> bool:
        return all(x <= y for x, y in zip(key(a), key(b), strict=True)) and key(a) != key(b)

    return sorted((p for p in points if not any(beats(q, p) for q in points)), key=key)
