"""mode=compare: baseline vs candidate, interleaved on one engine slot, with a drift-aware verdict."""

from __future__ import annotations

from dataclasses import asdict
from functools import partial

from omegaconf import DictConfig, OmegaConf
from rich.console import Console

from throttle_sweep.analysis import analyse, arm_labels
from throttle_sweep.compare import comparison_id, measured_positions, run_schedule
from throttle_sweep.measure import measure_replicate
from throttle_sweep.progress import Progress
from throttle_sweep.records import append_record, read_records
from throttle_sweep.report import lines, write
from throttle_sweep.schedule import BASELINE, CANDIDATE, make_schedule
from throttle_sweep.settings import (
    arm_flags,
    engine_from,
    plain,
    preflight,
    price_from,
    run_dir,
    workload_from,
)
from throttle_sweep.stats import Thresholds


def thresholds_from(cfg: DictConfig) -> Thresholds:
    t = Thresholds(cfg.compare.alpha, cfg.compare.min_effect, cfg.compare.equivalence_margin)
    t.check()
    return t


def run(cfg: DictConfig, console: Console) -> int:
    price, spec, engine, thresholds = price_from(cfg), workload_from(cfg), engine_from(cfg), thresholds_from(cfg)
    base = plain(cfg.engine)
    arms = {BASELINE: arm_flags(base, plain(cfg.baseline)), CANDIDATE: arm_flags(base, plain(cfg.candidate))}
    for arm, flags in arms.items():
        preflight(engine, flags, spec, source=arm)
    order = make_schedule(cfg.compare.schedule, cfg.compare.replicates, seed=cfg.compare.seed)
    out = run_dir(cfg)
    out.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, out / "config.yaml")
    path = out / "replicates.jsonl"
    comparison = comparison_id(arms, order, {"workload": asdict(spec), "backend": cfg.backend})
    done = measured_positions(read_records(path), comparison) if path.exists() else {}
    labels = arm_labels(arms[BASELINE], arms[CANDIDATE])
    console.print(f"compare {labels[BASELINE]} vs {labels[CANDIDATE]}: order "
                  f"{' '.join('B' if a == BASELINE else 'C' for a in order)} ({cfg.compare.schedule}) -> {path}")
    if done:
        console.print(f"resuming: {len(done)} of {len(order)} replicates already measured")
    environment = engine.environment()
    measure = partial(_measure, engine, spec, price, run_id=out.name, environment=environment,
                      context={"comparison": comparison, "schedule": cfg.compare.schedule})
    progress = Progress(console, len(order) - len(done))
    records = run_schedule(
        measure, arms, order, write=partial(append_record, path), done=done,
        progress=lambda pos, arm: progress.step(f"{arm} ({labels[arm]}) at position {pos}"))
    analysis = analyse(records, thresholds, token_tolerance=cfg.compare.token_tolerance, labels=labels)
    for line in lines(analysis, thresholds, price):
        console.print(line, highlight=False)
    paths = write(out, analysis, thresholds, price, plot=cfg.plots)
    console.print(f"summary: {paths['md']}")
    return 0


def _measure(engine, spec, price, flags, arm, position, *, run_id, environment, context):
    return measure_replicate(engine, flags, spec, price, run_id=run_id, arm=arm, position=position,
                             environment=environment, context=context)
