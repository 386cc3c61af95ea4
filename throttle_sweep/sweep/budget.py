"""What the sweep may still spend: its trials, its wall time and its dollars, with the rest of the sweep
projected from the probes' run times (sweep/plan.py) so that a comparison is not started that the dollar
budget cannot pay for, or that would end after the wall-time budget, with the confirmation's share kept. The
budgets bind every stage: the probes, the confirmation and a tie-break stop once either is spent (`spent`)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from throttle_sweep.store.records import is_ok
from throttle_sweep.sweep.plan import Plan, project
from throttle_sweep.sweep.runner import Runner, confirms_together
from throttle_sweep.sweep.trials import engine_seconds


def spent_usd(records: Sequence[Mapping[str, Any]], usd_per_gpu_hour: float | None) -> float:
    """Dollars these records cost at the assumed price (None: each at the price it records), times the GPUs
    each was charged for."""
    return sum(engine_seconds([r]) * (r.get("gpus") or 1) / 3600
               * (usd_per_gpu_hour if usd_per_gpu_hour is not None else r.get("usd_per_gpu_hour") or 0.0)
               for r in records)


def spent_by(began: float, records: Sequence[Mapping[str, Any]], *, timeout_s: float | None,
             budget_usd: float | None, usd_per_gpu_hour: float | None) -> tuple[str, float, str] | None:
    """(the key, its value, why in words) of a budget already spent: study.timeout_s since `began` (this run's
    start, time.monotonic), or study.budget_usd over every record so far."""
    if timeout_s is not None and time.monotonic() - began >= timeout_s:
        return "study.timeout_s", timeout_s, f"wall-time budget of {timeout_s:g}s spent"
    if budget_usd is not None:
        usd = spent_usd(records, usd_per_gpu_hour)
        if usd >= budget_usd:
            return "study.budget_usd", budget_usd, (f"dollar budget spent (${usd:.4f} of ${budget_usd:g} at "
                                                    "the assumed price)")
    return None


def spent(runner: Runner) -> tuple[str, float, str] | None:
    """A budget of the cost sweep's already spent (spent_by)."""
    s = runner.settings
    return spent_by(runner.began, runner.records, timeout_s=s.timeout_s, budget_usd=s.budget_usd,
                    usd_per_gpu_hour=s.usd_per_gpu_hour)


def budget_left(runner: Runner, plan: Plan | None) -> str | None:
    """Why the search must stop now, or None."""
    s = runner.settings
    if runner.view.measured_trials() >= s.n_trials:
        return f"{s.n_trials} trials done"
    if (gone := spent(runner)) is not None:
        return gone[2]
    # a comparison is started only if the confirmation of the best so far still fits after it: a search that
    # spends the whole budget leaves candidates no answer can be quoted from
    if s.timeout_s is not None and plan is not None:
        elapsed = time.monotonic() - runner.began
        if elapsed + plan.per_trial_s + plan.confirm_s > s.timeout_s:
            return (f"wall-time budget: a comparison takes up to about {plan.per_trial_s:.0f} s and the "
                    f"confirmation up to about {plan.confirm_s:.0f} s, more than the {s.timeout_s - elapsed:.0f} s "
                    f"left of study.timeout_s={s.timeout_s:g}")
    if s.budget_usd is not None and plan is not None:
        usd = spent_usd(runner.records, s.usd_per_gpu_hour)
        if usd + plan.per_trial_usd + plan.confirm_usd > s.budget_usd:
            return (f"dollar budget: a comparison costs up to about ${plan.per_trial_usd:.4f} and the confirmation "
                    f"up to about ${plan.confirm_usd:.4f}, more than is left (${usd:.4f} of ${s.budget_usd:g} "
                    "spent at the assumed price)")
    return None


def full_run_s(records: Sequence[Mapping[str, Any]], requests: int | None) -> float:
    """Engine-seconds of these runs, each as if it had run `requests` requests (a probe runs a few waves of
    its own batch): its start as it was, its measured part scaled by the requests it completed."""
    total = 0.0
    for r in records:
        done = r.get("requests_completed") or 0
        scale = requests / done if requests and done and done < requests else 1.0
        total += engine_seconds([r]) + (r.get("wall_s") or 0) * (scale - 1.0)
    return total


def projected(runner: Runner) -> Plan | None:
    """The rest of the sweep, projected from the probes' run times, each scaled to the whole work (none
    without the baseline's probe; before the other probes, every run is taken to be as long as the baseline's)."""
    view, s = runner.view, runner.settings
    baseline = view.findings.baseline_probe
    if baseline is None:
        return None
    requests = (runner.workload_key.get("workload") or {}).get("num_requests")
    reference = view.findings.reference
    clean = [r for runs in view.findings.probe_runs.values() for r in runs
             if is_ok(r) and (r.get("preemptions") or 0) <= s.max_preemptions]
    at_reference = [r for r in clean if reference is not None
                    and all(r["flags"].get(k) == v for k, v in reference.items())]
    baseline_s = engine_seconds([baseline])

    def mean(records: list[dict], default: float) -> float:
        return full_run_s(records, requests) / len(records) if records else default

    k = s.confirm_top
    return project(trials=max(0, s.n_trials - view.measured_trials()), replicates=s.replicates,
                   warmup=s.warmup_replicate, confirm=k, confirm_replicates=s.confirm_replicates,
                   tiebreak_replicates=s.tiebreak_replicates,
                   joint=k > 1 and confirms_together(s, runner.pool, k), slots=len(runner.pool.slots),
                   baseline_s=baseline_s, yardstick_s=mean(at_reference, baseline_s),
                   candidate_s=mean(clean, baseline_s),
                   usd_per_s=s.usd_per_gpu_hour * (baseline.get("gpus") or 1) / 3600)


def say_plan(runner: Runner, *, basis: str) -> Plan | None:
    """Project the rest of the sweep and say it (`basis`: what the run times come from, in words)."""
    plan = projected(runner)
    if plan is not None:
        s = runner.settings
        runner.say(plan.sentence(slots=len(runner.pool.slots), budget_usd=s.budget_usd, timeout_s=s.timeout_s,
                                 basis=basis))
    return plan
