"""What a trial's user attributes say, read and written in one place: a comparison's summary and its
constraints (<= 0 kept), which trials count as measured or feasible, where a replicate ran, and the
study's yardstick. Optuna, its samplers and optuna-dashboard read the same attributes."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import optuna
from optuna.trial import TrialState

from throttle_sweep.errors import ConfigError
from throttle_sweep.stats.analysis import Analysis
from throttle_sweep.stats.schedule import BASELINE, CANDIDATE
from throttle_sweep.sweep.options import SweepSettings

# what a trial answered by another configuration's schedule takes over from it
SCHEDULE_ATTRS = ("verdict", "ratio", "ci", "p_value", "se_log", "df", "preemptions", "baseline_preemptions",
                  "p95_ttft_s", "p95_tpot_s", "p95_itl_s", "p95_e2e_s", "usd_per_mtok", "j_per_output_token",
                  "record_ids", "ran_on",
                  "constraints", "constraint_names")
# what a trial is told from probes, not from a comparison of its own
NOT_COMPARED = ("probe", "boundary", "schedule", "baseline")  # answered without a comparison of their own


def broken_constraints(attrs: Mapping[str, Any], settings: SweepSettings) -> list[str]:
    """'name: measured > limit' for every constraint a comparison's candidate broke."""
    limits = {"preemptions": settings.max_preemptions, **settings.latency_limits}
    return [f"{name}: {attrs[name]:g} > {limits[name]:g}"
            for name, value in zip(attrs["constraint_names"], attrs["constraints"], strict=True) if value > 0]


def trial_summary(analysis: Analysis, settings: SweepSettings) -> dict[str, Any]:
    """User attributes of a finished search trial, and its constraint values (<= 0 means feasible)."""
    cand = analysis.replicates(CANDIDATE)
    est = analysis.estimate
    preempt = max((r.get("preemptions") or 0) for r in cand) if cand else 0
    ttft, tpot, itl = (max((p95(r, metric) for r in cand), default=0.0) for metric in ("ttft", "tpot", "itl"))
    costs = [analysis.cost_of(r) for r in cand]
    e2e = [r["latency_s"]["e2e"]["p95"] for r in cand if "latency_s" in r and r["latency_s"]["e2e"]["p95"]]
    attrs = {
        "verdict": analysis.verdict,
        "ratio": est.ratio if est else None,
        "ci": [est.ci_low, est.ci_high] if est else None,
        "p_value": est.p_value if est else None,
        "se_log": est.se_log if est else None,
        "df": est.df if est else None,
        "resid_var": est.resid_var if est else None,  # its own noise, which later comparisons pool
        "resid_df": est.resid_df if est else None,
        "preemptions": preempt,
        "baseline_preemptions": max(((r.get("preemptions") or 0) for r in analysis.replicates(BASELINE)), default=0),
        "p95_ttft_s": ttft,
        "p95_tpot_s": tpot,
        "p95_itl_s": itl,
        "p95_e2e_s": sum(e2e) / len(e2e) if e2e else None,  # the candidate's, mean over its replicates
        "usd_per_mtok": geometric_mean(costs),
        "j_per_output_token": analysis.joules(CANDIDATE),  # the candidate's mean, where energy was measured
        "record_ids": [r.get("record_id") for r in analysis.records],
        "ran_on": sorted({where(r) for r in analysis.records}),
        "notes": analysis.notes,
    }
    return {**attrs, **constraint_attrs(preempt, ttft, tpot, itl, settings)}


def probed_attrs(runs: Sequence[Mapping[str, Any]], costs: Sequence[float], settings: SweepSettings
                 ) -> dict[str, Any]:
    """The attributes single runs of one configuration give it (no comparison): the worst preemption count
    and p95 latencies over the runs, the geometric mean of their costs, and the constraints they keep."""
    preempt = max(r.get("preemptions") or 0 for r in runs)
    tails = {f"p95_{m}_s": max(p95(r, m) for r in runs) for m in ("ttft", "tpot", "itl", "e2e")}
    return {"preemptions": preempt, **tails, "usd_per_mtok": geometric_mean(costs),
            "record_ids": [r.get("record_id") for r in runs], "ran_on": sorted({where(r) for r in runs}),
            **constraint_attrs(preempt, tails["p95_ttft_s"], tails["p95_tpot_s"], tails["p95_itl_s"], settings)}


def geometric_mean(values: Sequence[float]) -> float | None:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def constraint_attrs(preemptions: float, ttft: float, tpot: float, itl: float, settings: SweepSettings
                     ) -> dict[str, list[Any]]:
    """`constraints` (each <= 0 when kept) and their `constraint_names`, for these measured values."""
    named = {"preemptions": float(preemptions - settings.max_preemptions)}
    measured_tails = {"p95_ttft_s": ttft, "p95_tpot_s": tpot, "p95_itl_s": itl}
    named.update({name: measured_tails[name] - limit for name, limit in settings.latency_limits.items()
                  if limit is not None})
    return {"constraints": list(named.values()), "constraint_names": list(named)}


def p95(record: Mapping[str, Any], metric: str) -> float:
    return ((record.get("latency_s") or {}).get(metric) or {}).get("p95") or 0.0


def where(record: Mapping[str, Any]) -> str:
    """The slot, node and GPUs a replicate ran on, e.g. 'ray-2@10.0.0.5/gpu1' or 'local-0'."""
    placement = record.get("placement") or {}
    text = str(record.get("slot", "?"))
    if placement.get("node_ip"):
        text += f"@{placement['node_ip']}"
    if placement.get("gpu_ids"):
        text += "/gpu" + ",".join(placement["gpu_ids"])
    return text


def engine_seconds(records: Sequence[Mapping[str, Any]]) -> float:
    return sum((r.get("wall_s") or 0) + (r.get("engine_start_s") or 0) + (r.get("engine_warmup_s") or 0)
               for r in records)


def cost(trial: optuna.trial.FrozenTrial) -> float:
    """A trial's first objective: the candidate's cost ratio to the search's yardstick (the baseline, or the
    reference point: probes.choose_reference); p95 latency is the second, if any."""
    return trial.values[0]


def set_constraints(trial: optuna.trial.Trial, attrs: Mapping[str, Any]) -> None:
    """Optuna's own record of feasibility (<= 0 is feasible): samplers, study.best_trials and
    optuna-dashboard read it there, whatever the sampler."""
    for name, value in zip(attrs["constraint_names"], attrs["constraints"], strict=True):
        trial.set_constraint(name, value)


def feasible(trial: optuna.trial.FrozenTrial) -> bool:
    return trial.state == TrialState.COMPLETE and all(c <= 0 for c in trial.user_attrs.get("constraints", [1]))


def measured(trial: optuna.trial.FrozenTrial) -> bool:
    """A trial its own comparison answered: not a probe, not told from the boundary or from another trial's
    schedule, not refused by the engine, not a repeat, not interrupted."""
    a = trial.user_attrs
    return trial.state.is_finished() and not a.get("interrupted") and "duplicate_of" not in a \
        and a.get("source") not in (*NOT_COMPARED, "refused")


def resume_key(trial: optuna.trial.FrozenTrial | optuna.trial.Trial) -> str:
    return trial.user_attrs.get("resume_key", f"trial-{trial.number}")


def leader(trial_number: int) -> str:
    """Which arm runs first in a trial's comparisons: even and odd trial numbers take turns, so a slow (or
    fast) first run favours neither arm across the sweep; tied to the trial, it is the same on a resume."""
    return CANDIDATE if trial_number % 2 else BASELINE


def told_reference(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    """The study's search reference (probes.choose_reference), if it has one."""
    return next((t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("source") == "reference"), None)


def same_yardstick(study: optuna.Study, settings: SweepSettings, name: str) -> None:
    """A study searched against a reference keeps it: a resume that asks for the baseline, latency limits or two
    objectives (which the reference's probes cannot vouch for) is refused before anything is measured."""
    ref = told_reference(study)
    if ref is None:
        return
    wants = ["study.reference=baseline"] if settings.reference == "baseline" else []
    wants += [f"study.max_{k}={v:g} (a latency limit)" for k, v in settings.latency_limits.items() if v is not None]
    wants += ["study.multi_objective=true"] if settings.multi_objective else []
    if wants:
        raise ConfigError(f"study '{name}' searched against the reference {ref.params} (the boundary's last clean "
                          f"point), and {', '.join(wants)} needs the baseline as the search's yardstick: a resume "
                          "cannot mix the two; give a new study.name to start afresh with these settings")
