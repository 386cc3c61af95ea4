"""A goodput sweep's settings (`study.objective=goodput`), checked before any engine starts: the space and the
baseline as a cost sweep reads them, the SLO and the rate search as mode=capacity reads them, and the traffic
to serve (`workload.target_rps`), which sizes the replicas."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from omegaconf import DictConfig

from throttle_sweep.engines import Engine
from throttle_sweep.errors import ConfigError
from throttle_sweep.measurement.cost import Price
from throttle_sweep.settings.capacity import CapacitySettings, capacity_from
from throttle_sweep.settings.sections import (
    arm_flags,
    engine_from,
    folder_name,
    plain,
    preflight,
    price_from,
    thresholds_from,
    warm_engines_from,
    workload_from,
)
from throttle_sweep.settings.sweep import (
    budgets_from,
    grid_points,
    sampler_from,
    space_extremes,
    space_file,
    space_name,
)
from throttle_sweep.sweep.space import build_space

OBJECTIVES = ("cost", "goodput")
GPU_TYPE = "gpu_type"  # the knob cost.prices adds: a configuration's params name its type, its flags do not


def without_type(params: dict[str, Any]) -> dict[str, Any]:
    """Params (or distributions) less the GPU type knob: what goes to the engine as flags."""
    return {k: v for k, v in params.items() if k != GPU_TYPE}


@dataclass(frozen=True)
class GoodputRun:
    capacity: CapacitySettings  # the SLO, the rate search (a template: each configuration gets its own)
    engine: Engine
    price: Price
    base: dict[str, Any]  # the engine's flags, on which the space's knobs are set
    baseline: dict[str, Any]
    distributions: dict[str, Any]
    target_rps: float | None  # the traffic to serve: replicas = ceil(target / capacity)
    n_trials: int
    confirm_top: int
    seed: int
    warm: dict[str, Any]
    plots: bool
    out: Path
    config: dict[str, Any]
    prices: dict[str, float] | None = None  # GPU type -> USD per GPU-hour: the type is a knob (cluster/gpu_types.py)
    baseline_type: str | None = None
    ray: dict[str, Any] | None = None  # the ray group, when the types' slots are on Ray
    sampler: str = "tpe"  # study.sampler: proposes the trials (sweep/study.make_sampler)
    storage: str | None = None  # study.storage: a persistent study that resumes it; None: in memory
    grid: list[dict[str, Any]] | None = None  # sampler=grid: every grid point, enqueued in a new study
    timeout_s: float | None = None  # this run's wall time: no new trial, nor confirmation run, once spent
    budget_usd: float | None = None  # every record's dollars at the assumed price: the same
    alpha: float = 0.05  # compare.alpha: the confirmation's family-wise alpha (Bonferroni over the family)


def objective_of(cfg: DictConfig) -> str:
    objective = cfg.study.objective
    if objective not in OBJECTIVES:
        raise ConfigError(f"study.objective must be one of {', '.join(OBJECTIVES)}, but got {objective!r}")
    return objective


def target_from(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"workload.target_rps is the traffic to serve, a positive number of requests/s, but got "
                          f"{value!r}")
    return float(value)


def load_goodput(cfg: DictConfig) -> GoodputRun:
    if cfg.space is None:
        raise ConfigError("a goodput sweep needs a search space: add +space=batching (or your own)")
    if cfg.backend == "endpoint":
        raise ConfigError("a goodput sweep sets engine flags, and a server someone else runs takes none: use "
                          "backend=vllm, server or fake (mode=capacity measures an endpoint's capacity)")
    prices, baseline_type = prices_from(cfg)
    if cfg.ray.enabled and prices is None:
        raise ConfigError("a goodput sweep runs on one local slot (its comparisons interleave in time on it), or on "
                          "one Ray slot per GPU type priced in cost.prices: set ray.enabled=false, or cost.prices")
    if prices is not None and not cfg.ray.enabled:
        raise ConfigError("cost.prices makes the GPU type a knob, and the types are the Ray cluster's nodes' "
                          "(`accelerator_type:<type>`): set ray.enabled=true (and ray.address to join the cluster)")
    if cfg.slo.p95_ttft_s is None and cfg.slo.p95_tpot_s is None:
        raise ConfigError("study.objective=goodput needs a latency SLO: set slo.p95_ttft_s and/or slo.p95_tpot_s "
                          "(seconds)")
    capacity = capacity_from(cfg, workload_from(cfg))
    target = target_from(cfg.workload.target_rps)
    s = cfg.study
    if not isinstance(s.n_trials, int) or s.n_trials < 1:
        raise ConfigError(f"study.n_trials must be at least 1, but got {s.n_trials!r}")
    sampler, (timeout_s, budget_usd), alpha = sampler_from(cfg), budgets_from(cfg), thresholds_from(cfg).alpha
    if not isinstance(s.confirm_top, int) or s.confirm_top < 1:
        raise ConfigError(f"study.confirm_top must be at least 1 (the winner is re-measured), but got "
                          f"{s.confirm_top!r}")
    price, engine = price_from(cfg, typed=True), engine_from(cfg)
    if prices is not None and s.n_trials < len(prices):
        raise ConfigError(f"study.n_trials={s.n_trials} cannot try each of the {len(prices)} GPU types in cost.prices "
                          "(each is tried first): raise study.n_trials")
    source = f"space '{space_name()}' ({space_file(space_name())})"
    distributions = build_space(plain(cfg.space), engine.flag_schema(), source=source)
    base = arm_flags(plain(cfg.engine))
    baseline = arm_flags(base, plain(cfg.baseline))
    preflight(engine, baseline, capacity.spec, source="baseline")
    for flag, flags in space_extremes(base, distributions):
        preflight(engine, flags, capacity.spec, source=f"{source}: {flag}", refusals=False)
    if prices is not None:  # (a space cannot name it: it is no engine flag)
        distributions[GPU_TYPE] = optuna.distributions.CategoricalDistribution(list(prices))
    name = folder_name(s.name or cfg.run or f"goodput-{space_name()}", key="study.name")
    return GoodputRun(capacity=capacity, engine=engine, price=price, base=base, baseline=baseline,
                      distributions=distributions, target_rps=target, n_trials=s.n_trials, confirm_top=s.confirm_top,
                      seed=s.seed, warm=warm_engines_from(cfg), plots=bool(cfg.plots),
                      out=Path(cfg.results_dir) / name, config=plain(cfg), prices=prices,
                      baseline_type=baseline_type, ray=plain(cfg.ray) if prices is not None else None,
                      sampler=sampler, storage=s.storage,
                      grid=grid_points(distributions, seed=s.seed) if sampler == "grid" else None,
                      timeout_s=timeout_s, budget_usd=budget_usd, alpha=alpha)


def prices_from(cfg: DictConfig) -> tuple[dict[str, float] | None, str | None]:
    """cost.prices (GPU type -> USD per GPU-hour) and the baseline's type, checked; (None, None) unset."""
    given, baseline_type = cfg.cost.prices, cfg.cost.baseline_type
    if given is None:
        if baseline_type is not None:
            raise ConfigError(f"cost.baseline_type={baseline_type!r} names a GPU type, but cost.prices is unset: "
                              "price the types, e.g. cost.prices='{A100: 1.39, H100: 2.49}'")
        return None, None
    prices = plain(given)
    if not isinstance(prices, dict) or not prices:
        raise ConfigError(f"cost.prices maps GPU types to USD per GPU-hour, e.g. {{A100: 1.39, H100: 2.49}}, but got "
                          f"{prices!r}")
    for gpu_type, price in prices.items():
        if isinstance(price, bool) or not isinstance(price, int | float) or not math.isfinite(price) or price <= 0:
            raise ConfigError(f"cost.prices.{gpu_type} must be a positive price per GPU-hour, but got {price!r}")
    baseline_type = baseline_type if baseline_type is not None else next(iter(prices))
    if baseline_type not in prices:
        raise ConfigError(f"cost.baseline_type={baseline_type!r} is not priced in cost.prices (its types: "
                          f"{', '.join(prices)})")
    return {str(k): float(v) for k, v in prices.items()}, str(baseline_type)
