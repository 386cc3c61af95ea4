"""The cost sweep's latency and throughput pictures, beside cost_vs_<flag>.png (picture.py):
- latency_vs_throughput.png: every measured run's p95 TTFT and p95 TPOT against its output tokens/s per GPU.
  The sweep's load is a closed loop (a fixed concurrency), so there is no arrival rate to draw against: the
  throughput a run reached is the load its flags let the engine carry, the x a rate would be in an open loop,
  and it places every flag at once (cost_vs_<flag>.png places one). The study's p95 limits are drawn where
  set (here they are p95 limits: a trial's constraint is its runs' worst p95).
- pareto.png: output tokens/s per GPU against per user, the front of the runs that kept every limit (no more
  preemptions than allowed, each p95 within its limit), the winner at the median of its runs (pareto.py).
  Every run of a sweep carries the same concurrency, so per user and per GPU rise together and the front is
  short: it shows the winner against the rest (vLLM's plot_pareto varies the concurrency to trace one).
The baseline's runs, the winner's and every other configuration's are told apart; hollow: a limit broken."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from throttle_sweep.report import figures, pareto
from throttle_sweep.stats.schedule import CANDIDATE
from throttle_sweep.sweep.driver import SweepResult
from throttle_sweep.sweep.picture import measured

BASELINE, OTHER = "the baseline", "other configurations"
METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"))


@dataclass(frozen=True)
class Run:
    record: dict[str, Any]
    group: str
    kept: bool  # within every limit of the sweep


def winner_group(result: SweepResult) -> tuple[str, dict[str, Any]] | None:
    """The winner's group name and the flags its confirmation runs ran with."""
    if result.winner is None or not (runs := result.winner.analysis.replicates(CANDIDATE)):
        return None
    words = " ".join(f"{k}={v}" for k, v in sorted(result.winner.params.items()))
    return f"the winner {words}", runs[0]["flags"]


def within(record: Mapping[str, Any], max_preemptions: int, limits: Mapping[str, float | None]) -> bool:
    """No more preemptions than allowed and each p95 within its limit (a p95 with no samples breaks none)."""
    over = [name for name, limit in limits.items() if limit is not None
            and (value := figures.p95(record, name.removeprefix("p95_").removesuffix("_s"))) is not None
            and value > limit]
    return (record.get("preemptions") or 0) <= max_preemptions and not over


def runs_of(result: SweepResult, max_preemptions: int, limits: Mapping[str, float | None]) -> list[Run]:
    baseline, won = result.study.user_attrs.get("baseline"), winner_group(result)
    out = []
    for r in result.records:
        if not measured(r, result.cost_basis):
            continue
        group = (won[0] if won and r.get("flags") == won[1] else BASELINE if r.get("flags") == baseline
                 else OTHER)
        out.append(Run(r, group, within(r, max_preemptions, limits)))
    return out


def colours(result: SweepResult) -> dict[str, str]:
    won = winner_group(result)
    return {OTHER: "tab:grey", BASELINE: "tab:orange", **({won[0]: "tab:blue"} if won else {})}


def draw(out: Path, result: SweepResult, max_preemptions: int, limits: Mapping[str, float | None]) -> list[str]:
    """Write the two pictures; their markdown for report.md."""
    runs = runs_of(result, max_preemptions, limits)
    if not runs:
        return []
    plt = figures.pyplot()
    fig, axes = plt.subplots(2, 1, sharex=True, figsize=(8, 7), constrained_layout=True)
    draw_latency(axes, runs, colours(result), limits)
    figures.save(fig, out / "latency_vs_throughput.png")
    fig, ax = plt.subplots(figsize=(8, 5), constrained_layout=True)
    draw_pareto(ax, runs, colours(result))
    figures.save(fig, out / "pareto.png")
    return ["![p95 latencies against tokens/s per GPU](latency_vs_throughput.png)",
            "![tokens/s per GPU against tokens/s per user](pareto.png)"]


def draw_latency(axes: Sequence[Any], runs: Sequence[Run], groups: Mapping[str, str],
                 limits: Mapping[str, float | None]) -> None:
    won = next((g for g in groups if g not in (BASELINE, OTHER)), None)
    for ax, (metric, name) in zip(axes, METRICS, strict=True):
        for group, colour in groups.items():
            named = False
            for kept in (True, False):
                pts = [(x, y) for run in runs if run.group == group and run.kept == kept
                       and (x := pareto.tokens_per_gpu(run.record)) and (y := figures.p95(run.record, metric))]
                if pts:
                    ax.scatter([x for x, _ in pts], [y for _, y in pts], s=70 if group == won else 18, alpha=0.7,
                               edgecolors=colour,
                               color=colour if kept else "none", marker="*" if group == won else "o",
                               label=None if named else group, gid=f"runs {group}")
                    named = True
        limit = limits.get(f"p95_{metric}_s")
        if limit is not None:
            ax.axhline(limit, color="black", linestyle="-.", linewidth=1,
                       label=f"p95 {name} limit {limit * 1e3:g} ms (study.max_p95_{metric}_s)")
        ax.set_yscale("log")
        figures.plain_log(ax.yaxis)
        ax.set_ylabel(f"p95 {name} of a run (s, log)")
        ax.legend(fontsize=7)
    axes[0].set_title("each measured run; hollow: it broke a limit (preemptions or a p95); the load is a closed "
                      "loop: its throughput stands for the rate", fontsize=8)
    axes[-1].set_xlabel(pareto.PER_GPU)


def draw_pareto(ax: Any, runs: Sequence[Run], groups: Mapping[str, str]) -> None:
    points = [(p, run) for run in runs if (p := pareto.point(run.record, run.group, run.kept))]
    won = next((g for g in groups if g not in (BASELINE, OTHER)), None)
    mine = [p for p, _ in points if p.group == won]
    best = None
    if mine:  # the winner where its runs sit: the median of each axis
        median = pareto.Point(statistics.median(p.per_user for p in mine), statistics.median(p.per_gpu for p in mine),
                              True, won)
        best = (median, f"{won.removeprefix('the ')}: the median of its runs")
    pareto.draw(ax, [p for p, _ in points], groups, "kept every limit", best)
    ax.set_title("each measured run; hollow: it broke a limit (preemptions or a p95)\none concurrency for every run: "
                 "per user and per GPU rise together, so the front is short (vLLM's varies the concurrency)",
                 fontsize=8)
