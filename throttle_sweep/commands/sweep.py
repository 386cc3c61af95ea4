"""mode=sweep (or just `+space=NAME`): search, confirm, report, export."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from sqlalchemy.exc import SQLAlchemyError

from throttle_sweep.commands.compare import cost_basis_from, thresholds_from
from throttle_sweep.commands.export import export_keeping_the_old, move_aside
from throttle_sweep.errors import ConfigError
from throttle_sweep.measure import short_work_note
from throttle_sweep.pool import LocalPool
from throttle_sweep.progress import Progress, progress_for
from throttle_sweep.provenance import claim_run_folder, differences, has_records, refuse_conflicts
from throttle_sweep.records import RecordLog
from throttle_sweep.runlock import hold
from throttle_sweep.search.boundary import choose_knob, ordered
from throttle_sweep.search.driver import Sweep
from throttle_sweep.search.options import SweepSettings
from throttle_sweep.search.report import baseline_words, lines, write_report
from throttle_sweep.search.runner import SweepStopped
from throttle_sweep.search.space import build_space, grid, within_in_flight
from throttle_sweep.search.trials import resume_key, same_yardstick
from throttle_sweep.settings import (
    arm_flags,
    endpoint_arms,
    engine_from,
    few_replicates_note,
    folder_name,
    kv_size_note,
    plain,
    preflight,
    price_from,
    shared_engine_note,
    slots_from,
    warm_engines_from,
    workload_from,
)
from throttle_sweep.signals import shielded, stop_on_sigterm
from throttle_sweep.slot import WarmSlot

SAMPLERS = ("tpe", "gp", "random", "grid")


def space_name() -> str:
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return HydraConfig.get().runtime.choices.get("space") or "custom"
    return "custom"


def space_file(name: str) -> str:
    """Where `space/NAME.yaml` was found: ours in the package's conf/, or the user's own (hydra.searchpath)."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        for source in HydraConfig.get().runtime.config_sources:
            if source.schema == "file" and (Path(source.path) / "space" / f"{name}.yaml").exists():
                return str(Path(source.path) / "space" / f"{name}.yaml")
    return f"throttle_sweep/conf/space/{name}.yaml"


def study_location(cfg: DictConfig) -> tuple[str, Path, str]:
    """(study name, results folder, storage URL)."""
    name = folder_name(cfg.study.name or cfg.run or f"sweep-{space_name()}", key="study.name")
    out = Path(cfg.results_dir) / name
    storage = cfg.study.storage or f"sqlite:///{out / 'study.db'}"
    return name, out, storage


def make_sampler(cfg: DictConfig, distributions: dict[str, Any], parallel: bool, offset: int = 0
                 ) -> optuna.samplers.BaseSampler:
    kind, seed = cfg.study.sampler, cfg.study.seed
    if offset:  # a resumed study: a seed of its own, well mixed (nearby seeds can start alike)
        seed = int(np.random.SeedSequence([seed, offset]).generate_state(1)[0])

    if kind == "tpe":
        startup = max(3, min(10, cfg.study.n_trials // 3))
        # constraints (preemption, latency limits) reach the samplers through Trial.set_constraint (search/trials.py)
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup, constant_liar=parallel)
    if kind == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if kind == "grid":  # the sweep enqueues each grid point (see grid_points); the sampler only fills gaps
        grid(distributions)
        return optuna.samplers.RandomSampler(seed=seed)
    raise ConfigError(f"study.sampler must be one of {', '.join(SAMPLERS)}, but got {kind!r}")


def settings_from(cfg: DictConfig) -> SweepSettings:
    s = cfg.study
    for key in ("n_trials", "confirm_replicates"):
        if s[key] is None or s[key] < (1 if key == "n_trials" else 2):
            raise ConfigError(f"study.{key} must be at least {1 if key == 'n_trials' else 2}, but got {s[key]!r}")
    if s.confirm_top < 0 or s.max_preemptions < 0:
        raise ConfigError("study.confirm_top and study.max_preemptions must be >= 0")
    for key in ("timeout_s", "budget_usd", "max_p95_ttft_s", "max_p95_tpot_s", "max_p95_itl_s"):
        if s[key] is not None and s[key] <= 0:
            raise ConfigError(f"study.{key} must be > 0 (or null), but got {s[key]!r}")
    if s.reference not in ("auto", "baseline"):
        raise ConfigError(f"study.reference must be auto or baseline, but got {s.reference!r}")
    return SweepSettings(
        n_trials=s.n_trials, timeout_s=s.timeout_s, budget_usd=s.budget_usd,
        usd_per_gpu_hour=cfg.cost.usd_per_gpu_hour, max_preemptions=s.max_preemptions,
        max_p95_ttft_s=s.max_p95_ttft_s, max_p95_tpot_s=s.max_p95_tpot_s, max_p95_itl_s=s.max_p95_itl_s,
        cost_basis=cost_basis_from(cfg), schedule=cfg.compare.schedule,
        replicates=cfg.compare.replicates, schedule_seed=cfg.compare.seed, confirm_top=s.confirm_top,
        warmup_replicate=cfg.compare.warmup_replicate,
        confirm_replicates=s.confirm_replicates, token_tolerance=cfg.compare.token_tolerance,
        thresholds=thresholds_from(cfg), multi_objective=s.multi_objective,
        boundary_settings_max=s.boundary_settings_max, sequential=s.sequential, same_schedule=s.same_schedule,
        reference=s.reference, shared_baseline=s.shared_baseline)


def run(cfg: DictConfig, console: Console) -> int:
    if cfg.space is None:
        raise ConfigError("a sweep needs a search space: add +space=batching (or memory, scheduler, or your own)")
    if cfg.backend == "endpoint":
        endpoint_arms(cfg)  # refuses: a sweep sets flags, and a server someone else runs takes none
    price, spec, engine = price_from(cfg), workload_from(cfg), engine_from(cfg)
    settings = settings_from(cfg)
    warm_engines_from(cfg)  # checked before anything starts
    slots_from(cfg)
    name, out, storage = study_location(cfg)
    source = f"space '{space_name()}' ({space_file(space_name())})"
    distributions = build_space(plain(cfg.space), engine.flag_schema(), source=source)
    clip_note = None
    if spec.loop == "closed":
        distributions, clip_note = within_in_flight(distributions, min(spec.concurrency, spec.num_requests),
                                                    source=source)
    settings = replace(settings, boundary_knob=boundary_knob(cfg, distributions))
    base = arm_flags(plain(cfg.engine))
    baseline = arm_flags(base, plain(cfg.baseline))
    preflight(engine, baseline, spec, source="baseline")
    for flag, flags in space_extremes(base, distributions):  # the extremes of the space must pass the same checks
        preflight(engine, flags, spec, source=f"{source}: {flag}")
    if (note := few_replicates_note(settings.confirm_replicates, key="study.confirm_replicates")) is not None:
        console.print(f"[yellow]note:[/] {note}", highlight=False)  # the winner's interval is a confirmation's
    if (note := shared_engine_note(warm_engines_from(cfg))) is not None:
        console.print(f"[yellow]note:[/] {note}", highlight=False)
    for note in (clip_note, kv_size_note(baseline, source="baseline")):
        if note is not None:
            console.print(f"[yellow]note:[/] {note}", highlight=False)
    with hold(out, what=f"study {name!r}"):  # one writer: records, study and leftovers are ours alone
        return run_locked(cfg, console, name=name, out=out, storage=storage, distributions=distributions,
                          base=base, baseline=baseline, spec=spec, engine=engine, price=price, settings=settings)


def run_locked(cfg: DictConfig, console: Console, *, name: str, out: Path, storage: str, distributions: dict[str, Any],
               base: dict[str, Any], baseline: dict[str, Any], spec: Any, engine: Any, price: Any,
               settings: SweepSettings) -> int:
    say = partial(console.print, highlight=False)
    claim_run_folder(out, plain(cfg), "sweep")  # before the study: a measure or compare folder is not taken over
    study = open_study(cfg, name, storage, distributions, settings)  # a bad sampler fails here, before any engine
    measurement = {"backend": cfg.backend, "engine": plain(cfg.engine), "baseline": baseline,
                   "workload": asdict(spec), "cost": plain(cfg.cost)}
    same_measurement(study, measurement, measured=has_records(out))
    same_yardstick(study, settings, name)
    log = RecordLog(out / "replicates.jsonl", say=say)
    before = len(log.records)
    closer, progress, sweep = None, None, None
    try:
        with stop_on_sigterm():
            # every set of flags the sweep may start: a Ray slot must hold the GPUs of the largest engine
            starts = [("baseline", baseline), *((f"space.{flag}={flags[flag]}", flags)
                                                for flag, flags in space_extremes(base, distributions))]
            pool, closer = make_pool(cfg, engine, spec, price, run_id=name, out=out, say=say, starts=starts)
            # what this run measures with, written once its slots are up (a run refused before that, say by
            # a Ray cluster that does not answer, leaves the study's record of its configuration as it was)
            for key, value in measurement.items():
                study.set_user_attr(key, value)
            OmegaConf.save(cfg, out / "config.yaml")
            sweep, progress = open_sweep(cfg, console, study, name=name, storage=storage, distributions=distributions,
                                         base=base, baseline=baseline, spec=spec, pool=pool, log=log,
                                         settings=settings)
            result = sweep.run()
    except (KeyboardInterrupt, SweepStopped) as exc:
        with shielded():  # a second Ctrl-C or SIGTERM must not cut the clean-up short
            if progress is not None:
                progress.stop()
            if closer is not None:
                closer()
                closer = None
            if sweep is not None:  # a replicate that finished while the slots were being closed
                sweep.keep_finished(cut_short=False)
            why = "interrupted" if isinstance(exc, KeyboardInterrupt) else f"stopped: {exc}"
            say(f"[bold yellow]{why}[/]: {len(log.records) - before} replicates measured in this run, every one in "
                f"{log.path}; trials in flight stay open and the next run takes them over. Run the same command "
                "again to resume.")
        return 130 if isinstance(exc, KeyboardInterrupt) else 3
    finally:
        if progress is not None:
            progress.stop()
        if closer is not None:
            with shielded():
                closer()
    for line in lines(result, price, settings.max_preemptions):
        say(line)
    if (note := short_work_note(log.records)) is not None:
        say(f"[yellow]note:[/] {note}")
    report = write_report(out, result, price, settings.max_preemptions, plots=cfg.plots)
    say(f"report: {report}")
    if result.winner is None:
        study.set_user_attr("winner", None)  # an earlier run's winner is not this study's answer any more
        if (out / "best").exists():
            say(f"no winner to export; the earlier export was moved to {move_aside(out / 'best')}")
        return 0
    est = (result.winner.adjusted or result.winner.analysis).estimate
    study.set_user_attr("winner", {"trial": result.winner.source_trial, "params": result.winner.params,
                                   "ratio": est.ratio, "ci": [est.ci_low, est.ci_high],
                                   "key": resume_key(study.trials[result.winner.source_trial])})
    paths = export_keeping_the_old(study, out, say)
    say(f"exported: {paths['yaml']}  (vllm serve --config), {paths['cmd']}")
    return 0


def same_measurement(study: optuna.Study, now: Mapping[str, Any], *, measured: bool) -> None:
    """A study's ratios are against one baseline, on one engine, workload, backend and price: a resume with
    any of them changed would rank ratios (and costs) measured with different things side by side, so it is
    refused, naming each key. A study that has measured nothing yet (no run came back ok) takes this run's.
    (The run records `now` once its slots are up: the export serves what was measured.)"""
    if not measured:
        return
    recorded = {k: study.user_attrs.get(k) for k in now if study.user_attrs.get(k) is not None}
    if "engine" in recorded:  # a null flag and a missing one are both vLLM's default
        recorded["engine"] = arm_flags(recorded["engine"])
    found = differences(recorded, {**now, "engine": arm_flags(now["engine"])})
    refuse_conflicts(found, what=f"study {study.study_name!r} was measured with another configuration",
                     advice="Its ratios cannot be ranked with new ones: choose another study.name")


def open_study(cfg: DictConfig, name: str, storage: str, distributions: dict[str, Any],
               settings: SweepSettings) -> optuna.Study:
    """Create the study, or load it to resume; refused if its objectives differ from this run's."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the sweep says what it opened, in its own words
    directions = ["minimize", "minimize"] if settings.multi_objective else ["minimize"]
    try:
        study = optuna.create_study(study_name=name, storage=storage, directions=directions, load_if_exists=True,
                                    sampler=make_sampler(cfg, distributions, parallel=False))
    except ValueError as exc:
        raise ConfigError(f"study {name!r} in {storage} cannot be opened: {exc}") from exc
    except (ImportError, OSError, SQLAlchemyError) as exc:  # no driver for the URL, a server that does not answer
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        raise ConfigError(f"study.storage={storage!r} cannot be opened ({type(exc).__name__}: {reason}); give an "
                          "Optuna storage URL that works here (sqlite:///path/study.db, or a database this "
                          "machine can reach with its driver installed), or leave study.storage unset for "
                          "results/<study.name>/study.db") from None
    if len(study.directions) != len(directions):
        raise ConfigError(f"study {name!r} in {storage} has {len(study.directions)} objective(s), but "
                          f"study.multi_objective={settings.multi_objective} needs {len(directions)}; "
                          "choose another study.name")
    return study


def open_sweep(cfg: DictConfig, console: Console, study: optuna.Study, *, name: str, storage: str,
               distributions: dict[str, Any], base: dict[str, Any], baseline: dict[str, Any], spec: Any,
               pool: Any, log: RecordLog, settings: SweepSettings) -> tuple[Sweep, Progress]:
    """The driver around the study, and its live progress; the sampler knows how many slots run at once, and a
    resumed study gets a fresh seed (the same seed would propose the points it proposed last time again)."""
    previous = sum(1 for t in study.trials if t.state.is_finished())
    study.sampler = make_sampler(cfg, distributions, parallel=pool.size > 1, offset=len(study.trials))
    study.set_user_attr("space", plain(cfg.space))
    with warnings.catch_warnings():  # set_metric_names is "experimental"; it names the axes in optuna-dashboard
        warnings.simplefilter("ignore")
        # the ratio is to the search's yardstick: the baseline, or the reference point (study attr `reference`)
        study.set_metric_names(["cost_ratio", "p95_e2e_s"][: len(study.directions)])
    console.print(f"sweep '{name}': {', '.join(distributions)} over {settings.n_trials} trials, "
                  f"{'up to ' if settings.sequential else ''}{settings.replicates}+{settings.replicates} interleaved "
                  f"replicates each ({settings.schedule}{', after a warm-up run' if settings.warmup_replicate else ''}"
                  f"{', stopping once decided' if settings.sequential else ''}), {pool.size} slot(s); "
                  + (f"preemption boundary along {settings.boundary_knob} probed first; " if settings.boundary_knob
                     else "") + f"{baseline_words(baseline)}, flags {baseline}; study {storage}")
    if previous:
        console.print(f"resuming: {previous} trials and {len(log.records)} replicates already in the study")
    progress = progress_for(console, 0)  # the driver plans its runs as it goes (search/events.py)
    sweep = Sweep(study=study, distributions=distributions, base_flags=base, baseline_flags=baseline,
                  workload_key={"workload": asdict(spec), "backend": cfg.backend}, pool=pool,
                  write=log.append, existing=log.records, settings=settings,
                  grid=grid_points(distributions, seed=cfg.study.seed) if cfg.study.sampler == "grid" else None,
                  progress=progress)
    return sweep, progress


def grid_points(distributions: dict[str, Any], *, seed: int) -> list[dict[str, Any]]:
    """Every grid point in a seeded shuffled order. Optuna's GridSampler stops the study from inside `tell`,
    which ask-and-tell loops cannot use; so the sweep enqueues the next unanswered point just before it asks,
    which leaves no waiting trials behind and puts a resumed trial before new points."""
    import itertools
    import random

    values = grid(distributions)
    points = [dict(zip(values, combo, strict=True)) for combo in itertools.product(*values.values())]
    random.Random(seed).shuffle(points)
    return points


def boundary_knob(cfg: DictConfig, distributions: dict[str, Any]) -> str | None:
    """The knob probed for the preemption boundary (study.boundary), checked against the space."""
    wanted = cfg.study.boundary
    knob = choose_knob(distributions, wanted)
    if knob is not None and (knob not in distributions or not ordered(distributions[knob])):
        ordered_knobs = [k for k, d in distributions.items() if ordered(d)]
        raise ConfigError(f"study.boundary must be auto, none or an ordered knob of the space "
                          f"({', '.join(ordered_knobs) or 'none has an order'}), but got {wanted!r}")
    return knob


def space_extremes(base: Mapping[str, Any], distributions: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Each knob at each end of its range (every choice of a categorical one), on the base flags."""
    return [(flag, {**base, flag: value}) for flag, dist in distributions.items() for value in _extremes(dist)]


def _extremes(dist: Any) -> list[Any]:
    if isinstance(dist, optuna.distributions.CategoricalDistribution):
        return list(dist.choices)
    return [dist.low, dist.high]


def make_pool(cfg: DictConfig, engine: Any, spec: Any, price: Any, *, run_id: str, out: Path,
              say: Callable[[str], None], starts: Sequence[tuple[str, Mapping[str, Any]]] = ()):
    """This machine's slots (`slots`), or Ray actors (cluster.py) when ray.enabled."""
    if cfg.ray.enabled:
        from throttle_sweep.cluster import make_ray_pool

        return make_ray_pool(cfg, engine, spec, price, run_id=run_id, out=out, say=say, starts=starts)
    count, why = slots_from(cfg)
    if count > 1:
        say(f"{count} slots on this machine ({why}; slots=1 for one): each comparison runs all its replicates on "
            "one slot, side by side with the others")
    # a slot reads the environment where its engines run: the driver need not import vLLM
    slots = [WarmSlot(engine, spec, price, run_id=run_id, name=f"local-{i}", **warm_engines_from(cfg))
             for i in range(count)]
    for slot in slots:
        slot.warm_up()
    pool = LocalPool([slot.measure for slot in slots])

    def close() -> None:
        pool.close()
        for slot in slots:
            slot.close()  # a replicate under way on a slot's thread ends with its engine process
        pool.join()

    return pool, close
