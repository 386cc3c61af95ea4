"""Output tokens/s per GPU against output tokens/s per user, each run a point, and the Pareto front of the
runs that kept the sweep's limits: the axes of vLLM's `vllm bench sweep plot_pareto`, for both sweeps.

Per GPU: the run's output tokens/s over the GPUs one engine holds (the record's `gpus`). Per user: the
output tokens of a request over its median latency (end to end, first token included). vLLM divides the
throughput by the concurrency; by Little's law that is a request's tokens over its mean latency, so the two
agree, and this one needs no concurrency (an open loop has none to set) and no TPOT (a stream that came in
one chunk has none). The median, so that one slow request does not set it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from throttle_sweep.report import figures

PER_USER = "output tokens/s per user (a request's tokens / median request latency)"
PER_GPU = "output tokens/s per GPU"


@dataclass(frozen=True)
class Point:
    per_user: float
    per_gpu: float
    kept: bool  # within the sweep's limits: the front is drawn through these
    group: str  # the configuration (or kind of run) it is drawn as


def tokens_per_gpu(record: Mapping[str, Any]) -> float | None:
    rate, gpus = record.get("output_tokens_per_s"), record.get("gpus") or 1
    return rate / gpus if rate else None


def tokens_per_user(record: Mapping[str, Any]) -> float | None:
    done, median = record.get("requests_completed"), (((record.get("latency_s") or {}).get("e2e")) or {}).get("p50")
    if not done or not median or not record.get("output_tokens"):
        return None
    return record["output_tokens"] / done / median


def point(record: Mapping[str, Any], group: str, kept: bool) -> Point | None:
    """The run's point; None where it lacks either axis (no request finished, no throughput)."""
    user, gpu = tokens_per_user(record), tokens_per_gpu(record)
    return Point(user, gpu, kept, group) if user and gpu else None


def front(points: Sequence[Point]) -> list[Point]:
    """The points no other beats on both axes, by tokens/s per user; only the kept ones compete."""
    best, out = float("-inf"), []
    for p in sorted((p for p in points if p.kept), key=lambda p: (-p.per_user, -p.per_gpu)):
        if p.per_gpu > best:
            out.append(p)
            best = p.per_gpu
    return out[::-1]


def draw(ax: Any, points: Sequence[Point], colours: Mapping[str, str], kept_words: str,
         winner: tuple[Point, str] | None) -> None:
    """Each group's runs (filled where kept, hollow where not: the caller's title says so), the front of the
    kept ones, and the winner's point with its label."""
    for group, colour in colours.items():
        named = False  # the group's name once, on its first points
        for kept in (True, False):
            mine = [p for p in points if p.group == group and p.kept == kept]
            if mine:
                ax.scatter([p.per_user for p in mine], [p.per_gpu for p in mine], s=16, alpha=0.7,
                           color=colour if kept else "none", edgecolors=colour, label=None if named else group,
                           gid=f"runs {group}")
                named = True
    line = front(points)
    if line:
        ax.plot([p.per_user for p in line], [p.per_gpu for p in line], color="black", linewidth=1.2,
                marker="o", markersize=3, label=f"Pareto front of the runs that {kept_words}")
    if winner is not None:
        best, label = winner
        ax.scatter([best.per_user], [best.per_gpu], marker="*", s=260, color=colours.get(best.group, "gold"),
                   edgecolors="black", zorder=5, label=label)
    users = [p.per_user for p in points]
    if users and max(users) / min(users) > 20:
        ax.set_xscale("log")
        figures.plain_log(ax.xaxis)
    ax.set_xlabel(PER_USER)
    ax.set_ylabel(PER_GPU)
    ax.grid(True, linestyle="--", linewidth=0.5, alpha=0.6)
    ax.legend(fontsize=7, loc="best")
