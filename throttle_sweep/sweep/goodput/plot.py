"""The goodput sweep's pictures (plots=true), one colour per configuration in all three:
- attainment_vs_rate.png: where each configuration breaks: the share of its requests meeting the SLO
  against the arrival rate one replica serves, the SLO's share drawn, and each capacity a point on it (a star
  with its interval where confirmed, a diamond for the screen's estimate); the legend says each one's cost
  per million output tokens at capacity.
- latency_vs_rate.png: p95 TTFT and p95 TPOT against the rate, a line per configuration (the median over its
  runs at each rate), the SLO's limits and each capacity drawn across. The limits bind each request, a share
  of which must meet them: the p95 lines are not held to them, they show how far the tail sits.
- pareto.png: output tokens/s per GPU against per user, every run, the front of the runs that kept the SLO,
  the winner's run at its highest throughput that kept it (pareto.py)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from throttle_sweep.capacity.runs import met_of
from throttle_sweep.report import figures, pareto
from throttle_sweep.settings.capacity import CapacitySettings
from throttle_sweep.sweep.goodput.driver import Contender
from throttle_sweep.sweep.goodput.pick import Costed

RATE = "arrival rate one replica serves (requests/s, log scale)"


@dataclass(frozen=True)
class Series:
    """One configuration as the pictures draw it."""
    config: str  # its name in the records ("baseline", "trial N")
    label: str  # as the legend says it (with its GPU type, where types are swept)
    colour: str
    records: list[dict[str, Any]]  # its usable runs, screen and confirmation
    capacity: float | None  # the confirmed capacity where it was confirmed, else the screen's estimate
    confirmed: bool
    interval: tuple[float | None, float | None] = (None, None)
    usd_per_mtok: float | None = None  # at the confirmed capacity

    def legend(self) -> str:
        if self.capacity is None:
            return f"{self.label}: no capacity"
        if not self.confirmed:
            return f"{self.label}: ~{self.capacity:.3g} req/s (screen)"
        cost = f", ${self.usd_per_mtok:.3g}/M" if self.usd_per_mtok is not None else ""
        return f"{self.label}: {self.capacity:.3g} req/s{cost}"


def series_of(contenders: Sequence[Contender], costed: Sequence[Costed]) -> list[Series]:
    known = {c.label: c for c in costed}
    out = []
    for i, c in enumerate(x for x in contenders if x.records and not x.failed):
        k = known.get(c.label)
        label = c.label + (f" on {c.gpu_type}" if c.gpu_type else "")
        if k is not None:
            out.append(Series(c.label, label, figures.colour(i), c.records, k.rate, True, (k.knee.low, k.knee.high),
                              k.cost))
        else:
            out.append(Series(c.label, label, figures.colour(i), c.records, c.screen_rate(), False))
    return out


def by_rate(records: Sequence[dict[str, Any]]) -> dict[float, list[dict[str, Any]]]:
    out: dict[float, list[dict[str, Any]]] = {}
    for r in sorted(records, key=lambda r: r["workload"]["rate"]):
        out.setdefault(r["workload"]["rate"], []).append(r)
    return out


PICTURES = ("attainment_vs_rate.png", "latency_vs_rate.png", "pareto.png")  # what draw writes, in its order


def draw(out: Path, contenders: Sequence[Contender], costed: Sequence[Costed], winner: str | None,
         settings: CapacitySettings) -> list[str]:
    """Write the three pictures; a line for each, saying where it is and what it shows."""
    plt, lines = figures.pyplot(), series_of(contenders, costed)
    fig, ax = plt.subplots(figsize=(8, 5), constrained_layout=True)
    draw_attainment(ax, lines, winner, settings)
    figures.save(fig, out / "attainment_vs_rate.png")
    fig, axes = plt.subplots(2, 1, sharex=True, figsize=(8, 7), constrained_layout=True)
    draw_latency(axes, lines, settings)
    figures.save(fig, out / "latency_vs_rate.png")
    fig, ax = plt.subplots(figsize=(8, 5), constrained_layout=True)
    draw_pareto(ax, lines, winner, settings)
    figures.save(fig, out / "pareto.png")
    return [f"{out / 'attainment_vs_rate.png'} (where each configuration breaks the SLO, capacities marked)",
            f"{out / 'latency_vs_rate.png'} (p95 TTFT and TPOT against rate, the SLO's limits, capacities)",
            f"{out / 'pareto.png'} (tokens/s per GPU against per user, the front, the winner)"]


def attainment(records: Sequence[dict[str, Any]], settings: CapacitySettings) -> float:
    """The share of the runs' counted requests that met the SLO, pooled."""
    met, n = (sum(x) for x in zip(*(met_of(r, settings) for r in records), strict=True))
    return met / n if n else 0.0


def draw_attainment(ax: Any, lines: Sequence[Series], winner: str | None, settings: CapacitySettings) -> None:
    share = settings.slo.attainment
    ax.axhline(share, color="grey", linestyle="--", linewidth=1, label=f"the SLO's share: {share:.0%} of requests")
    bars = 0  # the confirmed intervals, each a bar of its own below the share's line
    for s in lines:
        runs = by_rate(s.records)
        ax.plot(list(runs), [attainment(rs, settings) for rs in runs.values()], color=s.colour, linewidth=1,
                marker="o", markersize=3, label=s.legend())
        if s.capacity is None:
            continue
        if s.confirmed:  # an open end of its interval is drawn to its estimate
            low, high = s.interval
            bars += 1
            ax.errorbar([s.capacity], [share - 0.025 * bars], color=s.colour, linewidth=1.5, capsize=3,
                        xerr=[[s.capacity - (low or s.capacity)], [(high or s.capacity) - s.capacity]])
        ax.scatter([s.capacity], [share], marker="*" if s.confirmed else "D", s=240 if s.confirmed else 40,
                   color=s.colour, edgecolors="black", zorder=5, gid=f"capacity {s.config}",
                   label=f"winner {s.label}" if s.config == winner else f"_capacity {s.label}")
    ax.set_xscale("log")
    figures.plain_log(ax.xaxis)
    ax.set_ylim(-0.02, 1.05)
    ax.set_xlabel(RATE)
    ax.set_ylabel("share of requests meeting the SLO (pooled per rate)")
    ax.set_title("where each configuration breaks: star, its confirmed capacity (bar below: its 95% interval); "
                 f"diamond, the screen's estimate\n(SLO: {settings.slo.words()}; legend: capacity, $ per million "
                 "output tokens there)", fontsize=8)
    ax.legend(fontsize=7, loc="lower left")


def draw_latency(axes: Sequence[Any], lines: Sequence[Series], settings: CapacitySettings) -> None:
    slo = settings.slo
    for ax, metric, limit in zip(axes, ("ttft", "tpot"), (slo.p95_ttft_s, slo.p95_tpot_s), strict=True):
        for s in lines:
            runs = [(r["workload"]["rate"], y) for r in s.records if (y := figures.p95(r, metric)) is not None]
            ax.scatter([x for x, _ in runs], [y for _, y in runs], s=6, color=s.colour, alpha=0.3,
                       gid=f"runs {s.config}")
            level = {x: statistics.median(y for rx, y in runs if rx == x) for x in sorted({x for x, _ in runs})}
            ax.plot(list(level), list(level.values()), color=s.colour, linewidth=1.2, label=s.legend())
            if s.capacity is not None:
                ax.axvline(s.capacity, color=s.colour, linestyle="--" if s.confirmed else ":", linewidth=1,
                           gid=f"capacity {s.config}")
        if limit is not None:
            ax.axhline(limit, color="black", linestyle="-.", linewidth=1,
                       label=f"{metric.upper()} limit {limit * 1e3:g} ms (per request; {slo.attainment:.0%} "
                             "of requests must meet it)")
        ax.set_yscale("log")
        figures.plain_log(ax.yaxis)
        ax.set_ylabel(f"p95 {metric.upper()} (s, log; median over runs)")
    axes[0].legend(fontsize=7, loc="upper left")
    for ax in axes[1:]:  # the configurations are named once, above; here the limit alone
        if limits := [ln for ln in ax.get_lines() if "limit" in ln.get_label()]:
            ax.legend(handles=limits, fontsize=7, loc="upper left")
    axes[0].set_xscale("log")
    figures.plain_log(axes[-1].xaxis)
    axes[-1].set_xlabel(RATE)
    axes[0].set_title("p95 latencies against the rate; vertical: each capacity (dashed: confirmed, dotted: the "
                      "screen's estimate)", fontsize=8)


def draw_pareto(ax: Any, lines: Sequence[Series], winner: str | None, settings: CapacitySettings) -> None:
    points, best = [], None
    for s in lines:
        mine = [p for r in s.records if (p := pareto.point(r, s.label, kept(r, settings)))]
        points += mine
        if s.config == winner and any(p.kept for p in mine):
            top = max((p for p in mine if p.kept), key=lambda p: p.per_gpu)
            best = (top, f"winner {s.label}: its run that kept the SLO with the most tokens/s per GPU")
    pareto.draw(ax, points, {s.label: s.colour for s in lines}, "kept the SLO", best)
    ax.set_title(f"each run a point; hollow: it broke the SLO ({settings.slo.words()})", fontsize=8)


def kept(record: dict[str, Any], settings: CapacitySettings) -> bool:
    met, n = met_of(record, settings)
    return n > 0 and met >= settings.slo.attainment * n
