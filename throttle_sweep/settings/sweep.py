"""A sweep's whole configuration, read from the composed config and checked once, before anything starts:
commands/sweep.py only wires what this returns."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import optuna
from omegaconf import DictConfig, OmegaConf

from throttle_sweep.engines import Engine
from throttle_sweep.errors import ConfigError
from throttle_sweep.measurement.cost import Price
from throttle_sweep.measurement.workload import WorkloadSpec
from throttle_sweep.settings.notes import few_replicates_note, kv_size_note, shared_engine_note
from throttle_sweep.settings.schema import CONF_DIR
from throttle_sweep.settings.sections import (
    arm_flags,
    cost_basis_from,
    endpoint_arms,
    engine_from,
    folder_name,
    measured_sections,
    plain,
    preflight,
    price_from,
    slots_from,
    thresholds_from,
    warm_engines_from,
    workload_from,
)
from throttle_sweep.sweep.boundary import choose_knob, ordered
from throttle_sweep.sweep.options import SweepSettings
from throttle_sweep.sweep.space import build_space, grid, within_in_flight

SAMPLERS = ("tpe", "gp", "random", "grid")


@dataclass(frozen=True)
class SweepRun:
    """Everything a sweep runs with. `measurement` is what its study records it measured with (a resume
    must match it); `config` is the whole resolved config, saved beside the results."""
    name: str
    out: Path
    storage: str
    engine: Engine
    spec: WorkloadSpec
    price: Price
    base: dict[str, Any]
    baseline: dict[str, Any]
    distributions: dict[str, Any]
    settings: SweepSettings
    sampler: str  # one of SAMPLERS; commands/sweep.make_sampler builds it
    seed: int
    grid: list[dict[str, Any]] | None  # sampler=grid: every grid point, in a seeded shuffled order
    warm: dict[str, Any]
    local_slots: tuple[int, str]  # (count, why) on this machine; (0, "ray") under Ray
    ray: dict[str, Any] | None  # the ray group when ray.enabled
    space: dict[str, Any]
    measurement: dict[str, Any]
    config: dict[str, Any]  # resolved: what claim_run_folder compares
    config_yaml: str  # as composed, interpolations unresolved (an ${oc.env:...} secret is not written out)
    plots: bool
    notes: tuple[str, ...]  # said before the sweep starts


def load_sweep(cfg: DictConfig) -> SweepRun:
    """Every check a sweep needs, in one pass; raises ConfigError naming the key that is wrong."""
    if cfg.space is None:
        raise ConfigError("a sweep needs a search space: add +space=batching (or memory, scheduler, or your own)")
    if cfg.workload.target_rps is not None:
        raise ConfigError("workload.target_rps sizes the replicas of a goodput sweep: add study.objective=goodput "
                          "and an SLO (slo.p95_ttft_s, slo.p95_tpot_s), or leave it unset")
    if cfg.backend == "endpoint":
        endpoint_arms(cfg)  # refuses: a sweep sets flags, and a server someone else runs takes none
    price, spec, engine = price_from(cfg), workload_from(cfg), engine_from(cfg)
    settings = settings_from(cfg)
    warm, local_slots = warm_engines_from(cfg), slots_from(cfg)
    name, out, storage = study_location(cfg)
    source = f"space '{space_name()}' ({space_file(space_name())})"
    distributions = build_space(plain(cfg.space), engine.flag_schema(), source=source)
    clip_note = None
    if spec.loop == "closed":
        distributions, clip_note = within_in_flight(distributions, in_flight(spec),
                                                    source=source)
    settings = replace(settings, boundary_knob=boundary_knob(cfg.study.boundary, distributions))
    sampler = sampler_from(cfg)
    # Optuna's GridSampler stops the study from inside `tell`, which ask-and-tell loops cannot use: the sweep
    # enqueues each grid point itself (grid_points), and the sampler only fills gaps
    points = grid_points(distributions, seed=cfg.study.seed) if sampler == "grid" else None
    base = arm_flags(plain(cfg.engine))
    baseline = arm_flags(base, plain(cfg.baseline))
    preflight(engine, baseline, spec, source="baseline")
    for flag, flags in space_extremes(base, distributions):  # the extremes of the space must pass the same checks
        preflight(engine, flags, spec, source=f"{source}: {flag}", refusals=False)
    notes = (few_replicates_note(settings.confirm_replicates, key="study.confirm_replicates"),
             shared_engine_note(warm), clip_note, kv_size_note(baseline, source="baseline"))
    measurement = measured_sections(cfg, spec)
    return SweepRun(name=name, out=out, storage=storage, engine=engine, spec=spec, price=price, base=base,
                    baseline=baseline, distributions=distributions, settings=settings, sampler=sampler,
                    seed=cfg.study.seed, grid=points, warm=warm, local_slots=local_slots,
                    ray=plain(cfg.ray) if cfg.ray.enabled else None, space=plain(cfg.space),
                    measurement=measurement, config=plain(cfg), config_yaml=OmegaConf.to_yaml(cfg),
                    plots=bool(cfg.plots), notes=tuple(n for n in notes if n is not None))


def in_flight(spec: WorkloadSpec) -> int:
    """The most a closed loop keeps in flight: every request, if fewer than its concurrency (work sized by
    time runs at least `concurrency` requests)."""
    return spec.concurrency if spec.replicate_s is not None else min(spec.concurrency, spec.num_requests)


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
                if Path(source.path).resolve() == Path(CONF_DIR).resolve():
                    break  # ours: named as the package names it, wherever it is installed
                return str(Path(source.path) / "space" / f"{name}.yaml")
    return f"throttle_sweep/conf/space/{name}.yaml"


def study_location(cfg: DictConfig) -> tuple[str, Path, str]:
    """(study name, results folder, storage URL)."""
    name = folder_name(cfg.study.name or cfg.run or f"sweep-{space_name()}", key="study.name")
    out = Path(cfg.results_dir) / name
    storage = cfg.study.storage or f"sqlite:///{out / 'study.db'}"
    return name, out, storage


def sampler_from(cfg: DictConfig) -> str:
    """study.sampler, one of SAMPLERS (sweep/study.make_sampler builds it)."""
    sampler = cfg.study.sampler
    if sampler not in SAMPLERS:
        raise ConfigError(f"study.sampler must be one of {', '.join(SAMPLERS)}, but got {sampler!r}")
    return sampler


def budgets_from(cfg: DictConfig) -> tuple[float | None, float | None]:
    """(study.timeout_s, study.budget_usd), each positive or null (sweep/budget.spent_by reads them)."""
    s = cfg.study
    for key in ("timeout_s", "budget_usd"):
        if s[key] is not None and s[key] <= 0:
            raise ConfigError(f"study.{key} must be > 0 (or null), but got {s[key]!r}")
    return s.timeout_s, s.budget_usd


def settings_from(cfg: DictConfig) -> SweepSettings:
    s = cfg.study
    for key in ("n_trials", "confirm_replicates"):
        if s[key] is None or s[key] < (1 if key == "n_trials" else 2):
            raise ConfigError(f"study.{key} must be at least {1 if key == 'n_trials' else 2}, but got {s[key]!r}")
    if not isinstance(s.tiebreak_replicates, int) or s.tiebreak_replicates < 0 or s.tiebreak_replicates % 2:
        raise ConfigError(f"study.tiebreak_replicates runs mirrored blocks, two runs of each tied candidate: it must "
                          f"be an even number, or 0 for none, but got {s.tiebreak_replicates!r}")
    if s.confirm_top < 0 or s.max_preemptions < 0:
        raise ConfigError("study.confirm_top and study.max_preemptions must be >= 0")
    budgets_from(cfg)
    for key in ("max_p95_ttft_s", "max_p95_tpot_s", "max_p95_itl_s"):
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
        confirm_replicates=s.confirm_replicates, tiebreak_replicates=s.tiebreak_replicates,
        token_tolerance=cfg.compare.token_tolerance,
        thresholds=thresholds_from(cfg), multi_objective=s.multi_objective,
        boundary_settings_max=s.boundary_settings_max, sequential=s.sequential, same_schedule=s.same_schedule,
        reference=s.reference, shared_baseline=s.shared_baseline, pooled_noise=s.pooled_noise)


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


def boundary_knob(wanted: str | None, distributions: dict[str, Any]) -> str | None:
    """The knob probed for the preemption boundary (study.boundary), checked against the space."""
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
