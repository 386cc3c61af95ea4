"""The Pareto front of a goodput sweep at its target rate (#26 item 4): $/h of the replicas against the p95
latencies their runs show at the per-replica rate."""

from __future__ import annotations

import pytest

from throttle_sweep.sweep.goodput.front import FleetPoint, fleet_points, latency_at, pareto


def run(rate, ttft, tpot):
    return {"workload": {"rate": rate}, "latency_s": {"ttft": {"p95": ttft}, "tpot": {"p95": tpot}}}


def test_latency_is_read_between_the_measured_rates_in_log_scale_and_never_beyond_them():
    runs = [run(10, 0.01, 0.001), run(10, 0.03, 0.003), run(10, 0.02, 0.002), run(40, 0.32, 0.008)]
    assert latency_at(runs, 10) == (0.02, 0.002, False)  # the median of the rate's runs
    ttft, tpot, below = latency_at(runs, 20)  # halfway in log rate: the geometric mean
    assert ttft == pytest.approx((0.02 * 0.32) ** 0.5) and tpot == pytest.approx((0.002 * 0.008) ** 0.5)
    assert not below
    assert latency_at(runs, 5) == (0.02, 0.002, True)  # below every rate run: the lowest's, flagged
    assert latency_at(runs, 41) is None and latency_at([], 5) is None


def test_more_replicas_buy_lower_latency_and_the_front_keeps_only_what_nothing_beats():
    # a: capacity 30 at $1/h, latency rising with load; b: capacity 25 at $3/h, slower at every load
    a = [run(r, 0.001 * r, 0.0001 * r) for r in (5, 10, 20, 30, 40)]
    b = [run(r, 0.002 * r, 0.0002 * r) for r in (5, 10, 20, 25, 40)]
    points = fleet_points([("a", {"x": 1}, 30.0, 1.0, a), ("b", {"x": 2}, 25.0, 3.0, b),
                           ("never", {}, None, 1.0, a)], target=50)
    got = {(p.label, p.replicas): p for p in points}
    assert set(got) == {("a", 2), ("a", 3), ("a", 4), ("b", 2), ("b", 3), ("b", 4)}
    assert got[("a", 2)].usd_per_hour == 2.0 and got[("a", 2)].per_replica_rps == 25
    assert got[("a", 2)].p95_ttft_s > got[("a", 3)].p95_ttft_s > got[("a", 4)].p95_ttft_s
    front = pareto(points)
    assert [(p.label, p.replicas) for p in front] == [("a", 2), ("a", 3), ("a", 4)]  # b costs more and is slower
    assert all(isinstance(p, FleetPoint) for p in front)


def test_the_front_is_cost_against_the_latency_the_slo_limits():
    """TTFT when the SLO limits it: a point dearer and slower to first token is off the front, however low its
    TPOT (a real run put the baseline at its capacity, TTFT 747 ms against the winner's 7, on a three-axis front
    for a TPOT 0.2 ms lower); TPOT when the SLO limits only that."""
    cheap = FleetPoint("a", {}, 1, 1.0, 10, 0.10, 0.010, False)
    quick = FleetPoint("b", {}, 2, 2.0, 5, 0.05, 0.012, False)
    smooth = FleetPoint("c", {}, 2, 2.0, 5, 0.20, 0.005, False)
    assert pareto([smooth, quick, cheap]) == [cheap, quick]
    assert pareto([smooth, quick, cheap], latency="tpot") == [cheap, smooth]
