"""mode=plan's settings, read once and checked before anything is computed: the study (its folder under
results/) and the demand curve, both read whole here, so bad input is refused by name before any work."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig

from throttle_sweep.errors import ConfigError
from throttle_sweep.replica_plan.demand import Bucket, check_bucket_s, read_demand
from throttle_sweep.replica_plan.studied import Study, read_study
from throttle_sweep.settings.sweep import study_location


@dataclass(frozen=True)
class PlanRun:
    study: Study
    demand: str  # the path, as given
    buckets: list[Bucket]
    plots: bool


def load_plan(cfg: DictConfig) -> PlanRun:
    if not cfg.study.name:
        raise ConfigError("mode=plan needs study.name=NAME: a finished capacity study (mode=capacity, its run=NAME) "
                          "or goodput sweep (study.objective=goodput) under results/")
    if not cfg.plan.demand:
        raise ConfigError("mode=plan needs plan.demand=PATH: a CSV of start_s,requests_per_s rows (examples/"
                          "demand-day.csv), or a trace whose arrivals are counted in buckets of plan.bucket_s")
    bucket_s = check_bucket_s(cfg.plan.bucket_s)
    name, folder, _ = study_location(cfg)
    config = None if cfg.plan.config is None else str(cfg.plan.config)
    study = read_study(name, folder, config)
    return PlanRun(study, str(cfg.plan.demand), read_demand(str(cfg.plan.demand), bucket_s), bool(cfg.plots))
