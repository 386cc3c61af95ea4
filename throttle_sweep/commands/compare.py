"""mode=compare: baseline vs candidate, interleaved on one engine slot, with a drift-aware verdict."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict
from functools import partial
from typing import Any

from omegaconf import DictConfig, OmegaConf
from rich.console import Console

from throttle_sweep.cluster.signals import deferred, shielded, stop_on_sigterm
from throttle_sweep.cluster.slot import WarmSlot
from throttle_sweep.measurement import calibration
from throttle_sweep.measurement.replicate import closing_notes
from throttle_sweep.report.comparison import lines, write
from throttle_sweep.report.progress import progress_for
from throttle_sweep.settings.compare import CompareRun, load_compare
from throttle_sweep.stats.analysis import Analysis, analyse, arm_labels
from throttle_sweep.stats.comparison import comparison_id, measured_positions, run_schedule
from throttle_sweep.stats.schedule import BASELINE, CANDIDATE
from throttle_sweep.store.lock import hold
from throttle_sweep.store.provenance import claim_run_folder
from throttle_sweep.store.records import RecordLog


def run(cfg: DictConfig, console: Console) -> int:
    r = load_compare(cfg)  # every check before any engine starts
    for note in r.notes:
        console.print(f"[yellow]note:[/] {note}", highlight=False)
    result = measure_comparison(r, cfg, console)
    return result if isinstance(result, int) else 0


def measure_comparison(r: CompareRun, cfg: DictConfig, console: Console, *,
                       context: Mapping[str, Any] | None = None, report_line: bool = True) -> Analysis | int:
    """The comparison `r` measured in its folder (saving `cfg` there), printed and summarised: its analysis,
    or the exit code of a calibration run that failed (1) or a run that was interrupted (130). `context`
    joins every record (mode=recheck names the export it re-measures)."""
    spec, engine, price, arms, order, warm, out = r.spec, r.engine, r.price, r.arms, r.order, r.warm, r.out
    with hold(out, what=f"run {out.name!r}"):  # one writer per results folder
        claim_run_folder(out, r.config, "compare")
        OmegaConf.save(cfg, out / "config.yaml")
        log = RecordLog(out / "replicates.jsonl", say=partial(console.print, highlight=False))
        spec = sized_by_time(spec, engine, price, arms[BASELINE], log, run_id=out.name, warm=warm,
                             say=console.print)
        if isinstance(spec, int):  # the calibration run failed, or was interrupted
            return spec
        comparison, done, discarded = fresh_or_complete(log.records, arms, order,
                                                        {"workload": asdict(spec), "backend": r.backend})
        labels = arm_labels(arms[BASELINE], arms[CANDIDATE])
        console.print(f"compare {labels[BASELINE]} vs {labels[CANDIDATE]}: order "
                      f"{' '.join('B' if a == BASELINE else 'C' for a in order)} ({r.schedule}"
                      f"{', the first run a warm-up' if r.warmup else ''}) -> {log.path}")
        if discarded:
            console.print(f"an earlier run left this comparison partial ({discarded} replicates, kept in the "
                          "records): it starts again from scratch, so that one engine process measures it all")
        elif done:
            console.print(f"already measured: all {len(done)} replicates")
        slot = WarmSlot(engine, spec, price, run_id=out.name, **warm)  # the environment is read where the engine runs
        measure = partial(_measure, slot, context={**(context or {}), "comparison": comparison,
                                                   "schedule": r.schedule, "runs_planned": len(order)},
                          warmup=r.warmup)
        progress = progress_for(console, len(order) - len(done), best=False)
        before = len(log.records)
        try:
            with stop_on_sigterm():
                records = run_schedule(
                    measure, arms, order, write=write_whole(log, then=progress.finished), done=done,
                    progress=lambda pos, arm: progress.step(f"{arm} ({labels[arm]}) at position {pos}"))
        except KeyboardInterrupt:
            with shielded():
                progress.stop()
                slot.close()
            console.print(f"[bold yellow]interrupted[/]: {len(log.records) - before} replicates measured in this "
                          f"run, every one in {log.path}. Run the same command again to measure the comparison: "
                          "it starts afresh (one engine process measures it whole); what was measured stays in "
                          "the records, marked partial by mode=analyze", highlight=False)
            return 130
        finally:
            progress.stop()
            slot.close()
        analysis = analyse(records, r.thresholds, token_tolerance=r.token_tolerance, labels=labels, cost=r.basis)
        for line in lines(analysis, r.thresholds, price):
            console.print(line, highlight=False)
        paths = write(out, analysis, r.thresholds, price, plot=r.plots)
    for note in closing_notes(records):
        console.print(f"[yellow]note:[/] {note}", highlight=False)
    console.print(f"summary: {paths['md']}")
    if report_line:  # a caller that rewrites the page says where it is itself
        console.print(f"report: {paths['html']}")
    return analysis


def sized_by_time(spec, engine, price, baseline, log: RecordLog, *, run_id: str, warm: dict, say):
    """The work every replicate runs: with workload.replicate_s, sized from the baseline's calibration run
    (made now, on an engine of its own, or read back from the records); else the exit code: 1 if the
    calibration run failed, 130 if it was interrupted."""
    if spec.replicate_s is None:
        return spec

    def run_baseline() -> dict:
        slot = WarmSlot(engine, spec, price, run_id=run_id, **warm)
        try:
            with stop_on_sigterm():
                record = slot.measure(baseline, BASELINE, 0, calibration.CONTEXT)
                with deferred():
                    log.append(record)
            return record
        finally:
            with shielded():
                slot.close()

    try:
        sized, sentence = calibration.size(spec, baseline, log.records, run_baseline)
    except KeyboardInterrupt:
        say("[bold yellow]interrupted[/] in the calibration run (workload.replicate_s); nothing else was "
            "measured. Run the same command again to start", highlight=False)
        return 130
    except calibration.Failed as exc:
        say(f"[red]{exc}[/]", highlight=False)
        return 1
    say(sentence, highlight=False)
    return sized


def fresh_or_complete(records: list[dict], arms: dict, order: list[str], extra: dict
                      ) -> tuple[str, dict[int, dict], int]:
    """(comparison id, its records, how many replicates of partial attempts were set aside): a comparison
    is measured whole in one run or not used; an interrupted one is started afresh as the next attempt."""
    attempt, discarded = 0, 0
    while True:
        comparison = comparison_id(arms, order, {**extra, **({"attempt": attempt} if attempt else {})})
        done = measured_positions(records, comparison)
        if not done or len(done) == len(order):
            return comparison, done, discarded
        discarded += len(done)
        attempt += 1


def write_whole(log: RecordLog, *, then: Callable[[], None]):
    """Append a record with Ctrl-C and SIGTERM held until it is written (never half a line, never lost)."""
    def write(record: dict) -> None:
        with deferred():
            log.append(record)
        then()

    return write


def _measure(slot, flags, arm, position, *, context, warmup):
    return slot.measure(flags, arm, position, {**context, "warmup": warmup and position == 0})
