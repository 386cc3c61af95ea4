"""The goodput sweep's picture: each configuration's cost per million output tokens of requests that met the
SLO, against the arrival rate one replica serves. Each run is a point (filled where the SLO held, hollow where
it broke): idle capacity makes low rates dear, requests breaking the SLO make high rates dear, and the
confirmed capacity (a star) sits near the bottom of the curve."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

from throttle_sweep.capacity.report import per_request_tokens
from throttle_sweep.capacity.runs import met_of
from throttle_sweep.measurement.cost import Price, usd_per_mtok_at
from throttle_sweep.settings.capacity import CapacitySettings
from throttle_sweep.sweep.goodput.driver import Contender
from throttle_sweep.sweep.goodput.pick import Costed


def cost_at(price: Price, rate: float, tokens: float, share: float) -> float | None:
    """$ per million output tokens of requests meeting the SLO (a `share` of them), one replica serving `rate`
    requests/s of `tokens` output tokens each; None when none met it."""
    return usd_per_mtok_at(price, rate * share * tokens)


def plot(contenders: Sequence[Contender], costed: Sequence[Costed], settings: CapacitySettings, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    knees = {c.label: c for c in costed}
    fig, ax = plt.subplots(figsize=(7, 4.5), constrained_layout=True)
    for i, c in enumerate(x for x in contenders if x.records and not x.failed):
        color = f"C{i % 10}"
        tokens = per_request_tokens(c.records) or 1.0
        runs = [(r["workload"]["rate"], met / n) for r in c.records for met, n in [met_of(r, settings)]]
        runs = sorted((rate, cost) for rate, share in runs if (cost := cost_at(c.price, rate, tokens, share)))
        by_rate: dict[float, list[float]] = {}
        for rate, cost in runs:
            by_rate.setdefault(rate, []).append(cost)
        ax.plot(sorted(by_rate), [statistics.median(by_rate[x]) for x in sorted(by_rate)], color=color,
                linewidth=0.8, alpha=0.6, label=c.label + (f" on {c.gpu_type}" if c.gpu_type else ""))
        for held in (True, False):  # a run held when its cost is at most the cost at the SLO's share
            pts = [(x, y) for x, y in runs if (y <= cost_at(c.price, x, tokens, settings.slo.attainment)) == held]
            ax.scatter([x for x, _ in pts], [y for _, y in pts], s=14, color=color if held else "none",
                       edgecolors=color)
        knee = knees.get(c.label)
        if knee is not None and knee.rate:
            ax.scatter([knee.rate], [cost_at(c.price, knee.rate, tokens, settings.slo.attainment)], marker="*",
                       s=150, color=color, edgecolors="black", zorder=5)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arrival rate one replica serves (requests/s, log scale)")
    ax.set_ylabel("$ per million output tokens meeting the SLO (log)")
    ax.set_title(f"cost of tokens meeting the SLO against rate; hollow: the SLO broke; star: confirmed capacity\n"
                 f"({settings.slo.words()})", fontsize=8)
    ax.legend(fontsize=7, loc="upper right")
    fig.savefig(path, dpi=110)
    plt.close(fig)
