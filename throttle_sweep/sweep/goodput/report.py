"""What a goodput sweep says: each configuration's screened capacity, the confirmed ones with their intervals,
cost per million output tokens and the replicas a target rate needs, and the winner (summary.json keeps the
same)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from throttle_sweep.capacity.rates import ALWAYS_MET, NEVER_MET
from throttle_sweep.capacity.report import per_request_tokens, runs_words
from throttle_sweep.capacity.steady import counted, summary_of
from throttle_sweep.report import html_page
from throttle_sweep.settings.goodput import GPU_TYPE
from throttle_sweep.sweep.goodput.driver import BASELINE, Contender, GoodputSweep, best_attainment
from throttle_sweep.sweep.goodput.front import EXTRA_REPLICAS, FleetPoint, fleet_points, pareto
from throttle_sweep.sweep.goodput.pick import Costed, cheaper_beyond_doubt, pick, sort_key
from throttle_sweep.sweep.report import fmt_params as sweep_params


def fmt_params(params: dict[str, Any]) -> str:
    return sweep_params(params) or "(the engine's flags)"


def interval(low: float | None, high: float | None, digits: str = ".3g") -> str:
    return f"[{format(low, digits) if low is not None else '-'}, {format(high, digits) if high is not None else '-'}]"


def screen_line(sweep: GoodputSweep, c: Contender) -> str:
    head = f"  {c.label:<9} {fmt_params(c.params):<44}"
    if c.failed:
        return f"{head} failed: {c.failed}"
    if c.search.status == NEVER_MET:
        att, rate = best_attainment(c) or (0.0, 0.0)
        return f"{head} never kept the SLO (best attainment {att:.0%}, at {rate:.3g} req/s)"
    rate = c.screen_rate()
    if rate is None:
        return f"{head} no capacity found"
    above = " (kept up to capacity.max_rate: at least)" if c.search.status == ALWAYS_MET else ""
    return f"{head} capacity {rate:8.3g} req/s{above}  ${sweep.usd_per_mtok(c, rate):.4g}/M output tokens"


def costed_of(sweep: GoodputSweep, c: Contender, family: int) -> Costed:
    return Costed(c.label, c.params, c.price, sweep.knee_of(c, family), per_request_tokens(c.records),
                  sweep.settings.slo.attainment, claim=sweep.knee_of(c, family, one_sided=True),
                  confidence=1 - sweep.alpha)


def confirmed_line(c: Costed, target: float | None, head: str | None = None) -> str:
    knee, head = c.knee, head if head is not None else f"  {c.label:<9}"
    if c.rate is None:
        return f"{head} its fresh knee runs stayed below the SLO's attainment: no capacity"
    low, high = c.cost_ci
    line = (f"{head} capacity {capacity_words(c)} {interval(knee.low, knee.high)}  "
            f"${c.cost:.4g}/M output tokens {interval(low, high, '.4g')}")
    if target is not None:
        fleet = c.fleet(target)
        line += (f"  for {target:g} req/s: {plural(fleet['replicas'], 'replica')} "
                 f"{interval(*fleet['replicas_ci'], 'd')} = {plural(fleet['gpus'], 'GPU')}, "
                 f"${fleet['usd_per_hour']:.4g}/h")
    return line


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def capacity_words(c: Costed) -> str:
    if c.at_least:
        sure = ("the highest held beyond doubt" if c.knee.low == c.rate else
                f"beyond doubt up to {c.knee.low:.3g}" if c.knee.low else "none beyond doubt")
        return f"at least {c.rate:.3g} req/s (its knee runs kept the SLO at every rate, {sure})"
    return f"{c.rate:.3g} req/s"


def fleet_words(c: Costed, target: float) -> str:
    fleet = c.fleet(target)
    sure = (f"{fleet['replicas_sure']} to keep the SLO with {c.confidence:.0%} confidence "
            f"(${fleet['usd_per_hour_sure']:.4g}/h, its capacity's lower bound)" if fleet["replicas_sure"] else
            f"how many keep it with {c.confidence:.0%} confidence is open: no knee rate held beyond doubt")
    n = fleet["replicas"]
    return (f"for {target:g} req/s: {n} replica{'s' if n != 1 else ''} at the capacity estimate "
            f"(${fleet['usd_per_hour']:.4g}/h, {c.price.gpus} GPU{'s' if c.price.gpus > 1 else ''} each), {sure}")


def answer(sweep: GoodputSweep, family: Sequence[Contender], target: float | None
           ) -> tuple[list[str], dict[str, Any], Costed | None]:
    """The lines to print, summary.json, and the winner (None: no confirmed capacity)."""
    slo = sweep.settings.slo
    readings = [(r, found[2]) for c in [sweep.baseline, *sweep.trials] for r in c.records
                if (found := counted(r, slo))]
    runs = runs_words({"run_s": sweep.settings.run_s, **summary_of(readings)})  # what capacities depend on
    lines = [f"screen: one rate search each (bracket, bisection, knee runs); {slo.words()}{runs}"]
    lines += [screen_line(sweep, c) for c in [sweep.baseline, *sweep.trials]]
    costed = [costed_of(sweep, c, len(family)) for c in family if not c.failed]
    if family:
        where = ("interleaved in time across the GPU types' slots (costs on different types are absolute, "
                 "unpaired)" if sweep.prices else "interleaved on one slot")
        lines.append(f"confirmed: fresh knee runs, {where}; {1 - sweep.alpha:.0%} intervals adjusted for {len(family)} "
                     f"configurations (Bonferroni), so that they hold together{runs}")
        lines += [confirmed_line(c, target) for c in costed]
    if sweep.prices:
        lines += type_lines(sweep, costed, target)
    base = next((c for c in costed if c.label == BASELINE), None)
    winner, tied = pick([c for c in costed if c.label != BASELINE], target)
    price = (", ".join(f"{t} ${usd:g}/GPU-hour" for t, usd in sweep.prices.items()) + " (assumed)" if sweep.prices
             else sweep.price.label())
    summary: dict[str, Any] = {"slo": vars(slo), "target_rps": target, "price": price, "alpha": sweep.alpha,
                               "screen": [screen_summary(sweep, c) for c in [sweep.baseline, *sweep.trials]],
                               "confirmed": [costed_summary(c, target) for c in costed]}
    if target is not None:
        latency = "ttft" if slo.p95_ttft_s is not None else "tpot"
        front = front_of(family, costed, target, latency)
        lines += front_lines(front, target, latency)
        summary["pareto"] = [vars(p) for p in front]
    if sweep.prices:
        summary["gpu_types"] = {t: {"usd_per_gpu_hour": price, "cheapest": (costed_summary(best, target)
                                                                            if (best := cheapest_of(costed, t, target))
                                                                            else None)}
                                for t, price in sweep.prices.items()}
    if winner is None:
        lines.append(no_winner(sweep))
        summary["winner"] = None
        return lines, summary, None
    if base is None or base.cost is None or not cheaper_beyond_doubt(winner, base):
        # as the cost sweep: only a saving shown beyond doubt is exported; the cheapest estimate is kept, unclaimed
        lines.append(not_shown(winner, base, target))
        lines += unconfirmed(sweep, None)
        summary["winner"] = None
        summary["cheapest_not_shown"] = costed_summary(winner, target)
        return lines, summary, None
    low, high = winner.cost_ci
    line = (f"winner: {winner.label} {fmt_params(winner.params)}: capacity {capacity_words(winner)} "
            f"{interval(winner.knee.low, winner.knee.high)}, ${winner.cost:.4g} per million output tokens "
            f"{interval(low, high, '.4g')} ({winner.price.label()})")
    if target is not None:
        line += "; " + fleet_words(winner, target)
    lines.append(line)
    lines.append(versus_baseline(winner, base))
    lines += unconfirmed(sweep, winner)
    if tied:
        lines.append("tied with the winner (their cost intervals overlap its own): "
                     + ", ".join(f"{c.label} {fmt_params(c.params)}" for c in tied))
    summary["winner"] = {**costed_summary(winner, target), "tied": [c.label for c in tied],
                         "cheaper_than_baseline": True}  # beyond doubt: else nothing is exported
    return lines, summary, winner


def front_of(family: Sequence[Contender], costed: Sequence[Costed], target: float, latency: str
             ) -> list[FleetPoint]:
    runs = {c.label: c.records for c in family}
    return pareto(fleet_points([(c.label, c.params, c.rate, c.price.usd_per_gpu_hour * c.price.gpus,
                                 runs.get(c.label, [])) for c in costed], target), latency)


def front_lines(front: Sequence[FleetPoint], target: float, latency: str) -> list[str]:
    if not front:
        return []
    lines = [f"for {target:g} req/s, $/h against p95 {latency.upper()} (each confirmed configuration at the replicas "
             f"its capacity needs and up to {EXTRA_REPLICAS} more; p95s of its runs at the rate each replica "
             "carries), the Pareto front:"]
    for p in front:
        bound = "<= " if p.below_runs else ""
        lines.append(f"  {p.replicas} x {p.label} ({fmt_params(p.params)})  ${p.usd_per_hour:.4g}/h  "
                     f"{p.per_replica_rps:.3g} req/s a replica  p95 TTFT {bound}{p.p95_ttft_s * 1e3:.1f} ms  "
                     f"p95 TPOT {bound}{p.p95_tpot_s * 1e3:.2f} ms")
    return lines


def cheapest_of(costed: Sequence[Costed], gpu_type: str, target: float | None) -> Costed | None:
    mine = [c for c in costed if c.params.get(GPU_TYPE) == gpu_type and c.cost is not None]
    return min(mine, key=lambda c: sort_key(c, target), default=None)


def type_lines(sweep: GoodputSweep, costed: Sequence[Costed], target: float | None) -> list[str]:
    """Per GPU type, its cheapest confirmed configuration (the table users read to choose what to rent)."""
    lines = ["per GPU type, its cheapest confirmed configuration:"]
    for gpu_type, price in (sweep.prices or {}).items():
        best = cheapest_of(costed, gpu_type, target)
        head = f"  {gpu_type} at ${price:g}/GPU-hour:"
        lines.append(f"{head} none confirmed (see the screen)" if best is None else
                     confirmed_line(best, target, f"{head} {best.label} ({fmt_params(best.params)})"))
    return lines


def unconfirmed(sweep: GoodputSweep, winner: Costed | None) -> list[str]:
    """Configurations whose SLO held up to capacity.max_rate: not confirmed (no knee), perhaps cheaper."""
    kept = [c for c in [sweep.baseline, *sweep.trials] if not c.failed and c.search.status == ALWAYS_MET]
    return [f"not confirmed: {c.label} {fmt_params(c.params)} kept the SLO up to capacity.max_rate="
            f"{c.search.max_rate:g} req/s (at most ${sweep.usd_per_mtok(c, c.search.max_rate):.4g}/M"
            + (f", against the winner's ${winner.cost:.4g}" if winner is not None and winner.cost else "")
            + "): raise capacity.max_rate to measure it" for c in kept]


def versus_baseline(winner: Costed, base: Costed | None) -> str:
    if base is None or base.cost is None:
        return "against the baseline: it found no confirmed capacity of its own (see the screen)"
    words = f"the baseline's ${base.cost:.4g} {interval(*base.cost_ci, '.4g')}"
    if cheaper_beyond_doubt(winner, base):
        return f"cheaper than the baseline beyond doubt: {words}"
    if cheaper_beyond_doubt(base, winner):
        return f"[bold]the baseline is cheaper beyond doubt[/]: {words}; no configuration tried beats it"
    if base.knee.high is None:
        return (f"not told from the baseline: {words}; no rate of its knee failed the SLO beyond doubt, so its "
                "capacity has no upper bound there (more runs a rate, capacity.knee_replicates, or more requests "
                "a run tell more)")
    return f"not told from the baseline (the intervals overlap): {words}"


def not_shown(winner: Costed, base: Costed | None, target: float | None) -> str:
    """No configuration was shown cheaper than the baseline beyond doubt: what the cheapest estimate came to."""
    head = "no configuration was shown cheaper than the baseline, so none is exported (exit 1)"
    cheapest = (f"the cheapest estimate is {winner.label} {fmt_params(winner.params)}, ${winner.cost:.4g} per million "
                f"output tokens {interval(*winner.cost_ci, '.4g')}")
    if base is None or base.cost is None:
        return f"{head}: {cheapest}; the baseline found no confirmed capacity to compare it with (see the screen)"
    if sort_key(winner, target) >= sort_key(base, target):
        return f"{head}: none tried is cheaper than the baseline even by its estimate; {versus_baseline(winner, base)}"
    return f"{head}: {cheapest}; {versus_baseline(winner, base)}"


def no_winner(sweep: GoodputSweep) -> str:
    everyone = [sweep.baseline, *sweep.trials]
    best = max(((*found, c.label) for c in everyone if (found := best_attainment(c))), default=None)
    if all(c.failed or c.search.status == NEVER_MET for c in everyone) and best is not None:
        return (f"no configuration kept the SLO ({sweep.settings.slo.words()}) at any rate down to "
                f"capacity.min_rate: the best attainment was {best[0]:.1%}, by {best[2]} at {best[1]:.3g} req/s. "
                "Loosen the SLO, or search other flags")
    return "no winner: no configuration's confirmation found a capacity (see the lines above)"


def screen_summary(sweep: GoodputSweep, c: Contender) -> dict[str, Any]:
    rate = c.screen_rate() if not c.failed else None
    return {"config": c.label, "params": c.params, "status": "failed" if c.failed else c.search.status,
            "capacity_rps": rate, "usd_per_mtok": sweep.usd_per_mtok(c, rate) if rate else None,
            "runs": len(c.search.runs), "bracket": [c.search.low, c.search.high],  # single runs: kept, broke
            **({"reason": c.failed} if c.failed else {})}


def costed_summary(c: Costed, target: float | None) -> dict[str, Any]:
    return {"config": c.label, "params": c.params, "capacity_rps": c.rate, "capacity_at_least": c.at_least,
            "capacity_ci": [c.knee.low, c.knee.high], "usd_per_mtok_at_capacity": c.cost,
            "usd_per_mtok_ci": list(c.cost_ci), "gpus_per_replica": c.price.gpus,
            "usd_per_gpu_hour": c.price.usd_per_gpu_hour,
            **({"fleet": c.fleet(target)} if target is not None and c.rate else {})}


ANSWERS = ("winner:", "no configuration", "no winner")  # the lines that answer a goodput sweep


def page(out: Path, title: str, told: Sequence[str], summary: dict[str, Any], pictures: Sequence[Path]) -> Path:
    """report.html of a goodput sweep: its lines, the screen and the confirmation as tables, its picture."""
    answer = next((line for line in told if line.startswith(ANSWERS)), told[-1])
    screen = [(s["config"], fmt_params(s["params"]), s["status"], s["capacity_rps"], s["usd_per_mtok"], s["runs"])
              for s in summary["screen"]]
    confirmed = [(c["config"], fmt_params(c["params"]), c["capacity_rps"], c["capacity_ci"],
                  c["usd_per_mtok_at_capacity"], c["usd_per_mtok_ci"]) for c in summary["confirmed"]]
    sections = [html_page.Section("The sweep", text=told), html_page.Section("Screen", tables=[html_page.Table(
        ("config", "flags", "status", "capacity (req/s)", "$/M output tokens", "runs"), screen)])]
    if confirmed:
        ci = f"{1 - summary.get('alpha', 0.05):.0%} CI"
        sections.append(html_page.Section("Confirmed", tables=[html_page.Table(
            ("config", "flags", "capacity (req/s)", ci, "$/M output tokens at capacity", ci), confirmed)]))
    if pictures:
        sections.append(html_page.Section("Picture", pictures=pictures))
    return html_page.write(out, title, answer, sections)
