"""What mode=plan says: the study's capacity it plans with, the replicas per bucket, the day's GPU-hours and
dollars (estimate and sure), the price of not autoscaling, and the picture of demand against capacity."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from throttle_sweep.replica_plan.day import Cost, DayPlan
from throttle_sweep.replica_plan.studied import Served
from throttle_sweep.report import html_page


def clock(start_s: float) -> str:
    """A bucket's start as hours:minutes from the curve's zero."""
    minutes = round(start_s / 60)
    return f"{minutes // 60:d}:{minutes % 60:02d}"


def money(cost: Cost | None) -> str:
    return "-" if cost is None else f"{cost.gpu_hours:.4g} GPU-hours, ${cost.usd:,.2f}"


def capacity_notes(s: Served) -> list[str]:
    lines = []
    if s.at_least:
        lines.append(f"note: its capacity is at least {s.rate:.3g} req/s (its knee runs kept the SLO at every rate): "
                     "the replicas at the estimate are at most what the demand needs")
    if not s.low:
        lines.append("note: its capacity's lower bound is open (no rate held beyond doubt): no replica count is sure "
                     "to keep the SLO, and the estimate's counts have no headroom")
    return lines


def table(plan: DayPlan) -> list[str]:
    lines = [" start   hours  demand (req/s)  replicas  sure (lower bound)"]
    for r in plan.rows:
        sure = "-" if r.sure is None else str(r.sure)
        lines.append(f"{clock(r.bucket.start_s):>6}  {r.bucket.hours:6.3g}  {r.bucket.rps:14.4g}  {r.replicas:8d}  "
                     f"{sure:>4}")
    return lines


def day_lines(plan: DayPlan) -> list[str]:
    s = plan.served
    lines = [f"the day ({plan.hours:.3g} h) at the capacity estimate: {money(plan.estimate())}; sure to keep the "
             f"SLO (its lower bound, {s.low:.3g} req/s a replica): {money(plan.sure())}" if s.low else
             f"the day ({plan.hours:.3g} h) at the capacity estimate: {money(plan.estimate())}; sure to keep the "
             "SLO: open (no lower bound)"]
    held, estimate = plan.held(), plan.estimate()
    line = (f"without autoscaling: the peak's {plan.peak()} replica{'s' if plan.peak() != 1 else ''} all day = "
            f"{money(held)}, ${held.usd - estimate.usd:,.2f} more than the plan"  # type: ignore[union-attr]
            + (f" ({held.usd / estimate.usd - 1:.0%})" if estimate.usd else ""))  # type: ignore[union-attr]
    sure, sure_held = plan.sure(), plan.held(True)
    if sure is not None and sure_held is not None:
        line += f"; sure: {plan.peak(True)} all day = {money(sure_held)}, ${sure_held.usd - sure.usd:,.2f} more"
    lines.append(line + f"; the mean demand ({plan.mean_rps:.3g} req/s) alone would need {plan.average_replicas()}")
    return lines


def type_lines(plans: dict[str, DayPlan]) -> list[str]:
    if not plans:
        return []
    lines = ["per GPU type, its cheapest confirmed configuration, planned at its own capacity and price:"]
    for gpu_type, plan in plans.items():
        s = plan.served
        lines.append(f"  {gpu_type}: {s.words()}: {money(plan.estimate())} at the estimate; sure: "
                     f"{money(plan.sure())}; the peak's {plan.peak()} all day: {money(plan.held())}")
    return lines


def steps(plan: DayPlan, values: Sequence[float]) -> tuple[list[float], list[float]]:
    """x (hours) and y for a step plot (`where="post"`): each value held over its bucket, the last to the end."""
    x = [r.bucket.start_s / 3600 for r in plan.rows]
    last = plan.rows[-1].bucket
    return x + [(last.start_s + last.duration_s) / 3600], [*values, values[-1]]


def plot(plan: DayPlan, path: Path, title: str) -> None:
    """Demand against the capacity the plan provisions (replicas x capacity, and the sure count x the lower
    bound), and the peak's fleet held all day; step plots over the day."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = plan.served
    fig, ax = plt.subplots(figsize=(8, 5), constrained_layout=True)
    x, provided = steps(plan, [r.replicas * s.rate for r in plan.rows])
    demand = steps(plan, [r.bucket.rps for r in plan.rows])[1]
    held = [plan.peak() * s.rate] * len(x)  # type: ignore[operator]
    ax.fill_between(x, provided, held, step="post", color="grey", alpha=0.15,
                    label="what holding the peak's fleet all day adds")
    ax.fill_between(x, demand, provided, step="post", color="tab:blue", alpha=0.15,
                    label="headroom: the rounding up to whole replicas")
    ax.step(x, provided, where="post", color="tab:blue", linewidth=1.5,
            label=f"provisioned: replicas x capacity ({s.rate:.3g} req/s{', at least' if s.at_least else ''})")
    if s.low and all(r.sure is not None for r in plan.rows):
        ax.step(*steps(plan, [r.sure * s.low for r in plan.rows]), where="post", color="tab:green",  # type: ignore[operator]
                linestyle="--", linewidth=1.2, label=f"sure: replicas x lower bound ({s.low:.3g} req/s)")
    ax.step(x, held, where="post", color="grey", linestyle=":", linewidth=1.2,
            label=f"without autoscaling: the peak's {plan.peak()} replicas all day")
    ax.step(x, demand, where="post", color="black", linewidth=2, label="demand")
    ax.set_xlabel("hours from the curve's start")
    ax.set_ylabel("requests/s")
    ax.set_ylim(bottom=0)
    ax.set_xlim(x[0], x[-1])
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, frameon=False)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def page(folder: Path, title: str, said: Sequence[str], plan: DayPlan, typed: dict[str, DayPlan],
         pictures: Sequence[Path]) -> Path:
    """plan.html beside the study (its own report.html stays): the day's cost, the buckets, the picture."""
    days = day_lines(plan)
    rows = [(clock(r.bucket.start_s), r.bucket.hours, r.bucket.rps, r.replicas, r.sure) for r in plan.rows]
    buckets = html_page.Table(("start", "hours", "demand (req/s)", "replicas", "sure (lower bound)"), rows)
    sections = [html_page.Section("The day", text=[*said, *days, *type_lines(typed)], pictures=pictures),
                html_page.Section("Buckets", tables=[buckets])]
    return html_page.write(folder, title, days[0], sections, name="plan.html")
