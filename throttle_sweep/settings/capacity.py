"""mode=capacity's settings, checked before any engine starts: the SLO, the rate search, the workload as an
open loop (its arrival rate is what the search sets)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from throttle_sweep.capacity.rates import RateSearch
from throttle_sweep.capacity.slo import Slo
from throttle_sweep.engines import Engine
from throttle_sweep.errors import ConfigError
from throttle_sweep.measurement.cost import Price
from throttle_sweep.measurement.workload import WorkloadSpec
from throttle_sweep.settings.sections import (
    engine_from,
    plain,
    price_from,
    run_dir,
    single_arm,
    warm_engines_from,
    workload_from,
)


@dataclass(frozen=True)
class CapacitySettings:
    slo: Slo
    search: RateSearch  # a fresh search, not yet told of any run
    spec: WorkloadSpec  # an open loop; its rate is the first run's
    run_s: float
    trace_rps: float | None = None  # a trace's mean arrival rate at speed 1: a rate searched is a speed-up of it
    notes: tuple[str, ...] = ()  # what runs but changes how to read the answer, said before the first run

    def at(self, rate: float, replicate: int = 0, scale: int = 1) -> dict[str, Any]:
        """The workload of a run at `rate`: arrivals spanning at least run_s, so that a fast rate still reaches
        a steady queue (a fixed count would arrive at once and drain, whatever the engine's capacity). The
        `replicate`-th run at a rate draws its own arrival schedule and its own prompts (the same at every
        rate): which schedule and prompts a run drew are part of its noise, which replicates sharing them would
        never show. A trace is replayed
        whole, sped up to `rate` on average: its own arrival schedule, every replicate. `scale` lengthens a run
        whose steady state its length could not show (runs.measure_rate): the same schedule, run on longer."""
        if self.trace_rps is not None:
            return {"loop": "open", "rate": rate, "trace_speed": rate / self.trace_rps}
        return {"loop": "open", "rate": rate,
                "num_requests": max(self.spec.num_requests, math.ceil(rate * self.run_s)) * scale,
                "seed": self.spec.seed + replicate, "arrival_seed": self.spec.seed + replicate}


def positive(value: object, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{key} must be a positive number of requests/s, but got {value!r}")
    return float(value)


def capacity_from(cfg: DictConfig, spec: WorkloadSpec) -> CapacitySettings:
    trace_rps = None if spec.trace is None else mean_rate(spec)
    slo = Slo(**plain(cfg.slo))
    slo.check()
    c = plain(cfg.capacity)
    if spec.rate is not None and not (isinstance(spec.rate, int | float) and math.isfinite(spec.rate)
                                      and spec.rate > 0):
        raise ConfigError(f"workload.rate must be a positive number of requests/s (the first rate a capacity "
                          f"search runs), but got {spec.rate!r}; or leave it out (null)")
    start = c["rate_start"]
    if start is None:
        start = trace_rps or (spec.rate if spec.loop == "open" and spec.rate else 1.0)
    start = positive(start, "capacity.rate_start")
    low, high = positive(c["min_rate"], "capacity.min_rate"), positive(c["max_rate"], "capacity.max_rate")
    if not low < start < high:
        raise ConfigError(f"capacity.rate_start ({start:g}) must lie between capacity.min_rate ({low:g}) and "
                          f"capacity.max_rate ({high:g})")
    if not 0 < c["rel_tol"] <= 1:
        raise ConfigError(f"capacity.rel_tol must be above 0 and at most 1, but got {c['rel_tol']!r}")
    if not isinstance(c["knee_rates"], int) or c["knee_rates"] < 3:
        raise ConfigError(f"capacity.knee_rates must be an integer >= 3, but got {c['knee_rates']!r}")
    if not isinstance(c["knee_replicates"], int) or c["knee_replicates"] < 2 or c["knee_replicates"] % 2:
        raise ConfigError(f"capacity.knee_replicates must be an even integer >= 2 (the runs at a rate say how "
                          f"noisy it is; half run in ascending order of rate, half descending, so that drift "
                          f"cancels), but got {c['knee_replicates']!r}")
    if not c["knee_margin"] >= 0:
        raise ConfigError(f"capacity.knee_margin must be >= 0, but got {c['knee_margin']!r}")
    if c.get("settle_share") is not None:
        raise ConfigError(f"capacity.settle_share={c['settle_share']!r}: a fixed share of each run is no longer "
                          "dropped; each run's warm-up is chosen from its own requests (MSER-5, with a trend test: "
                          "docs/statistics.md#capacity-the-steady-state-of-a-run). Remove the key")
    if spec.num_requests < 20:
        raise ConfigError(f"workload.num_requests={spec.num_requests} is too few to tell a share of requests "
                          "meeting the SLO: use at least 20 (a few hundred for a steady queue)")
    if not (isinstance(c["run_s"], int | float) and math.isfinite(c["run_s"]) and c["run_s"] > 0):
        raise ConfigError(f"capacity.run_s must be a positive number of seconds, but got {c['run_s']!r}")
    if spec.replicate_s is not None:
        raise ConfigError("workload.replicate_s sizes closed-loop work; mode=capacity runs an open loop: set "
                          "workload.num_requests, with workload.replicate_s=null")
    search = RateSearch(start=start, target=slo.attainment, rel_tol=c["rel_tol"], knee_rates=c["knee_rates"],
                        knee_replicates=c["knee_replicates"], knee_margin=c["knee_margin"], min_rate=low,
                        max_rate=high)
    notes = () if c["knee_replicates"] != 2 else (
        "capacity.knee_replicates=2: with 2 runs a rate the test of a rate has 1 degree of freedom (t = 12.7 at "
        "95%), so no rate holds beyond doubt, not even one met by every request twice; the capacity is then "
        "bounded from below at best: 4 or more runs a rate are advised",)
    return CapacitySettings(slo, search, replace(spec, loop="open", rate=start), float(c["run_s"]),
                            trace_rps, notes)


def mean_rate(spec: WorkloadSpec) -> float:
    """A trace's requests per second at speed 1, over its window: what a rate searched is a speed-up of."""
    from throttle_sweep.measurement.trace import replayed

    lines = replayed(replace(spec, trace_speed=1.0))
    span = lines[-1].at_s - lines[0].at_s
    if span <= 0:
        raise ConfigError(f"workload.trace {spec.trace!r}: all {len(lines)} requests of its window arrive at "
                          f"{lines[0].at_s:g} s, so the trace has no pace to speed up; mode=capacity and the goodput "
                          "sweep search a trace's speed-up: give a trace whose arrivals spread over time")
    return (len(lines) - 1) / span


@dataclass(frozen=True)
class CapacityRun:
    settings: CapacitySettings
    price: Price
    engine: Engine
    flags: dict[str, Any]  # the one configuration measured: engine flags, or an endpoint
    warm: dict[str, Any]  # how the slot keeps its engine (settings.sections.warm_engines_from)
    plots: bool
    out: Path
    config: dict[str, Any]  # the whole config, as the run folder records it


def load_capacity(cfg: DictConfig) -> CapacityRun:
    price, engine = price_from(cfg), engine_from(cfg)
    settings = capacity_from(cfg, workload_from(cfg))
    return CapacityRun(settings=settings, price=price, engine=engine, flags=single_arm(cfg, engine, settings.spec),
                       warm=warm_engines_from(cfg), plots=bool(cfg.plots), out=run_dir(cfg), config=plain(cfg))
