"""A goodput sweep (`+space=NAME study.objective=goodput slo.p95_ttft_s=...`): the flags that keep a latency SLO
at the lowest cost per million output tokens, and the replicas `workload.target_rps` needs (sweep/goodput/driver.py).
Settings are checked in settings/goodput.py before any engine starts."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

import optuna
from omegaconf import DictConfig, OmegaConf
from rich.console import Console

from throttle_sweep.capacity.runs import ClientTooSlow, measure_rate, met_of, run_line
from throttle_sweep.cluster.gpu_types import make_typed_slots
from throttle_sweep.cluster.ray_runtime import ClusterError
from throttle_sweep.cluster.signals import shielded, stop_on_sigterm
from throttle_sweep.cluster.slot import WarmSlot
from throttle_sweep.commands.export import move_aside
from throttle_sweep.errors import ConfigError
from throttle_sweep.settings.goodput import GPU_TYPE, GoodputRun, load_goodput, without_type
from throttle_sweep.settings.sweep import space_extremes
from throttle_sweep.store.lock import hold
from throttle_sweep.store.provenance import claim_run_folder, overrides_for
from throttle_sweep.store.records import RecordLog, is_ok
from throttle_sweep.sweep.budget import spent_by
from throttle_sweep.sweep.export import export_best
from throttle_sweep.sweep.goodput import plot as sweep_plot
from throttle_sweep.sweep.goodput.driver import BASELINE, CONFIRM, BaselineFailed, Contender, GoodputSweep
from throttle_sweep.sweep.goodput.report import answer, costed_of, fmt_params, page
from throttle_sweep.sweep.study import make_sampler, open_study

SLOT_RETRIES = 2  # a run lost to its slot (a node died, a deadline passed) runs again this often, then the sweep stops


def run(cfg: DictConfig, console: Console) -> int:
    r = load_goodput(cfg)  # every check, before any engine starts
    say = partial(console.print, highlight=False)
    with hold(r.out, what=f"study {r.out.name!r}"):
        claim_run_folder(r.out, r.config, "goodput")
        study = open_goodput_study(r)  # before any engine starts: a storage that cannot be opened is refused
        OmegaConf.save(cfg, r.out / "config.yaml")
        log = RecordLog(r.out / "replicates.jsonl", say=say)
        slots, close = open_slots(r, say)

        def measure(c: Contender, rate: float, stage: str, search_stage: str, replicate: int) -> dict[str, Any]:
            context = {"stage": stage, "search_stage": search_stage, "config": c.label, "params": c.params}
            for _ in range(1 + SLOT_RETRIES):  # a run the slot lost is its node's doing, not the flags': again
                record = measure_rate(slots[c.gpu_type], c.flags, rate, context, log, r.capacity,
                                      "baseline" if c.label == BASELINE else "candidate", say, replicate)
                if not record.get("infrastructure"):
                    break
                say(f"[yellow]{c.label} at {rate:g} req/s: the slot lost the run[/] ({record.get('reason')})")
            else:
                raise ClusterError(f"{c.label}'s slot lost {1 + SLOT_RETRIES} runs in a row at {rate:g} req/s; every "
                                   "run so far is kept: run the same command again when the cluster is whole")
            if is_ok(record):
                met, counted = met_of(record, r.capacity)
                say(run_line(f"{c.label} {search_stage}", rate, record, met, counted,
                             met / counted >= r.capacity.slo.attainment, r.capacity))
            return record

        previous = sum(t.state.is_finished() for t in study.trials)
        sweep = GoodputSweep(settings=r.capacity, distributions=r.distributions, base=r.base, baseline=r.baseline,
                             price=r.price, n_trials=r.n_trials, confirm_top=r.confirm_top,
                             existing=list(log.records), measure=measure, say=say, study=study, alpha=r.alpha,
                             spent=budget(r, log, time.monotonic()), grid=r.grid, prices=r.prices,
                             baseline_type=r.baseline_type)
        say(f"goodput sweep {r.out.name!r}: {', '.join(r.distributions)} over {r.n_trials} trials against the "
            f"baseline {fmt_params(sweep.baseline.params)}; {r.capacity.slo.words()}"
            + (f"; the traffic to serve: {r.target_rps:g} req/s" if r.target_rps else "") + f" -> {log.path}")
        if r.storage is not None:  # else in memory: its seeded sampler proposes the same trials again
            say(f"study: {r.storage}" + (f"; resuming: {previous} trials already in it" if previous else ""))
        try:
            with stop_on_sigterm():
                sweep.screen()
                family = sweep.confirmed()
                sweep.confirm(family)
        except KeyboardInterrupt:
            say(f"[bold yellow]interrupted[/]: every run is kept in {log.path}; run the same command again to go on")
            return 130
        except (ClientTooSlow, BaselineFailed) as exc:
            say(f"[red]{exc}[/]")
            return 1
        finally:
            with shielded():
                close()
    if sweep.stopped_by is not None and (sweep.confirm_cut or not any(c.confirm_runs for c in family)):
        return stopped_before_answer(r, sweep.stopped_by, log, say)
    lines, summary, winner = answer(sweep, family, r.target_rps)
    for line in lines:
        say(line)
    (r.out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    say(f"summary: {r.out / 'summary.json'}")
    if r.plots:
        costed = [costed_of(sweep, c, len(family)) for c in family if not c.failed]
        try:
            for words in sweep_plot.draw(r.out, [sweep.baseline, *sweep.trials], costed,
                                         winner.label if winner else None, r.capacity):
                say(f"picture: {words}")
        except Exception as exc:  # a picture must not cost the sweep its export (as the cost sweep's report)
            say(f"[yellow]pictures not drawn[/]: {type(exc).__name__}: {exc}")
    pictures = [r.out / name for name in sweep_plot.PICTURES] if r.plots else []
    say(f"report: {page(r.out, f'goodput sweep {r.out.name}', lines, summary, pictures)}")
    if winner is None:
        if (r.out / "best").exists():  # an earlier run's winner is not this one's answer
            say(f"no winner to export; the earlier export was moved to {move_aside(r.out / 'best')}")
        return 1
    export(r, winner.params, summary["winner"], served_defaults(log.records, winner.label), say)
    return 0


def budget(r: GoodputRun, log: RecordLog, began: float) -> Callable[[], str | None]:
    """Why a budget stops the sweep now, or None: study.timeout_s since `began` (this run's, as the cost
    sweep's), study.budget_usd over every record (with GPU types, each at its own type's price)."""
    usd_per_gpu_hour = None if r.prices else r.price.usd_per_gpu_hour

    def spent() -> str | None:
        why = spent_by(began, log.records, timeout_s=r.timeout_s, budget_usd=r.budget_usd,
                       usd_per_gpu_hour=usd_per_gpu_hour)
        return why[2] if why is not None else None

    return spent


def stopped_before_answer(r: GoodputRun, why: str, log: RecordLog, say: Callable[[str], None]) -> int:
    """A budget spent before the confirmation's runs were done: nothing is claimed (exit 3, as the cost sweep)."""
    say(f"[bold yellow]stopped before an answer[/]: the budget ran out ({why}) before the confirmation's runs "
        f"were done, so no capacity is confirmed and nothing is claimed; every run is kept in {log.path}; raise "
        "study.timeout_s or study.budget_usd (or unset them) and run the same command again: it resumes")
    if (r.out / "best").exists():  # an earlier run's winner is not this one's answer
        say(f"the earlier export was moved to {move_aside(r.out / 'best')}")
    return 3


def open_goodput_study(r: GoodputRun) -> optuna.Study:
    """Its study: at study.storage, created or loaded to resume (its sampler seeded anew for the trials it
    holds); unset, in memory."""
    study = open_study(r.out.name, r.storage, ["minimize"], make_sampler(r.sampler, r.seed, r.n_trials),
                       unset="a study in memory (the records resume it)", objectives_from="a goodput sweep")
    if study.trials and study.user_attrs.get("objective") != "goodput":
        raise ConfigError(f"study {r.out.name!r} in {r.storage} holds another sweep's trials (a cost sweep's): "
                          "choose another study.name")
    study.set_user_attr("objective", "goodput")
    study.sampler = make_sampler(r.sampler, r.seed, r.n_trials, offset=len(study.trials))
    return study


def open_slots(r: GoodputRun, say: Any) -> tuple[dict[str | None, Any], Any]:
    """{GPU type: its slot} and the function that ends them: one Ray slot per type priced in cost.prices
    (cluster/gpu_types.py), else one local slot (type None)."""
    if r.prices is None:
        slot = WarmSlot(r.engine, r.capacity.spec, r.price, run_id=r.out.name, **r.warm)
        return {None: slot}, slot.close
    starts = [("baseline", r.baseline), *space_extremes(r.base, without_type(r.distributions))]
    prices = {t: replace(r.price, usd_per_gpu_hour=usd) for t, usd in r.prices.items()}
    slots, close = make_typed_slots(r.ray, r.engine, r.capacity.spec, prices, engine_flags=r.base, warm=r.warm,
                                    run_id=r.out.name, out=r.out, say=say, starts=starts)
    return dict(slots), close


def served_defaults(records: list[dict[str, Any]], label: str) -> dict[str, Any]:
    """The flags left to vLLM's default that the winner's confirmation runs resolved as `vllm serve` does
    (in-process engines record them): exported, so a server on another machine serves what was measured."""
    for record in records:
        if record.get("stage") == CONFIRM and record.get("config") == label and record.get("served_defaults"):
            return dict(record["served_defaults"])
    return {}


def export(r: GoodputRun, params: dict[str, Any], winner: dict[str, Any], defaults: dict[str, Any], say: Any) -> None:
    """The winner's `vllm serve` config, with its capacity and the replica count beside it (best.json), and
    the overrides that measure its capacity again (mode=capacity)."""
    gpu_type = params.get(GPU_TYPE)
    flags = {**r.base, **without_type(params)}
    flags.update({k: v for k, v in defaults.items() if flags.get(k) is None})  # what vLLM resolved for them
    remeasure = {"mode": "capacity", "backend": r.config["backend"], "engine": flags, "slo": r.config["slo"],
                 "capacity": r.config["capacity"], "workload": r.config["workload"]}
    if gpu_type is not None:  # measured again on a machine of its type, at its price
        remeasure["cost"] = {"usd_per_gpu_hour": r.prices[gpu_type], "gpus": r.price.gpus}
    paths = export_best(r.out / "best", engine_flags=r.engine.engine_flags(flags), params=params,
                        summary={"objective": "goodput", **winner}, hydra_overrides=overrides_for(remeasure))
    say(f"exported: {paths['yaml']}  (vllm serve --config), {paths['json']} (capacity and replicas)")
