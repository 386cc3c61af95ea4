"""What mode=capacity says: the runs, the capacity with its interval, goodput and cost at capacity
(summary.json), and the picture of attainment and p95 latencies against the rate, the knee marked."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from throttle_sweep.capacity.knee import Knee
from throttle_sweep.capacity.rates import ALWAYS_MET, NEVER_MET, RateSearch
from throttle_sweep.capacity.slo import Slo
from throttle_sweep.measurement.cost import Price, usd_per_mtok_at
from throttle_sweep.report import html_page


def per_request_tokens(records: Sequence[Mapping[str, Any]]) -> float:
    done = sum(r["requests_completed"] for r in records)
    return sum(r["output_tokens"] for r in records) / done if done else 0.0


def at_rate(rate: float | None, tokens: float, slo: Slo, price: Price) -> dict[str, float | None]:
    """Goodput (output tokens/s of requests meeting the SLO) and its cost per million tokens at this rate."""
    if rate is None or tokens <= 0:
        return {"goodput_tokens_per_s": None, "usd_per_mtok": None}
    goodput = rate * slo.attainment * tokens
    return {"goodput_tokens_per_s": goodput, "usd_per_mtok": usd_per_mtok_at(price, goodput)}


def summary(search: RateSearch, knee: Knee | None, records: Sequence[Mapping[str, Any]], slo: Slo,
            price: Price) -> dict[str, Any]:
    tokens = per_request_tokens(records)
    out: dict[str, Any] = {"status": search.status, "slo": vars(slo), "price": price.label(),
                           # a replica's GPUs and their price, as a goodput sweep's entries say them (mode=plan)
                           "usd_per_gpu_hour": price.usd_per_gpu_hour, "gpus_per_replica": price.gpus,
                           "output_tokens_per_request": tokens, "runs": len(search.runs),
                           # single runs: the highest rate that kept the SLO, below the lowest that broke it
                           "bracket": [search.low, search.high]}
    if knee is not None:
        # above every knee rate: censored at the highest, 'at least' (as the goodput sweep says it)
        capacity = knee.capacity_rps if knee.capacity_rps is not None else knee.at_least
        point, low, high = (at_rate(x, tokens, slo, price) for x in (capacity, knee.low, knee.high))
        out.update(capacity_rps=capacity, capacity_at_least=knee.capacity_rps is None and capacity is not None,
                   capacity_ci=[knee.low, knee.high],
                   goodput_tokens_per_s=point["goodput_tokens_per_s"],
                   goodput_ci=[low["goodput_tokens_per_s"], high["goodput_tokens_per_s"]],
                   usd_per_mtok_at_capacity=point["usd_per_mtok"],
                   usd_per_mtok_ci=[high["usd_per_mtok"], low["usd_per_mtok"]],  # more capacity, cheaper
                   rates=[{"rate": lv.rate, "runs": lv.runs, "attainment": lv.attainment, "met": lv.met,
                           "counted": lv.counted, "verdict": lv.verdict}
                          for lv in knee.levels])
    best = search.best()
    if search.status == NEVER_MET and best is not None:
        out["best"] = {"rate": best.rate, "attainment": best.attainment}
    return out


def sentences(result: Mapping[str, Any], search: RateSearch, slo: Slo) -> list[str]:
    if search.status == NEVER_MET:
        best = result.get("best") or {}
        return [f"no rate down to capacity.min_rate={search.min_rate:g} req/s kept the SLO ({slo.words()}): the "
                f"best attainment was {best.get('attainment', 0):.1%} at {best.get('rate', 0):g} req/s. Loosen the "
                "SLO, or change the flags"]
    if search.status == ALWAYS_MET:
        return [f"the SLO ({slo.words()}) held up to capacity.max_rate={search.max_rate:g} req/s: raise it"]
    cap, (low, high) = result.get("capacity_rps"), result.get("capacity_ci", [None, None])
    if cap is None:
        rates = [r["rate"] for r in result.get("rates") or []]
        if not rates:
            return ["no knee runs: no capacity to report (see the rates above)"]
        return [f"capacity: below {min(rates):.3g} req/s (its knee runs missed the SLO's attainment at every rate, "
                f"{min(rates):.3g} to {max(rates):.3g}); with {slo.words()}" + runs_words(result)]
    if result.get("capacity_at_least"):
        sure = f"beyond doubt up to {low:.3g}" if low is not None else "none beyond doubt"
        lines = [f"capacity: at least {cap:.3g} req/s, its knee runs kept the SLO at every rate ({sure}): a wider "
                 f"knee (capacity.knee_margin) finds where it breaks; with {slo.words()}" + runs_words(result)]
    else:
        lines = [f"capacity: {cap:.3g} req/s, {interval_words(low, high)}; with {slo.words()}" + runs_words(result)]
    if result.get("goodput_tokens_per_s"):
        lo, hi = result["usd_per_mtok_ci"]
        least = "at least " if result.get("capacity_at_least") else ""  # and its cost at most
        lines.append(f"goodput at capacity: {least}{result['goodput_tokens_per_s']:.4g} output tokens/s; "
                     f"{'at most ' if least else ''}${result['usd_per_mtok_at_capacity']:.4g} per million output tokens"
                     + (f" [{lo:.4g}, {hi:.4g}]" if lo is not None and hi is not None else "")
                     + f" ({result['price']})")
    return lines


def interval_words(low: float | None, high: float | None) -> str:
    if low is not None and high is not None:
        return f"95% CI [{low:.3g}, {high:.3g}]"
    if low is not None:
        return f"above {low:.3g} with 95% confidence (no knee rate failed beyond doubt)"
    if high is not None:
        return f"below {high:.3g} with 95% confidence (no knee rate held beyond doubt)"
    return ("no 95% interval: no knee rate held or failed beyond doubt (more runs a rate, capacity.knee_replicates, "
            "tell them apart)")


def runs_words(result: Mapping[str, Any]) -> str:
    """The runs a capacity was read from, which it depends on: their length, the warm-up each dropped (chosen
    per run), and how many showed a trend (and were lengthened, or read by their second half)."""
    if result.get("run_s") is None:
        return ""
    warm = result.get("warmup_s")
    words = f"; runs of at least {result['run_s']:g} s, warm-up " + (
        f"{warm[0]:.1f}-{warm[1]:.1f} s chosen per run (MSER-5)" if warm else "chosen per run (MSER-5)")
    if result.get("trend_runs"):  # each read by its second half (steady.counted)
        words += f"; {result['trend_runs']} with latency growing through the run, each counted by its second half"
    if result.get("lengthened_runs"):
        words += f"; {result['lengthened_runs']} run again twice as long, the first too short to tell"
    return words


def page(out: Path, title: str, told: Sequence[str], result: Mapping[str, Any], knee: Knee | None,
         pictures: Sequence[Path]) -> Path:
    """report.html of a capacity study: its sentences, the knee's rates, its picture and summary.json's numbers."""
    sections = [html_page.Section("The capacity", text=told)]
    if knee is not None:
        rows = [(lv.rate, lv.runs, f"{lv.attainment:.1%}", lv.met, lv.counted, lv.verdict) for lv in knee.levels]
        sections.append(html_page.Section("Rates at the knee", tables=[html_page.Table(
            ("rate (req/s)", "runs", "attainment", "met the SLO", "requests counted", "verdict (one-sided, alpha/2)"),
            rows)]))
    if pictures:
        sections.append(html_page.Section("Picture", pictures=pictures))
    sections.append(html_page.Section("summary.json", tables=[html_page.facts(result)]))
    return html_page.write(out, title, told[0], sections)


def plot(records: Sequence[Mapping[str, Any]], attain: Sequence[float], knee: Knee | None, slo: Slo,
         path: Path, what: str = "") -> None:
    """Attainment, and the runs' p95 TTFT and TPOT, against the rate (log scale): the knee runs (the only ones
    in the answer) filled, the bracket's and bisection's hollow; the pooled share per knee rate; the target;
    the capacity and each end of its interval that the runs bound."""
    from throttle_sweep.report import figures

    plt = figures.pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(7.5, 6.5), constrained_layout=True)
    import textwrap

    fig.suptitle(textwrap.fill(f"capacity{f' of {what}' if what else ''}: {slo.words()}", 110), fontsize=8)
    runs = [(r["workload"]["rate"], a, r) for r, a in zip(records, attain, strict=True)]
    knee_runs = [x for x in runs if x[2].get("search_stage") == "knee"]
    others = [x for x in runs if x[2].get("search_stage") != "knee"]
    if knee_runs:
        top.scatter([x[0] for x in knee_runs], [x[1] for x in knee_runs], s=18, color="tab:blue",
                    label="a knee run (in the answer)")
    if others:
        top.scatter([x[0] for x in others], [x[1] for x in others], s=18, facecolors="none", edgecolors="grey",
                    label="a bracket or bisection run (finds where to look)")
    if knee is not None and knee.levels:
        top.plot([lv.rate for lv in knee.levels], [lv.attainment for lv in knee.levels], color="tab:blue",
                 linewidth=1, label="pooled share per knee rate")
    top.axhline(slo.attainment, color="grey", linestyle="--", label=f"target {slo.attainment:.0%}")
    top.set_ylabel("share of requests meeting the SLO")
    top.set_ylim(-0.02, 1.02)
    for metric, colour, marker, limit in (("ttft", "tab:orange", "o", slo.p95_ttft_s),
                                          ("tpot", "tab:green", "^", slo.p95_tpot_s)):
        for group, filled in ((knee_runs, True), (others, False)):
            points = [(x[0], v) for x in group if (v := figures.p95(x[2], metric)) is not None]
            if points:  # a run whose tokens came in one chunk has no TPOT
                bottom.scatter(*zip(*points, strict=True), s=14, marker=marker, color=colour if filled else None,
                               facecolors=colour if filled else "none", edgecolors=colour,
                               label=f"p95 {metric.upper()}" if filled else None)
        if limit is not None:
            bottom.axhline(limit, color=colour, linestyle=":", label=f"{metric.upper()} limit (per request)")
    bottom.set_yscale("log")
    bottom.set_ylabel("seconds (p95 of a run's requests)")
    bottom.set_xlabel("arrival rate (requests/s, log scale)")
    bottom.set_xscale("log")
    figures.plain_log(bottom.xaxis)
    capacity = None if knee is None else (knee.capacity_rps if knee.capacity_rps is not None else knee.at_least)
    if capacity is not None:
        least = "at least " if knee.capacity_rps is None else ""
        for ax in (top, bottom):
            if knee.low is not None and knee.high is not None:
                ax.axvspan(knee.low, knee.high, color="tab:red", alpha=0.12)
            ax.axvline(capacity, color="tab:red", label=f"capacity {least}{capacity:.3g} req/s" if ax is top else None)
            for end, name in ((knee.low, "held beyond doubt up to"), (knee.high, "failed beyond doubt from")):
                if end is not None:
                    ax.axvline(end, color="tab:red", linestyle="--", linewidth=1,
                               label=f"95% interval: {name} {end:.3g}" if ax is top else None)
    top.legend(loc="lower left", fontsize=7)
    bottom.legend(loc="upper left", fontsize=7)
    figures.save(fig, path)
