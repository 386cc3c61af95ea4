"""Flags the engine refuses at start, in a sweep: decided before any start (the engine's `refusal`: vLLM's own
config checks, engines/vllm_validation.py), never run, told to the study as infeasible under a constraint of
their own ('refused', never counted as preempting), and listed by the report apart from the preemption
boundary. A failed start would otherwise read as preempting and be bisected into a boundary of its own.

The probe stage's hook is `probe_distribution`: the boundary knob's values less those refused with a setting of
the other knobs, which also keeps the refused stretches for the report."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution

from throttle_sweep.engines.flags import flags_key
from throttle_sweep.sweep.boundary import knob_values
from throttle_sweep.sweep.state import StudyView

REFUSED = "refused"  # the trials' source and status, and their constraint's name


def refused(view: StudyView, params: Mapping[str, Any]) -> str | None:
    """The engine's reason for refusing this point's flags at start, or None."""
    return view.refusal(view.candidate_flags(params))


def tell_refused(view: StudyView, trial: optuna.trial.Trial, reason: str) -> None:
    """A proposal the engine refuses: told infeasible at once, never started. It has no cost; its value is the
    yardstick's (1), which nothing ranks, as it breaks its constraint."""
    for key, value in {"source": REFUSED, "status": REFUSED, "reason": reason, "constraints": [1.0],
                       "constraint_names": [REFUSED]}.items():
        trial.set_user_attr(key, value)
    trial.set_constraint(REFUSED, 1.0)
    view.study.tell(trial, [1.0, 0.0] if view.settings.multi_objective else 1.0)


def probe_distribution(view: StudyView, knob: str, others: Mapping[str, Any]) -> BaseDistribution | None:
    """The values of `knob` the probes may run with the other knobs set to `others`: its distribution, less
    the values the engine refuses with them (then the rest as choices; None when it refuses every value).
    The refused stretches are kept in the findings, for the report."""
    dist = view.distributions[knob]
    values = knob_values(dist)
    reasons = sampled_reasons(values, lambda value: refused(view, {**others, knob: value}))
    kept = [value for value in values if reasons[value] is None]
    stretches = refused_stretches(knob, others, values, reasons)
    if stretches:
        view.findings.refused[flags_key(others)] = stretches
    if len(kept) == len(values):
        return dist
    return CategoricalDistribution(kept) if kept else None


SAMPLES = 64  # values asked outright along a knob; between them, answers that differ are bisected to their edge


def sampled_reasons(values: Sequence[Any], ask: Callable[[Any], str | None]) -> dict[Any, str | None]:
    """Every value's refusal, from at most SAMPLES values asked outright (evenly spread, both ends included) and
    a bisection between each neighbouring pair whose answers differ (refused or not), to the exact edge. A value
    between two asked ones with the same answer shares it: a stretch that starts and ends between two samples
    goes unseen here (a proposal is still asked alone before it runs: screen.py). Each answer costs vLLM a
    config build (milliseconds), and a GPU knob has thousands of values."""
    n = len(values)
    asked: dict[int, str | None] = {}

    def answer(i: int) -> str | None:
        if i not in asked:
            asked[i] = ask(values[i])
        return asked[i]

    picks = sorted({round(k * (n - 1) / (SAMPLES - 1)) for k in range(SAMPLES)}) if n > SAMPLES else list(range(n))
    for i in picks:
        answer(i)
    for lo, hi in zip(picks, picks[1:], strict=False):
        while hi - lo > 1 and (answer(lo) is None) != (answer(hi) is None):
            mid = (lo + hi) // 2
            if (answer(mid) is None) == (answer(lo) is None):
                lo = mid
            else:
                hi = mid
    reasons: dict[Any, str | None] = {}
    last = None
    for i, value in enumerate(values):  # a value not asked shares the answer of the last one asked before it
        if i in asked:
            last = asked[i]
        reasons[value] = last
    return reasons


def refused_stretches(knob: str, others: Mapping[str, Any], values: Sequence[Any],
                      reasons: Mapping[Any, str | None]) -> list[dict[str, Any]]:
    """Neighbouring refused values, one stretch each, with the reason given for its first value."""
    stretches: list[dict[str, Any]] = []
    previous = None
    for value in values:
        if reasons[value] is None:
            previous = None
            continue
        if previous is None:
            previous = {"knob": knob, "others": dict(others), "low": value, "high": value, "reason": reasons[value]}
            stretches.append(previous)
        previous["high"] = value
    return stretches


def record_refusals(view: StudyView) -> None:
    """The refused stretches the probes skipped, as the study's `refused` attribute (the report reads it)."""
    stretches = [s for found in view.findings.refused.values() for s in found]
    if stretches:
        view.study.set_user_attr(REFUSED, stretches)


def refusal_lines(study: optuna.Study) -> list[str]:
    """'refused by vLLM: ...' for each refused stretch of the boundary knob, and each refused proposal outside
    them (the engine refused them before any start: they are no preemption boundary)."""
    stretches = study.user_attrs.get(REFUSED) or []
    out = []
    for s in stretches:
        given = " ".join(f"{k}={v}" for k, v in sorted(s["others"].items()))
        values = f"{s['low']}-{s['high']}" if s["low"] != s["high"] else f"{s['low']}"
        out.append(f"refused by vLLM: {given + ' with ' if given else ''}{s['knob']} {values}: {s['reason']}")
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get("source") == REFUSED and not any(within(t.params, s) for s in stretches):
            given = " ".join(f"{k}={v}" for k, v in sorted(t.params.items()))
            out.append(f"refused by vLLM: {given}: {t.user_attrs.get('reason')}")
    return out


def within(params: Mapping[str, Any], stretch: Mapping[str, Any]) -> bool:
    knob = stretch["knob"]
    return knob in params and {k: v for k, v in params.items() if k != knob} == stretch["others"] \
        and stretch["low"] <= params[knob] <= stretch["high"]
