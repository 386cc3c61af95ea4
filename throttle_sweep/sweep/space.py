"""Search spaces: typed entries from Hydra's `space` group, checked, then turned into Optuna distributions.

    max_num_seqs: {type: int, low: 1, high: 64, log: true}
    enable_prefix_caching: {type: categorical, choices: [true, false]}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import optuna.distributions as od

from throttle_sweep.engines.flags import check_flags
from throttle_sweep.errors import ConfigError, nearest

KINDS = ("int", "float", "categorical")
ALLOWED_KEYS = {"int": {"type", "low", "high", "step", "log"}, "float": {"type", "low", "high", "step", "log"},
                "categorical": {"type", "choices"}}


def _nearest(keys: list[str]) -> str:
    """', did you mean ...' for keys close to a known one (a misspelt 'tpye')."""
    known = sorted(set().union(*ALLOWED_KEYS.values()))
    near = {k: nearest(k, known, n=1) for k in keys}
    said = [f"{k!r} -> {m[0]!r}" for k, m in near.items() if m]
    return f", did you mean {', '.join(said)}" if said else ""


def _number(value: Any, kind: str) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) if kind == "int" else isinstance(value, int | float)


def build_space(space: Mapping[str, Any], flag_schema: Mapping[str, Any], *, source: str
                ) -> dict[str, od.BaseDistribution]:
    """Check every entry and return flag -> Optuna distribution; ConfigError names source and key."""
    if not space:
        raise ConfigError(f"{source}: the search space is empty")
    return {flag: distribution(flag, entry, flag_schema, where=f"{source}: {flag}") for flag, entry in space.items()}


def distribution(flag: str, entry: Any, flag_schema: Mapping[str, Any], *, where: str) -> od.BaseDistribution:
    """One entry of a space, checked: its type and keys, then its choices or its range."""
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{where} must be a mapping with a 'type', but got {entry!r}")
    kind = entry.get("type")
    if kind is None:
        stray = sorted(set(entry) - set().union(*ALLOWED_KEYS.values()))
        raise ConfigError(f"{where} has no 'type' (one of {', '.join(KINDS)})"
                          + (f"; unknown key(s) {stray}" + _nearest(stray) if stray else ""))
    if kind not in KINDS:
        raise ConfigError(f"{where}.type must be one of {', '.join(KINDS)}, but got {kind!r}")
    extra = set(entry) - ALLOWED_KEYS[kind]
    if extra:
        raise ConfigError(f"{where}: unknown key(s) {sorted(extra)} for type {kind} "
                          f"(allowed: {sorted(ALLOWED_KEYS[kind])}){_nearest(sorted(extra))}")
    if kind == "categorical":
        choices = entry.get("choices")
        if not isinstance(choices, list | tuple) or not choices:
            raise ConfigError(f"{where}.choices must be a non-empty list, but got {choices!r}")
        for choice in choices:
            check_flags({flag: choice}, flag_schema, source=where)
        return od.CategoricalDistribution(list(choices))
    return numeric_range(flag, entry, kind, flag_schema, where=where)


def numeric_range(flag: str, entry: Mapping[str, Any], kind: str, flag_schema: Mapping[str, Any], *, where: str
                  ) -> od.BaseDistribution:
    low, high, step, log = entry.get("low"), entry.get("high"), entry.get("step"), bool(entry.get("log", False))
    for key, value in (("low", low), ("high", high)):
        if not _number(value, kind):
            raise ConfigError(f"{where}.{key} must be {'an integer' if kind == 'int' else 'a number'}, "
                              f"but got {value!r}")
    if low > high:
        raise ConfigError(f"{where}: low <= high must hold, but got (low={low}, high={high})")
    if log and low <= 0:
        raise ConfigError(f"{where}: a log scale needs low > 0, but got low={low}")
    if step is not None and (not _number(step, kind) or step <= 0):
        raise ConfigError(f"{where}.step must be a positive {'integer' if kind == 'int' else 'number'}, "
                          f"but got {step!r}")
    if step is not None and log:
        raise ConfigError(f"{where}: step and log cannot be combined")
    check_flags({flag: low}, flag_schema, source=where)  # the flag exists and takes this kind of value
    if kind == "int":
        return od.IntDistribution(low, high, log=log, step=step or 1)
    return od.FloatDistribution(float(low), float(high), log=log, step=step)


def grid(distributions: Mapping[str, od.BaseDistribution], limit: int = 10_000) -> dict[str, list[Any]]:
    """Every value of each flag, for Optuna's GridSampler; only finite spaces of a sane size."""
    values: dict[str, list[Any]] = {}
    size = 1
    for flag, dist in distributions.items():
        if isinstance(dist, od.CategoricalDistribution):
            values[flag] = list(dist.choices)
        elif isinstance(dist, od.IntDistribution) and not dist.log:
            values[flag] = list(range(dist.low, dist.high + 1, dist.step))
        elif isinstance(dist, od.IntDistribution):
            v, values[flag] = dist.low, []
            while v <= dist.high:  # powers of two on a log scale
                values[flag].append(v)
                v *= 2
        elif isinstance(dist, od.FloatDistribution) and dist.step:
            n = round((dist.high - dist.low) / dist.step)
            values[flag] = [dist.low + i * dist.step for i in range(n + 1)]
        else:
            raise ConfigError(f"sampler=grid needs a finite space, but {flag} is a continuous float without step")
        size *= len(values[flag])
    if size > limit:
        raise ConfigError(f"sampler=grid: the space has {size} points, more than {limit}")
    return values


def within_in_flight(distributions: Mapping[str, od.BaseDistribution], in_flight: int, *, source: str
                     ) -> tuple[dict[str, od.BaseDistribution], str | None]:
    """max_num_seqs above what a closed loop keeps in flight runs no more requests at once than that (a
    larger value can only cost memory), so those values are one configuration: keep the values up to the
    in-flight count, and the first one past it if the count itself is not a value (it stands for 'everything
    in flight'). Returns the space and a note when it shrank; a range of several values, none below the
    in-flight count, is refused: no value differs."""
    dist = distributions.get("max_num_seqs")
    if isinstance(dist, od.CategoricalDistribution):
        values = sorted(dist.choices)
    elif isinstance(dist, od.IntDistribution):
        values = list(range(dist.low, dist.high + 1, dist.step))
    else:
        return dict(distributions), None
    if len(values) == 1:  # a fixed value: nothing to search, nothing to cut
        return dict(distributions), None
    if values[0] >= in_flight:
        raise ConfigError(f"{source}: max_num_seqs ({values[0]} to {values[-1]}) lies wholly at or above the "
                          f"{in_flight} requests the workload keeps in flight, so every value runs the same: raise "
                          "workload.concurrency (and num_requests) or lower the range")
    keep = [v for v in values if v <= in_flight]
    if keep[-1] < in_flight:
        keep += [v for v in values if v > in_flight][:1]
    if len(keep) == len(values):
        return dict(distributions), None
    clipped = (od.CategoricalDistribution([c for c in dist.choices if c in keep])  # the user's order
               if isinstance(dist, od.CategoricalDistribution)
               else od.IntDistribution(dist.low, keep[-1], log=dist.log, step=dist.step))
    note = (f"{source}: max_num_seqs searched up to max_num_seqs={keep[-1]}, not {values[-1]}: the workload keeps "
            f"{in_flight} requests in flight, so larger values run no more at once (they can only cost memory); "
            "raise workload.concurrency (and num_requests) to search higher")
    return {**distributions, "max_num_seqs": clipped}, note
