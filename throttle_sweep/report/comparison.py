"""How a comparison is shown: console lines, summary.json, summary.md, report.html and a PNG of cost in run order."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from throttle_sweep.measurement.cost import Price
from throttle_sweep.report import html_page
from throttle_sweep.stats.analysis import BASIS_LABEL, Analysis, judged_joules
from throttle_sweep.stats.fit import fit
from throttle_sweep.stats.schedule import BASELINE, CANDIDATE
from throttle_sweep.stats.verdict import Observation, Thresholds
from throttle_sweep.store.records import is_ok


def summary(analysis: Analysis, thresholds: Thresholds, price: Price | None) -> dict[str, Any]:
    est = analysis.estimate
    out: dict[str, Any] = {
        "verdict": analysis.verdict,
        "labels": analysis.labels,
        "thresholds": vars(thresholds),
        "price": None if price is None else {"usd_per_gpu_hour": price.usd_per_gpu_hour, "gpus": price.gpus,
                                             "usd_per_kwh": price.usd_per_kwh, "assumed": True},
        "cost_basis": analysis.basis,
        "replicates": [{"position": r["position"], "arm": r["arm"], "usd_per_mtok": r.get("usd_per_mtok"),
                        "judged_usd_per_mtok": analysis.cost_of(r) if is_ok(r) else None,
                        "judged_j_per_output_token": judged_joules(r, analysis.basis),
                        "status": r.get("status", "ok"), "preemptions": r.get("preemptions"),
                        "record_id": r.get("record_id")} for r in analysis.records],
        "notes": analysis.notes,
    }
    if est is not None:
        pct = est.percent
        out.update(ratio=est.ratio, ci=[est.ci_low, est.ci_high], percent_change=pct[0], percent_ci=[pct[1], pct[2]],
                   p_value=est.p_value, df=est.df, se_log=est.se_log, drift_per_position=est.drift_per_position,
                   confounding=est.confounding, more_replicates_per_arm=est.more_replicates_per_arm,
                   n={BASELINE: est.n_baseline, CANDIDATE: est.n_candidate})
    return out


def lines(analysis: Analysis, thresholds: Thresholds, price: Price | None) -> list[str]:
    """The printout: each arm's $/M per replicate in run order, ratio, percent change, drift, verdict."""
    width = max(len(v) for v in analysis.labels.values())
    out = []
    for arm in (BASELINE, CANDIDATE):
        cells = "".join(f"  ${c:.4g}" for _, c in analysis.costs(arm))
        joules = analysis.joules(arm)
        out.append(f"{analysis.labels[arm]:<{width}} {cells}" + ("" if joules is None else
                                                                 f"  (mean {joules:.3g} J/output token)"))
    basis = BASIS_LABEL[analysis.basis]
    out.append(f"($ per million output tokens, {basis}" + (f", {price.label()})" if price is not None else ")"))
    est = analysis.estimate
    level = 100 * (1 - thresholds.alpha)
    if est is not None:
        pct = est.percent
        out.append(f"ratio candidate/baseline {est.ratio:.3f}  ({level:g}% CI {est.ci_low:.3f} to {est.ci_high:.3f}, "
                   f"t with {est.df:g} df)")
        out.append(f"change {pct[0]:+.1f}%  ({level:g}% CI {pct[1]:+.1f}% to {pct[2]:+.1f}%)")
        out.append(f"drift {100 * est.drift_per_position:+.2f}% per replicate (estimated, removed from the ratio)")
    verdict = f"verdict: {analysis.verdict}"
    if est is not None and est.more_replicates_per_arm:
        verdict += (f"  (about {est.more_replicates_per_arm} more replicates per arm would decide it with an 80% "
                    "chance, if the estimate and noise hold)")
    out.append(verdict)
    out.extend(f"note: {n}" for n in analysis.notes)
    return out


def write(out_dir: Path, analysis: Analysis, thresholds: Thresholds, price: Price | None, *,
          plot: bool = True) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    data = summary(analysis, thresholds, price)
    paths = {"json": out_dir / "summary.json", "md": out_dir / "summary.md"}
    paths["json"].write_text(json.dumps(data, indent=2, sort_keys=True, default=float) + "\n")
    # a column of joules per output token where the GPUs' energy was measured
    energy = " J/output token |" if any(r["judged_j_per_output_token"] for r in data["replicates"]) else ""
    md = ["# Comparison", "", "```", *lines(analysis, thresholds, price), "```", "",
          f"| position | arm | $/M output tokens ({BASIS_LABEL[analysis.basis]}) |{energy} status | preemptions |",
          "|---|---|---|---|---|" + ("---|" if energy else "")]
    for r in data["replicates"]:
        cost = "" if r["judged_usd_per_mtok"] is None else f"{r['judged_usd_per_mtok']:.4g}"
        joules = "" if r["judged_j_per_output_token"] is None else f"{r['judged_j_per_output_token']:.3g}"
        md.append(f"| {r['position']} | {analysis.labels[r['arm']]} | {cost} |{f' {joules} |' if energy else ''} "
                  f"{r['status']} | {r['preemptions']} |")
    if plot and analysis.estimate is not None:
        paths["png"] = out_dir / "replicates.png"
        plot_replicates(analysis, paths["png"])
        md += ["", "![cost per replicate in run order](replicates.png)"]
    paths["md"].write_text("\n".join(md) + "\n")
    paths["html"] = page(out_dir, analysis, thresholds, price, title="Comparison", pictures=[paths["png"]]
                         if "png" in paths else [])
    return paths


def page(out_dir: Path, analysis: Analysis, thresholds: Thresholds, price: Price | None, *, title: str,
         answer: str | None = None, before: Sequence[html_page.Section] = (), pictures: Sequence[Path] = ()
         ) -> Path:
    """report.html of a comparison: its verdict (or `answer`), its printout, its replicates and its picture."""
    data = summary(analysis, thresholds, price)
    text = lines(analysis, thresholds, price)
    verdict = next(line for line in text if line.startswith("verdict: "))
    change = next((line for line in text if line.startswith("change ")), None)
    energy = any(r["judged_j_per_output_token"] for r in data["replicates"])  # a column only where it was measured
    header = ("position", "arm", f"$/M output tokens ({BASIS_LABEL[analysis.basis]})",
              *(("J/output token",) if energy else ()), "status", "preemptions")
    rows = [(r["position"], analysis.labels[r["arm"]], r["judged_usd_per_mtok"],
             *((r["judged_j_per_output_token"],) if energy else ()), r["status"], r["preemptions"])
            for r in data["replicates"]]
    sections = [*before, html_page.Section("The comparison", text=text),
                html_page.Section("Replicates in run order", tables=[html_page.Table(header, rows)],
                                    pictures=pictures)]
    labels = analysis.labels
    return html_page.write(out_dir, f"{title}: {labels[CANDIDATE]} against {labels[BASELINE]}",
                             answer or (f"{verdict}; {change}" if change else verdict), sections)


def plot_replicates(analysis: Analysis, path: Path) -> None:
    """$/M per replicate in run order, coloured by arm, with the fitted drift line of each arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    est = analysis.estimate
    obs = [Observation(arm, p, c) for arm in (BASELINE, CANDIDATE) for p, c in analysis.costs(arm)]
    (intercept, effect, slope), _, _ = fit(obs)  # the same fit as the estimate: log cost on arm and position
    centre = sum(o.position for o in obs) / len(obs)
    xs = [min(o.position for o in obs), max(o.position for o in obs)]
    fig, ax = plt.subplots(figsize=(7, 4))
    for arm, colour in ((BASELINE, "tab:blue"), (CANDIDATE, "tab:orange")):
        points = analysis.costs(arm)
        ax.scatter([p for p, _ in points], [c for _, c in points], color=colour, label=analysis.labels[arm], zorder=3)
        ys = [math.exp(intercept + effect * (arm == CANDIDATE) + slope * (x - centre)) for x in xs]
        ax.plot(xs, ys, color=colour, linestyle="--", linewidth=1)
    ax.set_xlabel("run position")
    ax.set_ylabel(f"$ per million output tokens\n{BASIS_LABEL[analysis.basis]} (assumed price)")
    ax.set_title(f"{analysis.verdict}: ratio {est.ratio:.3f} [{est.ci_low:.3f}, {est.ci_high:.3f}]")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
