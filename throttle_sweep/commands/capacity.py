"""mode=capacity: the highest arrival rate at which one configuration keeps its latency SLO, with an interval,
and its goodput and cost per million tokens there (capacity/)."""

from __future__ import annotations

import json
from functools import partial
from typing import Any

from omegaconf import DictConfig, OmegaConf
from rich.console import Console

from throttle_sweep.capacity.knee import Knee, fit_knee
from throttle_sweep.capacity.rates import FOUND, RateSearch
from throttle_sweep.capacity.report import page, plot, sentences, summary
from throttle_sweep.capacity.runs import ClientTooSlow, measure_rate, met_of, run_line, usable
from throttle_sweep.capacity.steady import counted, summary_of
from throttle_sweep.cluster.signals import shielded, stop_on_sigterm
from throttle_sweep.cluster.slot import WarmSlot
from throttle_sweep.errors import ConfigError
from throttle_sweep.report.html_page import flag_words
from throttle_sweep.settings.capacity import CapacitySettings, load_capacity
from throttle_sweep.store.lock import hold
from throttle_sweep.store.provenance import claim_run_folder
from throttle_sweep.store.records import RecordLog, is_ok

STAGE = "capacity"


def run(cfg: DictConfig, console: Console) -> int:
    r = load_capacity(cfg)
    settings, price, engine, flags, out = r.settings, r.price, r.engine, r.flags, r.out
    spec, slo = settings.spec, settings.slo
    say = partial(console.print, highlight=False)
    with hold(out, what=f"run {out.name!r}"):  # one writer per results folder
        claim_run_folder(out, r.config, "capacity")
        OmegaConf.save(cfg, out / "config.yaml")
        log = RecordLog(out / "replicates.jsonl", say=say)
        search = settings.search
        replay(search, log.records, settings)
        arrivals = (f"Poisson arrivals over at least {settings.run_s:g} s and {spec.num_requests} requests a run"
                    if settings.trace_rps is None else f"the trace's {spec.num_requests} requests a run, sped up to "
                    f"each rate (its own pace: {settings.trace_rps:.3g} req/s)")
        say(f"capacity of {flags} on {engine.name}: {slo.words()}; {arrivals}, each run's warm-up chosen from "
            f"its own requests (MSER-5) -> {log.path}")
        for note in settings.notes:
            say(f"[yellow]note[/]: {note}")
        if search.runs:
            say(f"resuming: {len(search.runs)} runs already measured")
        slot = WarmSlot(engine, spec, price, run_id=out.name, **r.warm)
        try:
            with stop_on_sigterm():
                code = measure_all(search, slot, flags, log, settings, say)
        except KeyboardInterrupt:
            say(f"[bold yellow]interrupted[/]: {len(search.runs)} runs are kept in {log.path}; run the same "
                "command again to go on")
            return 130
        finally:
            with shielded():
                slot.close()
        if code:
            return code
    ok = [r for r in log.records if measured(r)]
    knee = fit_knee([(r.rate, r.met, r.counted) for r in search.knee_runs], slo.attainment) \
        if search.status == FOUND else None
    knee_records = [r for r in ok if r.get("search_stage") == "knee"]
    result = {**summary(search, knee, ok, slo, price.charged(flags)), "run_s": settings.run_s,  # what the capacity
              **summary_of([(r, counted(r, slo)[2]) for r in knee_records])}  # depends on, said with it
    (out / "summary.json").write_text(json.dumps(result, indent=2) + "\n")
    show(knee, say)
    told = sentences(result, search, slo)
    if settings.trace_rps is not None and result.get("capacity_rps") is not None:
        low, high = (x / settings.trace_rps if x is not None else None for x in result.get("capacity_ci", [None] * 2))
        told.append(f"this trace, sped up {'at least ' if result.get('capacity_at_least') else ''}"
                    f"{result['capacity_rps'] / settings.trace_rps:.3g} times, still meets the "
                    "SLO" + (f" (95% CI [{low:.3g}, {high:.3g}] times)" if low is not None and high is not None
                             else ""))
    for line in told:
        say(line)
    pictures = []
    if r.plots and ok:
        plot(ok, [attainment_share(r, settings) for r in ok], knee, slo, out / "capacity.png", flag_words(flags))
        say(f"plot: {out / 'capacity.png'}")
        pictures.append(out / "capacity.png")
    say(f"summary: {out / 'summary.json'}")
    say(f"report: {page(out, f'capacity of {flag_words(flags)} on {engine.name}', told, result, knee, pictures)}")
    return 0 if result.get("capacity_rps") is not None else 1


def measured(record: dict[str, Any]) -> bool:
    return usable(record, STAGE)


def attainment_share(record: dict[str, Any], settings: CapacitySettings) -> float:
    met, n = met_of(record, settings)
    return met / n if n else 0.0


def replay(search: RateSearch, records: list[dict[str, Any]], settings: CapacitySettings) -> None:
    """Tell the search the runs an earlier run of this command measured, in their order: it asks for the same
    rates again (it is deterministic), so a resume goes on where it stopped."""
    for record in filter(measured, records):
        step = search.next()
        rate = record["workload"]["rate"]
        if step is None or abs(rate - step[0]) > 1e-9 * step[0] or record.get("search_stage") != step[1]:
            raise ConfigError(f"the records in this run's folder follow another search (a run at {rate:g} req/s "
                              f"where this one asks for {step[0] if step else 'none'}): choose another run=NAME")
        search.tell(rate, *met_of(record, settings), step[1])


def measure_all(search: RateSearch, slot: WarmSlot, flags: dict[str, Any], log: RecordLog,
                settings: CapacitySettings, say: Any) -> int:
    """Run the rates the search asks for, each record written as it comes; 1 when a run fails."""
    while (step := search.next()) is not None:
        rate, stage = step
        try:
            record = measure_rate(slot, flags, rate, {"stage": STAGE, "search_stage": stage}, log, settings, STAGE,
                                  say, replicate=search.replicate_of(rate))
        except ClientTooSlow as exc:
            say(f"[red]{exc}[/]")
            return 1
        if not is_ok(record):
            say(f"[red]the run at {rate:g} req/s failed: {record.get('reason')}[/]; the runs so far are kept")
            return 1
        met, n = met_of(record, settings)
        search.tell(rate, met, n, stage)
        say(run_line(stage, rate, record, met, n, search.holds(search.runs[-1]), settings))
    return 0


def show(knee: Knee | None, say: Any) -> None:
    if knee is None:
        return
    say("rate (req/s)  runs  attainment: requests that met the SLO, all its runs  verdict (one-sided, alpha/2)")
    for lv in knee.levels:
        say(f"{lv.rate:12.4g}  {lv.runs:4d}  {lv.attainment:6.1%} ({lv.met}/{lv.counted})  {lv.verdict}")
