"""mode=sweep (or just `+space=NAME`): search, confirm, report, export. The configuration is read and checked
in settings/sweep.py; this module wires the study, the slots and the driver, and says what they found."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from functools import partial
from typing import Any

import optuna
from omegaconf import DictConfig
from rich.console import Console

from throttle_sweep.cluster.open import make_pool
from throttle_sweep.cluster.pool import Job
from throttle_sweep.cluster.signals import deferred, shielded, stop_on_sigterm
from throttle_sweep.commands.export import export_keeping_the_old, move_aside
from throttle_sweep.engines.base import engine_refusal
from throttle_sweep.measurement import calibration
from throttle_sweep.measurement.replicate import closing_notes
from throttle_sweep.report.progress import Progress, progress_for
from throttle_sweep.settings.goodput import objective_of
from throttle_sweep.settings.sections import arm_flags
from throttle_sweep.settings.sweep import SweepRun, load_sweep, space_extremes
from throttle_sweep.stats.comparison import MAX_ATTEMPTS
from throttle_sweep.stats.schedule import BASELINE
from throttle_sweep.store.lock import hold
from throttle_sweep.store.provenance import claim_run_folder, differences, has_records, refuse_conflicts
from throttle_sweep.store.records import RecordLog
from throttle_sweep.sweep.driver import Sweep
from throttle_sweep.sweep.gpu_time import gpu_time
from throttle_sweep.sweep.report import baseline_words, lines, no_answer, write_report
from throttle_sweep.sweep.runner import BaselineFails, SweepStopped
from throttle_sweep.sweep.study import make_sampler as study_sampler
from throttle_sweep.sweep.study import open_study as shared_open_study
from throttle_sweep.sweep.trials import resume_key, same_yardstick


def make_sampler(run: SweepRun, parallel: bool, offset: int = 0) -> optuna.samplers.BaseSampler:
    return study_sampler(run.sampler, run.seed, run.settings.n_trials, parallel=parallel, offset=offset)


def run(cfg: DictConfig, console: Console) -> int:
    if objective_of(cfg) == "goodput":  # the production question: capacity within an SLO (sweep/goodput/driver.py)
        from throttle_sweep.commands import goodput

        return goodput.run(cfg, console)
    sweep_run = load_sweep(cfg)  # every check, before anything starts
    for note in sweep_run.notes:
        console.print(f"[yellow]note:[/] {note}", highlight=False)
    with hold(sweep_run.out, what=f"study {sweep_run.name!r}"):  # one writer: records, study and leftovers are ours
        return run_locked(sweep_run, console)


def run_locked(run: SweepRun, console: Console) -> int:
    say = partial(console.print, highlight=False)
    out, settings = run.out, run.settings
    claim_run_folder(out, run.config, "sweep")  # before the study: a measure or compare folder is not taken over
    study = open_study(run)
    same_measurement(study, run.measurement, measured=has_records(out))
    same_yardstick(study, settings, run.name)
    log = RecordLog(out / "replicates.jsonl", say=say)
    before = len(log.records)
    closer, progress, sweep = None, None, None
    try:
        with stop_on_sigterm():
            # every set of flags the sweep may start: a Ray slot must hold the GPUs of the largest engine
            starts = [("baseline", run.baseline), *((f"space.{flag}={flags[flag]}", flags)
                                                    for flag, flags in space_extremes(run.base, run.distributions))]
            if run.spec.replicate_s is not None:  # the work sized by time: the baseline's pace, measured once
                run = sized_by_time(run, log, say, starts[:1])
                same_measurement(study, run.measurement, measured=True)
            pool, closer = make_pool(run, say=say, starts=starts)
            # what this run measures with, written once its slots are up (a run refused before that, say by
            # a Ray cluster that does not answer, leaves the study's record of its configuration as it was)
            for key, value in run.measurement.items():
                study.set_user_attr(key, value)
            (out / "config.yaml").write_text(run.config_yaml)
            sweep, progress = open_sweep(run, console, study, pool=pool, log=log)
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
    for line in lines(result, run.price, settings.max_preemptions):
        say(line)
    for note in closing_notes(log.records):
        say(f"[yellow]note:[/] {note}")
    twins = {(r.get("environment") or {}).get("device_name") for r in log.records
             if (r.get("environment") or {}).get("device") == "twin"}
    if twins:
        say(gpu_time(log.records).text(", ".join(sorted(map(str, twins)))))
    report = write_report(out, result, run.price, settings.max_preemptions, plots=run.plots,
                          latency_limits=settings.latency_limits)
    say(f"report: {report.with_suffix('.html')} (and {report.name})")
    if result.winner is None:
        study.set_user_attr("winner", None)  # an earlier run's winner is not this study's answer any more
        if (out / "best").exists():
            say(f"no winner to export; the earlier export was moved to {move_aside(out / 'best')}")
        return 3 if no_answer(result) is not None else 0  # stopped before an answer, as a SweepStopped is
    est = (result.winner.adjusted or result.winner.analysis).estimate
    study.set_user_attr("winner", {"trial": result.winner.source_trial, "params": result.winner.params,
                                   "ratio": est.ratio, "ci": [est.ci_low, est.ci_high],
                                   "key": resume_key(study.trials[result.winner.source_trial]),
                                   **({"p_best": sure.best, "p_within_margin": sure.within}
                                      if (sure := result.certainty) is not None else {}),
                                   **({"tiebreak": {"trials": tie.trials, "runs_each": tie.replicates}}
                                      if (tie := result.tiebreak) is not None and tie.observations else {})})
    paths = export_keeping_the_old(study, out, say)
    say(f"exported: {paths['yaml']}  (vllm serve --config), {paths['cmd']}")
    return 0


def sized_by_time(run: SweepRun, log: RecordLog, say: Callable[[str], None],
                  starts: Sequence[tuple[str, Mapping[str, Any]]]) -> SweepRun:
    """The run with its work sized from the baseline's calibration run: read back from the records, or made
    now on a slot of its own (again if the slot was lost). The size joins what the study records it measured
    with, so a study never ranks ratios of two works."""
    try:
        spec, sentence = calibration.size(run.spec, run.baseline, log.records,
                                          lambda: calibrate(run, log, say, starts), attempts=MAX_ATTEMPTS)
    except calibration.Failed as exc:
        raise BaselineFails(str(exc)) from None
    say(sentence)
    return replace(run, spec=spec, measurement={**run.measurement, "calibrated_num_requests": spec.num_requests})


def calibrate(run: SweepRun, log: RecordLog, say: Callable[[str], None],
              starts: Sequence[tuple[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """The baseline once, at the configured size, on a pool of one slot; its record is written at once."""
    one = replace(run, local_slots=(1, ""), ray=run.ray and {**run.ray, "slots": 1})
    pool, close = make_pool(one, say=say, starts=starts)
    try:
        pool.submit(Job(pool.slots[0], run.baseline, BASELINE, 0, calibration.CONTEXT))
        [(job, record)] = pool.wait()
        with deferred():
            log.append(record)
            pool.written(job)
        return record
    finally:
        with shielded():
            close()


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


def open_study(run: SweepRun) -> optuna.Study:
    """Create the study, or load it to resume; refused if its objectives differ from this run's."""
    multi = run.settings.multi_objective
    return shared_open_study(run.name, run.storage, ["minimize", "minimize"] if multi else ["minimize"],
                             make_sampler(run, parallel=False), unset="results/<study.name>/study.db",
                             objectives_from=f"study.multi_objective={multi}")


def open_sweep(run: SweepRun, console: Console, study: optuna.Study, *, pool: Any, log: RecordLog
               ) -> tuple[Sweep, Progress]:
    """The driver around the study, and its live progress; the sampler knows how many slots run at once, and a
    resumed study gets a fresh seed (the same seed would propose the points it proposed last time again)."""
    settings, distributions, baseline = run.settings, run.distributions, run.baseline
    previous = sum(1 for t in study.trials if t.state.is_finished())
    study.sampler = make_sampler(run, parallel=pool.size > 1, offset=len(study.trials))
    study.set_user_attr("space", run.space)
    with warnings.catch_warnings():  # set_metric_names is "experimental"; it names the axes in optuna-dashboard
        warnings.simplefilter("ignore")
        # the ratio is to the search's yardstick: the baseline, or the reference point (study attr `reference`)
        study.set_metric_names(["cost_ratio", "p95_e2e_s"][: len(study.directions)])
    console.print(f"sweep '{run.name}': {', '.join(distributions)} over {settings.n_trials} trials, "
                  f"{'up to ' if settings.sequential else ''}{settings.replicates}+{settings.replicates} interleaved "
                  f"replicates each ({settings.schedule}{', after a warm-up run' if settings.warmup_replicate else ''}"
                  f"{', stopping once decided' if settings.sequential else ''}), {pool.size} slot(s); "
                  + (f"preemption boundary along {settings.boundary_knob} probed first; " if settings.boundary_knob
                     else "") + f"{baseline_words(baseline)}, flags {baseline}; study {run.storage}")
    if previous:
        console.print(f"resuming: {previous} trials and {len(log.records)} replicates already in the study")
    progress = progress_for(console, 0)  # the driver plans its runs as it goes (sweep/events.py)
    sweep = Sweep(study=study, distributions=distributions, base_flags=run.base, baseline_flags=baseline,
                  workload_key={"workload": asdict(run.spec), "backend": run.measurement["backend"]}, pool=pool,
                  write=log.append, existing=log.records, settings=settings, grid=run.grid,
                  progress=progress, refusal=partial(engine_refusal, run.engine))
    return sweep, progress
