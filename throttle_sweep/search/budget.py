"""What the search may still spend: its trials, its wall time and its dollars, with the rest of the sweep
projected from the probes' run times (search/plan.py) so that a comparison is not started that the dollar
budget cannot pay for, or that would end after the wall-time budget."""

from __future__ import annotations

import time

from throttle_sweep.search.plan import Plan, project
from throttle_sweep.search.runner import Runner, confirms_together
from throttle_sweep.search.trials import engine_seconds


def budget_left(runner: Runner, plan: Plan | None) -> str | None:
    """Why the search must stop now, or None."""
    s = runner.settings
    if runner.view.measured_trials() >= s.n_trials:
        return f"{s.n_trials} trials done"
    if s.timeout_s is not None:
        elapsed = time.monotonic() - runner.began
        if elapsed >= s.timeout_s:
            return f"wall-time budget of {s.timeout_s:g}s spent"
        if plan is not None and elapsed + plan.per_trial_s > s.timeout_s:
            return (f"wall-time budget: a comparison takes up to about {plan.per_trial_s:.0f} s, more than the "
                    f"{s.timeout_s - elapsed:.0f} s left of study.timeout_s={s.timeout_s:g}")
    if s.budget_usd is not None:
        spent = sum(engine_seconds([r]) * (r.get("gpus") or 1) for r in runner.records) / 3600 * s.usd_per_gpu_hour
        if spent >= s.budget_usd:
            return f"dollar budget spent (${spent:.4f} of ${s.budget_usd:g} at the assumed price)"
        if plan is not None and spent + plan.per_trial_usd > s.budget_usd:
            return (f"dollar budget: a comparison costs up to about ${plan.per_trial_usd:.4f}, more than is "
                    f"left (${spent:.4f} of ${s.budget_usd:g} spent at the assumed price)")
    return None


def projected(runner: Runner) -> Plan | None:
    """The rest of the sweep, projected from the probes' run times (none without probes)."""
    view, s = runner.view, runner.settings
    baseline = view.findings.baseline_probe
    if baseline is None:
        return None
    reference = view.findings.reference
    clean = [r for runs in view.findings.probe_runs.values() for r in runs
             if r.get("status") == "ok" and (r.get("preemptions") or 0) <= s.max_preemptions]
    at_reference = [r for r in clean if reference is not None
                    and all(r["flags"].get(k) == v for k, v in reference.items())]
    baseline_s = engine_seconds([baseline])

    def mean(records: list[dict], default: float) -> float:
        return engine_seconds(records) / len(records) if records else default

    k = s.confirm_top
    return project(trials=max(0, s.n_trials - view.measured_trials()), replicates=s.replicates,
                   warmup=s.warmup_replicate, confirm=k, confirm_replicates=s.confirm_replicates,
                   tiebreak_replicates=s.tiebreak_replicates,
                   joint=k > 1 and confirms_together(s, runner.pool, k), slots=len(runner.pool.slots),
                   baseline_s=baseline_s, yardstick_s=mean(at_reference, baseline_s),
                   candidate_s=mean(clean, baseline_s),
                   usd_per_s=s.usd_per_gpu_hour * (baseline.get("gpus") or 1) / 3600)
