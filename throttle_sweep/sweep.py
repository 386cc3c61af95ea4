"""The Optuna loop: propose flags, judge each candidate by interleaved replicates against the baseline on
one slot, keep preemption as a constraint, then re-measure the best few head-to-head.

Only this driver writes records (append + fsync, as each replicate arrives) and tells the study. A killed
sweep resumes: trials left RUNNING are closed as interrupted and asked again with the same parameters under
the same resume key, and the replicates they had already measured are taken from the records.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import TrialState

from throttle_sweep.analysis import Analysis, analyse
from throttle_sweep.compare import comparison_id, measured_positions
from throttle_sweep.errors import ThrottleSweepError
from throttle_sweep.pool import Job, Pool
from throttle_sweep.schedule import BASELINE, CANDIDATE, make_schedule
from throttle_sweep.stats import CHEAPER, Thresholds, holm


class NoSlotsLeft(ThrottleSweepError):
    """Every engine slot was lost; the sweep stops with everything measured kept."""


@dataclass(frozen=True)
class SweepSettings:
    n_trials: int = 10
    timeout_s: float | None = None
    budget_usd: float | None = None
    usd_per_engine_hour: float = 1.39  # price x gpus, for the dollar budget
    max_preemptions: int = 0
    max_p95_ttft_s: float | None = None
    max_p95_itl_s: float | None = None
    schedule: str = "aba-bab"
    replicates: int = 3
    schedule_seed: int = 0
    confirm_top: int = 2
    confirm_replicates: int = 3
    token_tolerance: float = 0.0
    thresholds: Thresholds = field(default_factory=Thresholds)
    multi_objective: bool = False  # minimise cost ratio and p95 end-to-end latency; report the Pareto front


@dataclass
class Comparison:
    """One candidate against the baseline, in progress on one slot."""

    key: str
    stage: str  # search | confirm
    arms: dict[str, dict[str, Any]]
    order: list[str]
    id: str
    slot: int
    trial: optuna.trial.Trial | None = None
    source_trial: int | None = None  # confirm: the search trial re-measured
    records: dict[int, dict[str, Any]] = field(default_factory=dict)

    def next_position(self) -> int | None:
        return next((p for p in range(len(self.order)) if p not in self.records), None)

    def failed(self) -> dict[str, Any] | None:
        return next((r for r in self.records.values() if r.get("status") != "ok"), None)


@dataclass
class Confirmation:
    source_trial: int
    params: dict[str, Any]
    analysis: Analysis
    adjusted: Analysis | None = None  # the same records with alpha / (number confirmed)
    significant: bool = False  # CHEAPER, Holm-corrected across the confirmed candidates


@dataclass
class SweepResult:
    study: optuna.Study
    confirmations: list[Confirmation]
    winner: Confirmation | None
    records: list[dict[str, Any]]
    pareto: list[optuna.trial.FrozenTrial] = field(default_factory=list)  # multi-objective only


def resume_key(trial: optuna.trial.FrozenTrial | optuna.trial.Trial) -> str:
    return trial.user_attrs.get("resume_key", f"trial-{trial.number}")


def trial_summary(analysis: Analysis, settings: SweepSettings) -> dict[str, Any]:
    """User attributes of a finished search trial, and its constraint values (<= 0 means feasible)."""
    cand = [r for r in analysis.records if r["arm"] == CANDIDATE and r.get("status") == "ok"]
    est = analysis.estimate
    preempt = max((r.get("preemptions") or 0) for r in cand) if cand else 0
    ttft = max((r["latency_s"]["ttft"]["p95"] or 0) for r in cand if "latency_s" in r) if cand else 0
    itl = max((r["latency_s"]["itl"]["p95"] or 0) for r in cand if "latency_s" in r) if cand else 0
    costs = [r["usd_per_mtok"] for r in cand]
    e2e = [r["latency_s"]["e2e"]["p95"] for r in cand if "latency_s" in r and r["latency_s"]["e2e"]["p95"]]
    attrs = {
        "verdict": analysis.verdict,
        "ratio": est.ratio if est else None,
        "ci": [est.ci_low, est.ci_high] if est else None,
        "p_value": est.p_value if est else None,
        "preemptions": preempt,
        "baseline_preemptions": max((r.get("preemptions") or 0) for r in analysis.records
                                    if r["arm"] == BASELINE and r.get("status") == "ok"),
        "p95_ttft_s": ttft,
        "p95_itl_s": itl,
        "p95_e2e_s": sum(e2e) / len(e2e) if e2e else None,  # the candidate's, mean over its replicates
        "usd_per_mtok": math.exp(sum(map(math.log, costs)) / len(costs)) if costs else None,
        "record_ids": [r.get("record_id") for r in analysis.records],
        "ran_on": sorted({where(r) for r in analysis.records}),
        "notes": analysis.notes,
    }
    named = {"preemptions": float(preempt - settings.max_preemptions)}
    if settings.max_p95_ttft_s is not None:
        named["p95_ttft_s"] = ttft - settings.max_p95_ttft_s
    if settings.max_p95_itl_s is not None:
        named["p95_itl_s"] = itl - settings.max_p95_itl_s
    attrs["constraints"] = list(named.values())
    attrs["constraint_names"] = list(named)
    return attrs


def where(record: Mapping[str, Any]) -> str:
    """The slot, node and GPUs a replicate ran on, e.g. 'ray-2@10.0.0.5/gpu1' or 'local-0'."""
    placement = record.get("placement") or {}
    text = str(record.get("slot", "?"))
    if placement.get("node_ip"):
        text += f"@{placement['node_ip']}"
    if placement.get("gpu_ids"):
        text += "/gpu" + ",".join(placement["gpu_ids"])
    return text


def retry_key(key: str) -> str:
    """A fresh key for a comparison restarted from scratch on another slot: 'trial-4' -> 'trial-4~1'."""
    base, _, n = key.partition("~")
    return f"{base}~{int(n or 0) + 1}"


def cost(trial: optuna.trial.FrozenTrial) -> float:
    """A trial's first objective: the candidate/baseline cost ratio (p95 latency is the second, if any)."""
    return trial.values[0]


def set_constraints(trial: optuna.trial.Trial, attrs: Mapping[str, Any]) -> None:
    """Optuna's own record of feasibility (<= 0 is feasible): samplers, study.best_trials and
    optuna-dashboard read it there, whatever the sampler."""
    for name, value in zip(attrs["constraint_names"], attrs["constraints"], strict=True):
        trial.set_constraint(name, value)


def feasible(trial: optuna.trial.FrozenTrial) -> bool:
    return trial.state == TrialState.COMPLETE and all(c <= 0 for c in trial.user_attrs.get("constraints", [1]))


def engine_seconds(records: Sequence[Mapping[str, Any]]) -> float:
    return sum((r.get("wall_s") or 0) + (r.get("engine_start_s") or 0) for r in records)


class Sweep:
    def __init__(self, *, study: optuna.Study, distributions: Mapping[str, Any], base_flags: Mapping[str, Any],
                 baseline_flags: Mapping[str, Any], workload_key: Mapping[str, Any], pool: Pool,
                 write: Callable[[dict[str, Any]], None], existing: Sequence[dict[str, Any]],
                 settings: SweepSettings, on_event: Callable[[str], None] = lambda _: None) -> None:
        self.study, self.distributions, self.pool = study, dict(distributions), pool
        self.base_flags, self.baseline_flags = dict(base_flags), dict(baseline_flags)
        self.workload_key, self._write, self.settings, self.say = dict(workload_key), write, settings, on_event
        self.records: list[dict[str, Any]] = list(existing)
        self.began = time.monotonic()

    # ---- plumbing ---------------------------------------------------------------------------------------
    def write(self, record: dict[str, Any]) -> None:
        self._write(record)
        self.records.append(record)

    def comparison(self, key: str, stage: str, params: Mapping[str, Any], replicates: int, slot: int
                   ) -> Comparison:
        arms = {BASELINE: dict(self.baseline_flags), CANDIDATE: {**self.base_flags, **params}}
        order = make_schedule(self.settings.schedule, replicates, seed=self.settings.schedule_seed)
        cid = comparison_id(arms, order, {**self.workload_key, "key": key, "stage": stage})
        done = measured_positions(self.records, cid)
        return Comparison(key, stage, arms, order, cid, slot, records=done)

    def run_comparisons(self, start: Callable[[int], Comparison | None], finish: Callable[[Comparison], None],
                        restart: Callable[[Comparison], None]) -> None:
        """Keep every slot busy: `start(slot)` gives the next comparison (or None), `finish` takes done ones.
        A comparison's replicates all run on its slot, one after another. When a slot is lost under a
        comparison (its node died), `restart` puts that work back to begin afresh on another slot."""
        running: dict[int, Comparison] = {}
        exhausted = False
        while True:
            if not self.pool.slots:
                raise NoSlotsLeft("every engine slot was lost (their nodes died); the records and the study "
                                  "keep everything measured: run the same command again to resume")
            for slot in self.pool.slots:
                while slot not in running and not exhausted:
                    comp = start(slot)
                    if comp is None:
                        exhausted = True
                    elif comp.next_position() is None or comp.failed():
                        finish(comp)  # everything was measured before an interruption
                    else:
                        running[slot] = comp
                        self._submit(comp, running)
            if not running:
                return
            for job, record in self.pool.wait():
                comp = running[job.slot]
                self.write(record)
                if record.get("infrastructure"):
                    del running[job.slot]
                    self.say(f"{comp.stage} {comp.key}: slot {job.slot} lost ({record.get('reason')}); "
                             "this comparison starts again on another slot")
                    restart(comp)
                    exhausted = False
                    continue
                comp.records[job.position] = record
                if comp.failed() or comp.next_position() is None:
                    del running[job.slot]
                    finish(comp)
                else:
                    self._submit(comp, running)

    def _submit(self, comp: Comparison, running: Mapping[int, Comparison]) -> None:
        position = comp.next_position()
        arm = comp.order[position]
        context = {"comparison": comp.id, "stage": comp.stage, "key": comp.key, "schedule": self.settings.schedule,
                   "trial": comp.trial.number if comp.trial else comp.source_trial}
        message = (f"{comp.stage} {comp.key}: {arm} replicate at position {position + 1}/{len(comp.order)} "
                   f"on slot {comp.slot}")
        if len(self.pool.slots) > 1:  # what every slot is doing now
            busy = {s: f"{c.key} {c.order[p]} {p + 1}/{len(c.order)}" for s, c in running.items()
                    if (p := c.next_position()) is not None}
            message += "  | " + "  ".join(f"[{s}] {busy.get(s, 'idle')}" for s in self.pool.slots)
        self.say(message)
        self.pool.submit(Job(comp.slot, comp.arms[arm], arm, position, context))

    # ---- search -----------------------------------------------------------------------------------------
    def close_interrupted(self) -> int:
        """Trials a killed run left RUNNING: closed as failed, then asked again with the same key."""
        stale = [t for t in self.study.get_trials(deepcopy=False) if t.state == TrialState.RUNNING]
        for t in stale:
            self.study._storage.set_trial_user_attr(t._trial_id, "interrupted", True)  # noqa: SLF001 - no public way
            self.study.tell(t.number, state=TrialState.FAIL)
            self.study.enqueue_trial(t.params, user_attrs={"resume_key": resume_key(t)}, skip_if_exists=False)
        return len(stale)

    def budget_left(self) -> str | None:
        """Why the search must stop now, or None."""
        s = self.settings
        if self.measured_trials() >= s.n_trials:
            return f"{s.n_trials} trials done"
        if s.timeout_s is not None and time.monotonic() - self.began >= s.timeout_s:
            return f"wall-time budget of {s.timeout_s:g}s spent"
        if s.budget_usd is not None:
            spent = engine_seconds(self.records) / 3600 * s.usd_per_engine_hour
            if spent >= s.budget_usd:
                return f"dollar budget spent (${spent:.4f} of ${s.budget_usd:g} at the assumed price)"
        return None

    def measured_trials(self) -> int:
        """Finished trials that measured something: repeats of measured flags and interrupted ones don't count."""
        return sum(1 for t in self.study.get_trials(deepcopy=False) if t.state.is_finished()
                   and not t.user_attrs.get("interrupted") and "duplicate_of" not in t.user_attrs)

    def search(self) -> None:
        self.close_interrupted()
        in_flight = 0
        asks_left = 5 * self.settings.n_trials + 20  # a sampler that only repeats itself must still end

        def start(slot: int) -> Comparison | None:
            nonlocal in_flight
            nonlocal asks_left
            while True:
                if self.measured_trials() + in_flight >= self.settings.n_trials or self.budget_left() \
                        or asks_left <= 0:
                    return None
                asks_left -= 1
                trial = self.study.ask(self.distributions)
                twin = self._twin(trial.params)
                if twin is not None:  # the same flags were measured already: reuse, don't re-measure
                    for key, value in twin.user_attrs.items():
                        if key not in ("resume_key", "interrupted"):
                            trial.set_user_attr(key, value)
                    trial.set_user_attr("duplicate_of", twin.number)
                    if twin.state == TrialState.COMPLETE:
                        set_constraints(trial, twin.user_attrs)
                        self.study.tell(trial, twin.values)
                    else:
                        self.study.tell(trial, state=TrialState.FAIL)
                    continue
                comp = self.comparison(resume_key(trial), "search", trial.params, self.settings.replicates, slot)
                comp.trial = trial
                in_flight += 1
                return comp

        def finish(comp: Comparison) -> None:
            nonlocal in_flight
            in_flight -= 1
            trial = comp.trial
            failure = comp.failed()
            if failure is not None:
                trial.set_user_attr("status", "failed")
                trial.set_user_attr("reason", f"{failure['arm']}: {failure.get('reason')}")
                self.study.tell(trial, state=TrialState.FAIL)
                self.say(f"trial {trial.number} {trial.params}: FAILED ({failure['arm']}: {failure.get('reason')})")
                return
            analysis = analyse(list(comp.records.values()), self.settings.thresholds,
                               token_tolerance=self.settings.token_tolerance)
            attrs = trial_summary(analysis, self.settings)
            for key, value in {**attrs, "status": "ok", "comparison": comp.id}.items():
                trial.set_user_attr(key, value)
            if analysis.estimate is None:
                trial.set_user_attr("reason", "; ".join(analysis.notes))
                self.study.tell(trial, state=TrialState.FAIL)
                return
            set_constraints(trial, attrs)
            if self.settings.multi_objective:
                self.study.tell(trial, [analysis.estimate.ratio, attrs["p95_e2e_s"]])
            else:
                self.study.tell(trial, analysis.estimate.ratio)
            flag = "feasible" if attrs["constraints"][0] <= 0 else f"INFEASIBLE ({attrs['preemptions']} preemptions)"
            best = self.best()
            self.say(f"trial {trial.number} {trial.params}: ratio {attrs['ratio']:.3f} "
                     f"[{attrs['ci'][0]:.3f}, {attrs['ci'][1]:.3f}] {analysis.verdict}, {flag}; best so far: "
                     f"{best.params if best else None}")

        def restart(comp: Comparison) -> None:
            nonlocal in_flight
            in_flight -= 1
            comp.trial.set_user_attr("interrupted", True)  # its slot was lost: not the candidate's doing
            self.study.tell(comp.trial, state=TrialState.FAIL)
            self.study.enqueue_trial(comp.trial.params, user_attrs={"resume_key": retry_key(comp.key)},
                                     skip_if_exists=False)

        self.run_comparisons(start, finish, restart)

    def _twin(self, params: Mapping[str, Any]) -> optuna.trial.FrozenTrial | None:
        for t in self.study.get_trials(deepcopy=False):
            if t.params == dict(params) and t.state in (TrialState.COMPLETE, TrialState.FAIL) \
                    and not t.user_attrs.get("interrupted"):
                return t
        return None

    def best(self) -> optuna.trial.FrozenTrial | None:
        ranked = self.ranked(1)
        return ranked[0] if ranked else None

    def ranked(self, k: int) -> list[optuna.trial.FrozenTrial]:
        """The k feasible trials with the lowest ratio (distinct flags), never an infeasible or failed one."""
        seen, ranked = set(), []
        for t in sorted((t for t in self.study.get_trials(deepcopy=False) if feasible(t)), key=cost):
            key = tuple(sorted(t.params.items()))
            if key not in seen:
                seen.add(key)
                ranked.append(t)
        return ranked[:k]

    def pareto(self) -> list[optuna.trial.FrozenTrial]:
        """Feasible trials no other feasible trial beats on both cost and p95 latency, cheapest first."""
        points = self.ranked(len(self.study.trials))
        front = [t for t in points if not any(o.values[0] <= t.values[0] and o.values[1] <= t.values[1]
                                              and o.values != t.values for o in points)]
        return sorted(front, key=cost)

    # ---- confirmation -----------------------------------------------------------------------------------
    def confirm(self) -> list[Confirmation]:
        """Fresh interleaved replicates for the best few, Holm-corrected across them."""
        # multi-objective: the cheapest points of the Pareto front (the others trade cost for latency)
        todo = (self.pareto() if self.settings.multi_objective else self.ranked(self.settings.confirm_top)
                )[: self.settings.confirm_top]
        family = max(1, len(todo))
        adjusted = Thresholds(self.settings.thresholds.alpha / family, self.settings.thresholds.min_effect,
                              self.settings.thresholds.equivalence_margin)
        results: list[Confirmation] = []

        queue = [(t, f"confirm-{resume_key(t)}") for t in todo]

        def start(slot: int) -> Comparison | None:
            if not queue:
                return None
            t, key = queue.pop(0)
            comp = self.comparison(key, "confirm", t.params, self.settings.confirm_replicates, slot)
            comp.source_trial = t.number
            return comp

        def restart(comp: Comparison) -> None:
            queue.insert(0, (self.study.trials[comp.source_trial], retry_key(comp.key)))

        def finish(comp: Comparison) -> None:
            analysis = analyse(list(comp.records.values()), self.settings.thresholds,
                               token_tolerance=self.settings.token_tolerance)
            params = self.study.trials[comp.source_trial].params
            # the interval quoted is Bonferroni-adjusted for the family of confirmed candidates
            quoted = analyse(list(comp.records.values()), adjusted, token_tolerance=self.settings.token_tolerance)
            results.append(Confirmation(comp.source_trial, params, analysis, adjusted=quoted))

        self.run_comparisons(start, finish, restart)
        results.sort(key=lambda c: c.source_trial)
        ok = [c for c in results if c.analysis.estimate is not None]
        alpha = self.settings.thresholds.alpha / 2  # CHEAPER is one-sided at alpha/2
        # one-sided p for "cheaper": half the two-sided p when the estimate is below 1
        pvals = [c.analysis.estimate.p_value / 2 if c.analysis.estimate.ratio < 1
                 else 1 - c.analysis.estimate.p_value / 2 for c in ok]
        for c, rejected in zip(ok, holm(pvals, alpha), strict=True):
            c.significant = rejected and c.analysis.verdict == CHEAPER
        return results

    def run(self) -> SweepResult:
        self.search()
        confirmations = self.confirm()
        significant = [c for c in confirmations if c.significant]
        winner = min(significant, key=lambda c: c.analysis.estimate.ratio) if significant else None
        return SweepResult(self.study, confirmations, winner, self.records,
                           pareto=self.pareto() if self.settings.multi_objective else [])
