"""mode=compare's settings, read from the config once and checked before any engine starts: the two arms
(engine flags, or two endpoints), the interleaved order, the thresholds and the notes worth printing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from throttle_sweep.engines import Engine
from throttle_sweep.measurement.cost import Price
from throttle_sweep.measurement.workload import WorkloadSpec
from throttle_sweep.settings.notes import concurrency_note, few_replicates_note, kv_size_note, shared_engine_note
from throttle_sweep.settings.sections import (
    arm_flags,
    cost_basis_from,
    endpoint_arms,
    engine_from,
    plain,
    preflight,
    price_from,
    run_dir,
    thresholds_from,
    warm_engines_from,
    workload_from,
)
from throttle_sweep.stats.schedule import BASELINE, CANDIDATE, make_schedule, with_warmup
from throttle_sweep.stats.verdict import Thresholds


@dataclass(frozen=True)
class CompareRun:
    price: Price
    spec: WorkloadSpec
    engine: Engine
    thresholds: Thresholds
    basis: str  # the cost the verdict judges
    warm: dict[str, Any]  # how the slot keeps its engines (settings.sections.warm_engines_from)
    arms: dict[str, dict[str, Any]]  # baseline and candidate: engine flags, or an endpoint each
    order: list[str]  # the interleaved arms, the warm-up run first if there is one
    schedule: str
    warmup: bool
    token_tolerance: float
    plots: bool
    backend: str
    out: Path
    config: dict[str, Any]  # the whole config, as the run folder records it
    notes: list[str]  # said before anything runs


def load_compare(cfg: DictConfig) -> CompareRun:
    price, spec, engine, thresholds = price_from(cfg), workload_from(cfg), engine_from(cfg), thresholds_from(cfg)
    basis, warm = cost_basis_from(cfg), warm_engines_from(cfg)
    if cfg.backend == "endpoint":  # two servers the user runs, by URL, each checked to answer
        arms = endpoint_arms(cfg)
    else:
        base = plain(cfg.engine)
        arms = {BASELINE: arm_flags(base, plain(cfg.baseline)), CANDIDATE: arm_flags(base, plain(cfg.candidate))}
        for arm, flags in arms.items():
            preflight(engine, flags, spec, source=arm)
    c = cfg.compare
    notes = [note for arm, flags in arms.items()
             for note in (concurrency_note(flags, spec, source=arm), kv_size_note(flags, source=arm))]
    order = make_schedule(c.schedule, c.replicates, seed=c.seed, lead=c.lead)
    notes += [few_replicates_note(c.replicates, key="compare.replicates"), shared_engine_note(warm)]
    return CompareRun(price=price, spec=spec, engine=engine, thresholds=thresholds, basis=basis, warm=warm,
                      arms=arms, order=with_warmup(order) if c.warmup_replicate else order, schedule=c.schedule,
                      warmup=bool(c.warmup_replicate), token_tolerance=c.token_tolerance, plots=bool(cfg.plots),
                      backend=cfg.backend, out=run_dir(cfg), config=plain(cfg),
                      notes=[n for n in notes if n is not None])
