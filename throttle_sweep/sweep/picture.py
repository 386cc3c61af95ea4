"""The sweep's pictures. `cost_vs_<flag>.png`: the cost per million output tokens of every measured run
(probes, comparisons, confirmations) against each swept flag, the runs that preempted marked, the
preemption boundary as a line between the last clean and the first preempting value, the baseline's cost,
and the winner with its confirmed interval. `history.png`: the search's ratio per trial. Drawn from the
records and the study alone."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from throttle_sweep.stats.analysis import BASIS_LABEL, judged_cost
from throttle_sweep.stats.schedule import BASELINE
from throttle_sweep.store.records import is_ok
from throttle_sweep.sweep.driver import SweepResult
from throttle_sweep.sweep.report import yardstick
from throttle_sweep.sweep.trials import cost, feasible
from throttle_sweep.sweep.winner import Confirmation


@dataclass(frozen=True)
class Run:
    x: Any  # the flag's value
    usd_per_mtok: float
    preempting: bool  # more preemptions than the sweep allows


def measured(r: Mapping[str, Any], basis: str) -> bool:
    """A run with a cost on the judged basis (warm-up runs, failures and runs with no steady window have none)."""
    return (is_ok(r) and not r.get("warmup") and r.get("usd_per_mtok") is not None
            and (basis != "steady" or bool(r.get("steady"))))


def runs_along(records: Sequence[Mapping[str, Any]], flag: str, basis: str, max_preemptions: int) -> list[Run]:
    """Every measured run that set `flag`; a categorical value is placed by its name."""
    runs = [Run(r["flags"][flag], judged_cost(r, basis), (r.get("preemptions") or 0) > max_preemptions)
            for r in records if measured(r, basis) and (r.get("flags") or {}).get(flag) is not None]
    if any(isinstance(r.x, str | bool) for r in runs):
        runs = [Run(str(r.x), r.usd_per_mtok, r.preempting) for r in runs]
    return runs


def boundary_lines(study: optuna.Study, flag: str) -> list[tuple[float, str]]:
    """(x, label): one line midway between the last clean and the first preempting value the probes found,
    for each distinct pair (other knobs' settings that put the boundary in the same place share it)."""
    pairs = sorted({(b["last_clean"], b["first_preempting"]) for b in study.user_attrs.get("boundaries") or []
                    if b.get("knob") == flag and b.get("last_clean") is not None
                    and b.get("first_preempting") is not None})
    return [((clean + dirty) / 2, f"preemption starts between {clean} and {dirty}") for clean, dirty in pairs]


def confirmation_baseline(winner: Confirmation) -> float:
    """The baseline's cost in the winner's own confirmation (geometric mean of its runs there)."""
    base = [winner.analysis.cost_of(r) for r in winner.analysis.replicates(BASELINE)]
    return math.exp(statistics.fmean(math.log(c) for c in base))


def winner_interval(winner: Confirmation) -> tuple[float, float, float]:
    """The winner's confirmed ratio and its (adjusted) interval, drawn at the level of the baseline it was
    confirmed against: in $/M, beside that baseline's line, so the picture and the verdict agree (the interval
    is the ratio's; the baseline's own level is taken as drawn)."""
    est = (winner.adjusted or winner.analysis).estimate
    level = confirmation_baseline(winner)
    return est.ratio * level, est.ci_low * level, est.ci_high * level


def draw_cost(ax: Any, result: SweepResult, flag: str, max_preemptions: int) -> None:
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    runs = runs_along(result.records, flag, result.cost_basis, max_preemptions)
    for preempting, colour, marker, label in ((False, "tab:green", "o", "a run, no preemption"),
                                             (True, "tab:red", "x", f"a run with > {max_preemptions} preemptions")):
        pts = [r for r in runs if r.preempting == preempting]
        if pts:
            ax.scatter([r.x for r in pts], [r.usd_per_mtok for r in pts], s=16, color=colour, marker=marker,
                       alpha=0.6, label=label)
    for x, label in boundary_lines(result.study, flag):
        ax.axvline(x, color="tab:red", linestyle="--", linewidth=1.2, label=label)
    winner = result.winner
    if winner is not None and flag in winner.params and not isinstance(winner.params[flag], str | bool):
        # the winner's ratio interval, at the level of the baseline runs it was confirmed against (drawn too)
        y, lo, hi = winner_interval(winner)
        ax.axhline(confirmation_baseline(winner), color="grey", linestyle=":", linewidth=1,
                   label="the baseline in the winner's confirmation")
        ax.errorbar([winner.params[flag]], [y], yerr=[[y - lo], [hi - y]], fmt="*", markersize=14,
                    color="tab:blue", capsize=5, zorder=5,
                    label=f"winner {flag}={winner.params[flag]} (its confirmed ratio interval x that baseline)")
    else:
        baseline = result.study.user_attrs.get("baseline")  # the flags; a search arm may run a reference point
        base = [judged_cost(r, result.cost_basis) for r in result.records
                if r.get("flags") == baseline and measured(r, result.cost_basis)]
        if base:
            ax.axhline(statistics.median(base), color="grey", linestyle=":", linewidth=1,
                       label="the baseline (median of its runs)")
    values = [r.x for r in runs]
    if values and all(isinstance(v, int) for v in values):  # categorical values were made names above
        if min(values) > 0 and max(values) / min(values) >= 16:  # powers of two, written as numbers
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        else:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(flag)
    ax.set_ylabel(f"$ / M output tokens ({BASIS_LABEL[result.cost_basis]})")
    ax.legend(fontsize=8)


def draw(out: Path, result: SweepResult, max_preemptions: int) -> list[str]:
    """Write the pictures; their markdown for report.md."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    md = []
    flags = sorted({k for t in result.study.get_trials(deepcopy=False) for k in t.params})
    for flag in flags:
        if not runs_along(result.records, flag, result.cost_basis, max_preemptions):
            continue
        fig, ax = plt.subplots(figsize=(8, 4.5))
        draw_cost(ax, result, flag, max_preemptions)
        fig.tight_layout()
        fig.savefig(out / f"cost_vs_{flag}.png", dpi=100)
        plt.close(fig)
        md.append(f"![cost vs {flag}](cost_vs_{flag}.png)")
    if history(out, result.study, plt):
        md.append("![optimisation history](history.png)")
    return md


def history(out: Path, study: optuna.Study, plt: Any) -> bool:
    done = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE and t.user_attrs.get("ci")
            and t.user_attrs.get("source") != "schedule"]  # a twin told another's answer is no point of its own
    if not done:
        return False
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([t.number for t in done], [cost(t) for t in done], "o", label="trial")
    best, running = [], float("inf")
    for t in done:
        if feasible(t):
            running = min(running, cost(t))
        best.append(running)
    ax.step([t.number for t in done], best, where="post", label="best feasible so far")
    ax.set_xlabel("trial")
    ax.set_ylabel(f"cost ratio vs {yardstick(study)}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "history.png", dpi=100)
    plt.close(fig)
    return True

