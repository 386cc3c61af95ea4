"""The Optuna loop: propose flags, judge each candidate by interleaved replicates against the search's
yardstick on one slot (the boundary's last clean point once the probes name it, else the baseline), keep
preemption as a constraint, then re-measure the best few against the baseline.

Only this driver writes records (append + fsync, as each replicate arrives) and tells the study. What a
comparison's records say decides what happens to it, in one run or after a resume (`settle`): complete, it
is reused; left partial by an earlier driver, or stopped by a fault that is not the candidate's (a lost
slot, a failed baseline), it starts again from scratch under a fresh key, so one comparison's replicates
always come from one slot and one driver run. Trials a killed or interrupted driver left RUNNING are taken
over by the next run before anything new is asked.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import optuna
from optuna.trial import TrialState

from throttle_sweep.analysis import Analysis, analyse, candidate_view, judged_cost
from throttle_sweep.compare import (
    MAX_ATTEMPTS,
    Fault,
    comparison_id,
    fault_of,
    measured_positions,
    retry_key,
    settle,
)
from throttle_sweep.engines.flags import flags_key
from throttle_sweep.errors import ConfigError, ThrottleSweepError
from throttle_sweep.pool import Job, Pool
from throttle_sweep.schedule import BASELINE, CANDIDATE, joint_arm, joint_schedule, make_schedule, with_warmup
from throttle_sweep.search.boundary import Boundary, BoundarySearch, knob_values, predicted_last_clean
from throttle_sweep.search.plan import Plan, project
from throttle_sweep.search.schedules import ScheduleIndex, differs_in_scheduling_only
from throttle_sweep.search.sequential import confirm_stop, look_ends, per_look, search_stop, to_rank
from throttle_sweep.search.winner import Confirmation, choose_winner
from throttle_sweep.signals import deferred, shielded
from throttle_sweep.stats import Thresholds, clearly_lower


class SweepStopped(ThrottleSweepError):
    """The sweep cannot go on; it stops with everything measured kept, and the same command resumes it."""


class NoSlotsLeft(SweepStopped):
    """Every engine slot was lost."""


class BaselineFails(SweepStopped):
    """The baseline failed on its own, attempt after attempt: no comparison against it can mean anything."""


@dataclass(frozen=True)
class SweepSettings:
    n_trials: int = 10
    timeout_s: float | None = None
    budget_usd: float | None = None
    usd_per_gpu_hour: float = 1.39  # for the dollar budget, times the GPUs each record was charged for
    max_preemptions: int = 0
    max_p95_ttft_s: float | None = None
    max_p95_tpot_s: float | None = None  # per request: mean time per output token after the first
    max_p95_itl_s: float | None = None  # pooled: every gap between a request's tokens (vLLM's ITL)
    cost_basis: str = "steady"  # which cost per token is judged (analysis.COST_BASES)
    schedule: str = "abba"
    replicates: int = 4
    warmup_replicate: bool = False  # one unmeasured run first in every comparison (warm engines warm themselves)
    schedule_seed: int = 0
    confirm_top: int = 2
    confirm_replicates: int = 4
    token_tolerance: float = 0.0
    thresholds: Thresholds = field(default_factory=Thresholds)
    multi_objective: bool = False  # minimise cost ratio and p95 end-to-end latency; report the Pareto front
    boundary_knob: str | None = None  # probe where preemption starts along this knob first (None: no probes)
    boundary_settings_max: int = 16  # probe it for each setting of the other knobs, if there are at most this many
    sequential: bool = True  # look after every balanced block and stop comparisons once decided
    same_schedule: bool = True  # one engine schedule, one configuration (search/schedules.py)
    reference: str = "auto"  # what search comparisons run against: auto (see Sweep.choose_reference) | baseline
    shared_baseline: bool = True  # confirmations run one after another share the baseline's runs (joint_schedule)


class SweepProgress(Protocol):
    """What the driver tells whoever shows its progress (the live display, plain lines, nothing)."""

    def note(self, message: str) -> None: ...  # a probe's result, a verdict, a decision
    def step(self, description: str) -> None: ...  # a run starts
    def finished(self) -> None: ...  # a run's record is written
    def plan(self, runs: int) -> None: ...  # a comparison starts with this many runs to go (negative: gives back)
    def expect(self, runs: int) -> None: ...  # runs of comparisons not started yet, as now estimated


class Unseen:
    """Progress nobody watches."""

    def note(self, message: str) -> None:
        pass

    def step(self, description: str) -> None:
        pass

    def finished(self) -> None:
        pass

    def plan(self, runs: int) -> None:
        pass

    def expect(self, runs: int) -> None:
        pass


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
    discarded: list[str] = field(default_factory=list)  # earlier comparisons of the same work, started afresh
    faults: int = 0  # how many of those were stopped by faults that are not the candidate's
    looks: list[int] = field(default_factory=list)  # positions done at each look (sequential); the last is all
    thresholds: Thresholds | None = None  # what each look tests at (alpha spent over the looks)
    stopped: str | None = None  # why it stopped at a look before its planned end
    probe: tuple[Any, ...] | None = None  # a probe: (search, value index, repeat)
    family: int = 1  # confirmations judged together (their alpha is shared)
    ranked: bool = False  # a confirmation that must also be told apart from others confirmed with it
    joint: dict[str, int] | None = None  # several candidates sharing the baseline's runs: arm label -> trial

    def next_position(self) -> int | None:
        return next((p for p in range(len(self.order)) if p not in self.records), None)

    def fault(self) -> Fault | None:
        return fault_of(self.records)

    def done(self) -> bool:
        return self.fault() is not None or self.next_position() is None or self.stopped is not None

    def at_look(self) -> bool:
        """Every position up to a look is measured, and no more."""
        return len(self.records) in self.looks[:-1] and self.next_position() == len(self.records)

    def retry(self) -> bool:
        """Stopped by a fault that is not the candidate's, with attempts left: start again afresh."""
        fault = self.fault()
        return fault is not None and fault.blame != "candidate" and self.faults + 1 < MAX_ATTEMPTS


def broken_constraints(attrs: Mapping[str, Any], settings: SweepSettings) -> list[str]:
    """'name: measured > limit' for every constraint a comparison's candidate broke."""
    limits = {"preemptions": settings.max_preemptions, "p95_ttft_s": settings.max_p95_ttft_s,
              "p95_tpot_s": settings.max_p95_tpot_s, "p95_itl_s": settings.max_p95_itl_s}
    return [f"{name}: {attrs[name]:g} > {limits[name]:g}"
            for name, value in zip(attrs["constraint_names"], attrs["constraints"], strict=True) if value > 0]


def told_reference(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    """The study's search reference (Sweep.choose_reference), if it has one."""
    return next((t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("source") == "reference"), None)


def same_yardstick(study: optuna.Study, settings: SweepSettings, name: str) -> None:
    """A study searched against a reference keeps it: a resume that asks for the baseline, latency limits or two
    objectives (which the reference's probes cannot vouch for) is refused before anything is measured."""
    ref = told_reference(study)
    if ref is None:
        return
    limits = {"max_p95_ttft_s": settings.max_p95_ttft_s, "max_p95_tpot_s": settings.max_p95_tpot_s,
              "max_p95_itl_s": settings.max_p95_itl_s}
    wants = ["study.reference=baseline"] if settings.reference == "baseline" else []
    wants += [f"study.{k}={v:g} (a latency limit)" for k, v in limits.items() if v is not None]
    wants += ["study.multi_objective=true"] if settings.multi_objective else []
    if wants:
        raise ConfigError(f"study '{name}' searched against the reference {ref.params} (the boundary's last clean "
                          f"point), and {', '.join(wants)} needs the baseline as the search's yardstick: a resume "
                          "cannot mix the two; give a new study.name to start afresh with these settings")


def leader(trial_number: int) -> str:
    """Which arm runs first in a trial's comparisons: even and odd trial numbers take turns, so a slow (or
    fast) first run favours neither arm across the sweep; tied to the trial, it is the same on a resume."""
    return CANDIDATE if trial_number % 2 else BASELINE


@dataclass
class SweepResult:
    study: optuna.Study
    confirmations: list[Confirmation]
    winner: Confirmation | None
    records: list[dict[str, Any]]
    pareto: list[optuna.trial.FrozenTrial] = field(default_factory=list)  # multi-objective only
    cost_basis: str = "steady"  # which cost per token the ratios judge
    tied: list[Confirmation] = field(default_factory=list)  # confirmed savings the winner could not be told from


def resume_key(trial: optuna.trial.FrozenTrial | optuna.trial.Trial) -> str:
    return trial.user_attrs.get("resume_key", f"trial-{trial.number}")


def trial_summary(analysis: Analysis, settings: SweepSettings) -> dict[str, Any]:
    """User attributes of a finished search trial, and its constraint values (<= 0 means feasible)."""
    cand = analysis.replicates(CANDIDATE)
    est = analysis.estimate
    preempt = max((r.get("preemptions") or 0) for r in cand) if cand else 0
    ttft, tpot, itl = (max((_p95(r, metric) for r in cand), default=0.0) for metric in ("ttft", "tpot", "itl"))
    costs = [analysis.cost_of(r) for r in cand]
    e2e = [r["latency_s"]["e2e"]["p95"] for r in cand if "latency_s" in r and r["latency_s"]["e2e"]["p95"]]
    attrs = {
        "verdict": analysis.verdict,
        "ratio": est.ratio if est else None,
        "ci": [est.ci_low, est.ci_high] if est else None,
        "p_value": est.p_value if est else None,
        "se_log": est.se_log if est else None,
        "df": est.df if est else None,
        "preemptions": preempt,
        "baseline_preemptions": max(((r.get("preemptions") or 0) for r in analysis.replicates(BASELINE)), default=0),
        "p95_ttft_s": ttft,
        "p95_tpot_s": tpot,
        "p95_itl_s": itl,
        "p95_e2e_s": sum(e2e) / len(e2e) if e2e else None,  # the candidate's, mean over its replicates
        "usd_per_mtok": math.exp(sum(map(math.log, costs)) / len(costs)) if costs else None,
        "record_ids": [r.get("record_id") for r in analysis.records],
        "ran_on": sorted({where(r) for r in analysis.records}),
        "notes": analysis.notes,
    }
    return {**attrs, **constraint_attrs(preempt, ttft, tpot, itl, settings)}


def constraint_attrs(preemptions: float, ttft: float, tpot: float, itl: float, settings: SweepSettings
                     ) -> dict[str, list[Any]]:
    """`constraints` (each <= 0 when kept) and their `constraint_names`, for these measured values."""
    named = {"preemptions": float(preemptions - settings.max_preemptions)}
    if settings.max_p95_ttft_s is not None:
        named["p95_ttft_s"] = ttft - settings.max_p95_ttft_s
    if settings.max_p95_tpot_s is not None:
        named["p95_tpot_s"] = tpot - settings.max_p95_tpot_s
    if settings.max_p95_itl_s is not None:
        named["p95_itl_s"] = itl - settings.max_p95_itl_s
    return {"constraints": list(named.values()), "constraint_names": list(named)}


def _p95(record: Mapping[str, Any], metric: str) -> float:
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


def cost(trial: optuna.trial.FrozenTrial) -> float:
    """A trial's first objective: the candidate's cost ratio to the search's yardstick (the baseline, or the
    reference point: Sweep.choose_reference); p95 latency is the second, if any."""
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
    schedule, not a repeat, not interrupted."""
    a = trial.user_attrs
    return trial.state.is_finished() and not a.get("interrupted") and "duplicate_of" not in a \
        and a.get("source") not in ("probe", "boundary", "schedule")


# a schedule probe is one run against a comparison's four or more: a sweep may run this many per trial it measures
SCHEDULE_PROBES_PER_TRIAL = 3
# what a trial answered by another configuration's schedule takes over from it
SCHEDULE_ATTRS = ("verdict", "ratio", "ci", "p_value", "se_log", "df", "preemptions", "baseline_preemptions",
                  "p95_ttft_s", "p95_tpot_s", "p95_itl_s", "p95_e2e_s", "usd_per_mtok", "record_ids", "ran_on",
                  "constraints", "constraint_names")


def confirms_together(settings: SweepSettings, pool: Pool, candidates: int) -> bool:
    """Confirm these candidates on one joint schedule: where they would run one after another anyway (one
    slot, or slots that share a machine and so confirm alone), one set of baseline runs serves them all."""
    return (settings.shared_baseline and candidates > 1
            and (len(pool.slots) == 1 or getattr(pool, "shares_machine", False)))


def engine_seconds(records: Sequence[Mapping[str, Any]]) -> float:
    return sum((r.get("wall_s") or 0) + (r.get("engine_start_s") or 0) + (r.get("engine_warmup_s") or 0)
               for r in records)


class Sweep:
    def __init__(self, *, study: optuna.Study, distributions: Mapping[str, Any], base_flags: Mapping[str, Any],
                 baseline_flags: Mapping[str, Any], workload_key: Mapping[str, Any], pool: Pool,
                 write: Callable[[dict[str, Any]], None], existing: Sequence[dict[str, Any]],
                 settings: SweepSettings, grid: Sequence[Mapping[str, Any]] | None = None,
                 progress: SweepProgress | None = None) -> None:
        self.study, self.distributions, self.pool = study, dict(distributions), pool
        self.base_flags, self.baseline_flags = dict(base_flags), dict(baseline_flags)
        self.workload_key, self._write, self.settings = dict(workload_key), write, settings
        self.progress = progress or Unseen()
        self.say = self.progress.note
        self.grid = [dict(p) for p in grid] if grid is not None else None  # grid points, in the order to measure
        self.records: list[dict[str, Any]] = list(existing)
        # flags -> the engine schedules their runs recorded (left empty, nothing is merged on schedules)
        self.schedules = ScheduleIndex(self.records if settings.same_schedule else ())
        self.open: dict[int, optuna.trial.Trial] = {}  # trials asked or taken over, not yet told
        self.began = time.monotonic()
        self.boundaries: dict[str, Boundary] = {}  # flags_key(other knobs) -> what the probes found
        self.probe_records: dict[tuple[str, int], dict[str, Any]] = {}  # (others key, value index) -> first probe
        self.baseline_probe: dict[str, Any] | None = None
        self.probe_runs: dict[tuple[str, int], list[dict[str, Any]]] = {}  # every probe of a point, in order
        self.reference: dict[str, Any] | None = None  # the search's yardstick point; None: the baseline
        self.write_failed = False  # a record could not be written: nothing more is appended
        self.plan: Plan | None = None  # the rest of the sweep, projected once the probes have run
        self.stopped_by: str | None = None  # why the search stopped before its trials were done

    # ---- plumbing ---------------------------------------------------------------------------------------
    def write(self, record: dict[str, Any]) -> None:
        try:
            self._write(record)
        except OSError:  # (a full disk) nothing is appended after it: a retry could follow a torn line
            self.write_failed = True
            raise
        self.records.append(record)
        if self.settings.same_schedule:
            self.schedules.add(record)

    def comparison(self, key: str, stage: str, params: Mapping[str, Any], replicates: int, slot: int,
                   lead: str = BASELINE, *, arms: Mapping[str, Mapping[str, Any]] | None = None,
                   order: Sequence[str] | None = None, family: int = 1, ranked: bool = False) -> Comparison:
        """The comparison to run for `key`, decided from the records (`settle`): a complete one is reused,
        and so is one that stopped at a look where the stopping rule says it is decided; one to redo is left
        as it is and the work starts afresh under the next key ('trial-4' -> 'trial-4~1'). `arms` and
        `order` replace the interleaved schedule (a probe: one run of one arm)."""
        planned = order is None
        if arms is None:
            arms = {BASELINE: dict(self.baseline_flags), CANDIDATE: {**self.base_flags, **params}}
        if order is None:
            order = make_schedule(self.settings.schedule, replicates, seed=self.settings.schedule_seed, lead=lead)
            if self.settings.warmup_replicate:
                order = with_warmup(order)
        every = 4 if stage == "confirm" else 2  # confirmations: only balanced pairs (see search/sequential.py)
        looks = look_ends(order, self.settings.warmup_replicate, every) if planned and self.settings.sequential \
            else [len(order)]
        thresholds = per_look(self.settings.thresholds, len(looks), family)
        discarded, faults, partial = [], 0, None
        while True:
            cid = comparison_id(arms, list(order), {**self.workload_key, "key": key, "stage": stage})
            done = measured_positions(self.records, cid)
            fault = fault_of(done)
            last = fault is not None and faults + 1 >= MAX_ATTEMPTS  # the attempts are spent: give up on it
            comp = Comparison(key, stage, dict(arms), list(order), cid, slot, records=done, discarded=discarded,
                              faults=faults, looks=looks, thresholds=thresholds, family=family, ranked=ranked)
            if settle(done, len(order)) != "redo" or last:
                if partial and not done and stage != "probe":
                    self.say(f"{stage} {partial[0]}: an earlier run left it partial ({partial[1]} of {len(order)} "
                             f"runs, kept in the records); it starts again from scratch as {key}, so that one "
                             "engine process measures it whole")
                return comp
            if fault is None and comp.at_look() and (why := self.stop_rule(comp)):
                comp.stopped = why  # an earlier run stopped it here, decided
                return comp
            if fault is None:
                partial = (key, len(done))  # the last part an interrupted run left
            discarded.append(cid)
            faults += fault is not None
            key = retry_key(key)

    def stop_rule(self, comp: Comparison) -> str | None:
        """At a look: why the comparison is decided (search_stop / confirm_stop), or None to go on."""
        analysis = analyse(list(comp.records.values()), comp.thresholds, token_tolerance=self.settings.token_tolerance,
                           cost=self.settings.cost_basis)
        if comp.stage == "confirm":
            return confirm_stop(analysis.verdict, ranked=comp.ranked)
        if analysis.estimate is not None and broken_constraints(trial_summary(analysis, self.settings), self.settings):
            return "infeasible: it broke a constraint"
        best = self.best()
        warmup = int(self.settings.warmup_replicate)  # the warm-up run is not analysed
        shrink = math.sqrt((len(comp.records) - warmup) / (len(comp.order) - warmup))
        return search_stop(analysis.verdict, analysis.estimate, to_rank(best.user_attrs) if best else None,
                           comp.thresholds.alpha, shrink, needs_saving=self.reference is None)

    def run_comparisons(self, start: Callable[[int], Comparison | None], finish: Callable[[Comparison], None],
                        alone: bool = False, rest: Callable[[], int] = lambda: 0) -> None:
        """Keep every slot busy: `start(slot)` gives the next comparison (or None), `finish` takes done ones
        (and may queue the work again, to start afresh). A comparison's replicates all run on its slot. `alone`:
        one comparison at a time, where slots share one machine (local slots share its cores and memory bus).
        `rest`: the runs of comparisons not started yet, this stage's and later ones', as now estimated."""
        try:
            self._run_comparisons(start, finish, alone and getattr(self.pool, "shares_machine", False), rest)
        except BaseException:  # Ctrl-C, SIGTERM, a failed baseline: what other slots finished meanwhile is kept
            self.keep_finished()
            raise

    def keep_finished(self, *, cut_short: bool = True) -> None:
        """Write what the slots finished and the driver has not written yet (a run that is stopping), with a
        second Ctrl-C held off meanwhile. `cut_short=False` (after the slots were closed): not the replicates
        the closing itself cut short, which are the shutdown's doing and say nothing of the flags."""
        with shielded():
            for record in getattr(self.pool, "drain", list)():
                if self.write_failed:  # nothing is appended after a write that failed
                    return
                if not cut_short and record.get("infrastructure"):
                    continue
                with contextlib.suppress(OSError):
                    self.write(record)

    def _run_comparisons(self, start: Callable[[int], Comparison | None], finish: Callable[[Comparison], None],
                         alone: bool, rest: Callable[[], int]) -> None:
        running: dict[int, Comparison] = {}
        exhausted = False
        while True:
            if not self.pool.slots:
                raise NoSlotsLeft("every engine slot was lost (their nodes died); the records and the study "
                                  "keep everything measured: run the same command again to resume")
            for slot in self.pool.slots[:1] if alone else self.pool.slots:
                while slot not in running and not exhausted:
                    comp = start(slot)
                    if comp is None:
                        exhausted = True
                    elif comp.done():
                        finish(comp)  # everything was measured before an interruption
                    else:
                        running[slot] = comp
                        self.progress.plan(len(comp.order) - len(comp.records))
                        self.progress.expect(rest())
                        self._submit(comp, running, alone)
            self.progress.expect(rest())
            if not running:
                return
            batch = self.pool.wait()
            written = getattr(self.pool, "written", lambda job: None)
            with deferred():  # every record is written before any is acted on (which may stop the run), and
                for job, record in batch:  # a Ctrl-C meanwhile waits until all are
                    self.write(record)
                    written(job)
                    running[job.slot].records[job.position] = record
                    self.progress.finished()
            for job, _ in batch:
                comp = running[job.slot]
                if comp.at_look() and comp.fault() is None:
                    comp.stopped = self.stop_rule(comp)
                if comp.done():
                    del running[job.slot]
                    self.progress.plan(-(len(comp.order) - len(comp.records)))  # stopped early: never run
                    finish(comp)
                    exhausted = False  # finish may have queued the work again
                else:
                    self._submit(comp, running, alone)

    def _submit(self, comp: Comparison, running: Mapping[int, Comparison], alone: bool) -> None:
        position = comp.next_position()
        arm = comp.order[position]
        trial = comp.trial.number if comp.trial else comp.source_trial
        if comp.joint is not None:  # whose run it is: a candidate's trial; the baseline's runs are everyone's
            trial = comp.joint.get(arm)
        context = {"comparison": comp.id, "stage": comp.stage, "key": comp.key, "schedule": self.settings.schedule,
                   "runs_planned": len(comp.order), "looks": comp.looks,  # where it may end: a whole comparison
                   "trial": trial, **({"confirmed_together": sorted(comp.joint.values())} if comp.joint else {}),
                   "warmup": self.settings.warmup_replicate and position == 0 and comp.probe is None,
                   "slots": 1 if alone else len(self.pool.slots)}  # how many measured side by side
        if comp.probe is not None:
            message = f"{comp.key} on slot {comp.slot}"
        else:
            message = (f"{comp.stage} {comp.key}: {arm} replicate at position {position + 1}/{len(comp.order)} "
                       f"on slot {comp.slot}")
        if len(self.pool.slots) > 1:  # what every slot is doing now
            busy = {s: f"{c.key} {c.order[p]} {p + 1}/{len(c.order)}" for s, c in running.items()
                    if (p := c.next_position()) is not None}
            message += "  | " + "  ".join(f"[{s}] {busy.get(s, 'idle')}" for s in self.pool.slots)
        self.progress.step(message)
        # a joint comparison's candidates are each the candidate arm of their own view (analysis.candidate_view)
        self.pool.submit(Job(comp.slot, comp.arms[arm], BASELINE if arm == BASELINE else CANDIDATE, position, context))

    def _again(self, comp: Comparison) -> None:
        fault = comp.fault()
        self.say(f"{comp.stage} {comp.key}: stopped by a fault that is not the candidate's ({fault.blame}: "
                 f"{fault.record.get('reason')}); it starts again from scratch "
                 f"(attempt {comp.faults + 2} of {MAX_ATTEMPTS})")

    # ---- probes: the preemption boundary, from single runs ------------------------------------------------
    def other_settings(self) -> list[dict[str, Any]] | None:
        """Every setting of the knobs other than the boundary knob, or None if they have too many (or a
        continuous one)."""
        knob = self.settings.boundary_knob
        values: dict[str, list[Any]] = {}
        for flag, dist in self.distributions.items():
            if flag == knob:
                continue
            if isinstance(dist, optuna.distributions.FloatDistribution) and not dist.step:
                return None
            values[flag] = list(dist.choices) if isinstance(dist, optuna.distributions.CategoricalDistribution) \
                else knob_values(dist)
        if math.prod(len(v) for v in values.values()) > self.settings.boundary_settings_max:
            return None
        return [dict(zip(values, combo, strict=True)) for combo in itertools.product(*values.values())]

    def probe_cost(self, record: Mapping[str, Any]) -> float | None:
        try:
            return judged_cost(record, self.settings.cost_basis)
        except (KeyError, TypeError, ValueError):
            return None

    def find_boundaries(self) -> None:
        """Probe the baseline once (it must work before anything else is spent), then find where preemption
        starts along the boundary knob for each setting of the other knobs, all searches sharing the slots."""
        knob = self.settings.boundary_knob
        if knob is None or knob not in self.distributions:
            return
        settings = self.other_settings()
        if settings is None:
            self.say(f"probes: the knobs other than {knob} have more than {self.settings.boundary_settings_max} "
                     "settings (or a continuous one); feasibility is judged from each trial's replicates")
            return
        slots = len(self.pool.slots)
        # the first setting is searched in full; the others start where its boundary lies (see boundary.py)
        searches = [BoundarySearch.over(knob, self.distributions[knob], settings[0],
                                        max_preemptions=self.settings.max_preemptions, parallel=slots)]
        pending: list[tuple[BoundarySearch | None, int, int]] = [(None, 0, 1)]  # the baseline first
        self.say(f"probes: one run per point to find where preemption starts along {knob} "
                 f"({len(searches[0].boundary.values)} values"
                 + (f", for each of {len(settings)} settings of the other knobs; the others start from the "
                    "first one's boundary where it is exact" if len(settings) > 1 else "") + ")")

        def follow(leader: Boundary) -> list[BoundarySearch]:
            clean, dirty = leader.edge()
            near = (leader.values[clean], leader.values[dirty]) if leader.settled and leader.exact() else None
            return [BoundarySearch.over(knob, self.distributions[knob], others,
                                        max_preemptions=self.settings.max_preemptions,
                                        parallel=max(1, slots // (len(settings) - 1)), near=near,
                                        direction=leader.direction)
                    for others in settings[1:]]

        def start(slot: int) -> Comparison | None:
            if not pending:  # the next round of every search that can go on: one probe per slot
                if len(searches) == 1 < len(settings) and searches[0].done():
                    searches.extend(follow(searches[0].boundary))
                for s in searches:
                    pending.extend((s, *w) for w in s.wanted(slots))
            if not pending:
                return None
            item = pending.pop(0)
            search, index, repeat = item
            if search is None:
                arms, order, key = {BASELINE: dict(self.baseline_flags)}, [BASELINE], "probe baseline"
            else:
                params = {**search.boundary.others, knob: search.boundary.values[index]}
                arms, order = {CANDIDATE: {**self.base_flags, **params}}, [CANDIDATE]
                key = f"probe {' '.join(f'{k}={v}' for k, v in sorted(params.items()))} #{repeat}"
            comp = self.comparison(key, "probe", {}, 1, slot, arms=arms, order=order)
            comp.probe = item
            return comp

        def finish(comp: Comparison) -> None:
            search, index, repeat = comp.probe
            if comp.retry():
                self._again(comp)
                pending.insert(0, comp.probe)
                return
            record = comp.records[0]
            ok = record.get("status") == "ok"
            if search is None:
                if not ok:
                    raise BaselineFails(f"the baseline {self.baseline_flags} failed ({record.get('reason')}); a "
                                        "comparison against it cannot mean anything: fix what makes it fail and run again")
                self.baseline_probe = record
                return
            count = record.get("preemptions") if ok else None
            search.add(index, repeat, count)
            self.probe_records.setdefault((flags_key(search.boundary.others), index), record)
            self.probe_runs.setdefault((flags_key(search.boundary.others), index), []).append(record)
            self.say(f"{comp.key}: " + (f"{count} preemptions" if ok else f"failed ({record.get('reason')})"))

        self.run_comparisons(start, finish, rest=self.runs_ahead)
        summaries = []
        for search in searches:
            others = flags_key(search.boundary.others)
            self.boundaries[others] = search.boundary
            summaries.append({**search.boundary.summary(), "predicted_last_clean": self.predicted(search.boundary)})
        self.study.set_user_attr("boundaries", summaries)
        self.choose_reference()
        self.tell_probes()

    def predicted(self, boundary: Boundary) -> int | None:
        """The last clean max_num_seqs the engine's reported KV capacity predicts for this fixed work."""
        if boundary.knob != "max_num_seqs" or not boundary.probed:
            return None
        record = self.probe_records.get((flags_key(boundary.others), boundary.probed[0])) or {}
        kv = record.get("kv_cache") or {}
        work = self.workload_key.get("workload") or {}
        if work.get("length_dist") != "fixed" or work.get("jsonl") or not kv.get("blocks"):
            return None
        return predicted_last_clean(kv["blocks"], kv["block_size"], [work["prompt_len"] + work["output_len"]])

    def choose_reference(self) -> None:
        """What the search compares candidates against (`study.reference=auto`): the first boundary's last clean
        point, probed clean twice, instead of the baseline. The baseline is usually the slow end of the space
        (max_num_seqs=1 ran 3x longer than a candidate in the demo) and half of every comparison; a yardstick
        among the fast points halves what a screen costs. Every search ratio is then to the reference (one scale
        for the sampler; the reference's own trial is 1 exactly), and confirmation alone meets the baseline,
        with fresh replicates. Kept for the life of a study, so a resume never mixes two yardsticks. Not with
        latency limits or two objectives (a probe is one run: it cannot vouch for the reference's tail)."""
        trials = self.study.get_trials(deepcopy=False)
        if self.reference is not None or told_reference(self.study) is not None:
            return  # (a resume: run() took the study's own)
        s = self.settings
        if s.reference != "auto" or s.multi_objective or any(
                limit is not None for limit in (s.max_p95_ttft_s, s.max_p95_tpot_s, s.max_p95_itl_s)):
            return
        if any(measured(t) or t.user_attrs.get("source") in ("probe", "boundary", "schedule") for t in trials):
            return  # a study whose trials were told against the baseline keeps it
        boundary = next(iter(self.boundaries.values()), None)
        clean = boundary.edge()[0] if boundary is not None and boundary.settled else None
        if clean is None or not boundary.exact():
            return
        point = {**boundary.others, boundary.knob: boundary.values[clean]}
        runs = [r for r in self.probe_runs.get((flags_key(boundary.others), clean), []) if r.get("status") == "ok"]
        costs = [c for c in map(self.probe_cost, runs) if c]
        flags = self.candidate_flags(point)
        if len(costs) < 2 or flags == self.baseline_flags or self.schedules.same(flags, self.baseline_flags):
            return
        preempt = max(r.get("preemptions") or 0 for r in runs)
        p95 = {f"p95_{m}_s": max(_p95(r, m) for r in runs) for m in ("ttft", "tpot", "itl", "e2e")}
        attrs = {"source": "reference", "status": "ok", "verdict": "-", "ratio": 1.0, "ci": [1.0, 1.0],
                 "se_log": 0.0, "df": None, "preemptions": preempt, **p95,
                 "usd_per_mtok": math.exp(sum(map(math.log, costs)) / len(costs)),
                 "record_ids": [r.get("record_id") for r in runs], "ran_on": sorted({where(r) for r in runs}),
                 "notes": [f"the search's reference: every search ratio is to it ({len(runs)} clean probes)"],
                 **constraint_attrs(preempt, p95["p95_ttft_s"], p95["p95_tpot_s"], p95["p95_itl_s"], s)}
        self.study.add_trial(optuna.trial.create_trial(
            params=point, distributions={k: self.distributions[k] for k in point}, value=1.0, user_attrs=attrs,
            constraints=dict(zip(attrs["constraint_names"], attrs["constraints"], strict=True))))
        self.reference = point
        base = [w for w in [(self.baseline_probe or {}).get("wall_s")] if w]
        speed = (f" (a probe of it took {sum(r.get('wall_s') or 0 for r in runs) / len(runs):.1f} s, the baseline's "
                 f"{base[0]:.1f} s)") if base else ""
        self.say(f"search: candidates are compared against the reference {point}, the boundary's last clean "
                 f"point{speed}; confirmation measures the best against the baseline")

    def yardstick(self) -> str:
        """What search ratios are to, in words."""
        if self.reference is None:
            return "the baseline"
        return "the reference " + " ".join(f"{k}={v}" for k, v in sorted(self.reference.items()))

    def yardstick_cost(self) -> float | None:
        """What a probe's cost is divided by: the reference's probes (geometric mean), or the baseline probe."""
        if self.reference is not None:
            ref = told_reference(self.study)
            return ref.user_attrs.get("usd_per_mtok") if ref is not None else None
        return self.probe_cost(self.baseline_probe) if self.baseline_probe else None

    def search_arms(self, params: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """A search comparison's two arms: the yardstick (in the baseline's place) and the candidate."""
        yardstick = self.candidate_flags(self.reference) if self.reference is not None else self.baseline_flags
        return {BASELINE: dict(yardstick), CANDIDATE: self.candidate_flags(params)}

    def tell_probes(self) -> None:
        """Probed preempting points become completed, infeasible trials (once): what the samplers learn the
        infeasible region from. Their ratio is one probe's cost over the yardstick's probes (yardstick_cost), not a comparison."""
        base = self.yardstick_cost()
        told = {t.user_attrs.get("probe_key") for t in self.study.get_trials(deepcopy=False)}
        for others, boundary in self.boundaries.items():
            if not boundary.settled:
                continue
            for index in boundary.probed:
                record = self.probe_records[(others, index)]
                count = boundary.counts[index][0]
                cost = self.probe_cost(record)
                key = f"{others}|{index}"
                if not boundary.dirty(index) or key in told or count is None or not base or not cost:
                    continue
                params = {**boundary.others, boundary.knob: boundary.values[index]}
                attrs = {"source": "probe", "probe_key": key, "status": "ok", "preemptions": count,
                         "ratio": cost / base, "usd_per_mtok": cost, "record_ids": [record.get("record_id")],
                         "ran_on": [where(record)], "constraints": [float(count - self.settings.max_preemptions)],
                         "constraint_names": ["preemptions"],
                         "notes": [f"one probe run, not a comparison; its ratio is to {self.yardstick()}'s probe"]}
                e2e = ((record.get("latency_s") or {}).get("e2e") or {}).get("p95") or 0.0
                values = [cost / base, e2e] if self.settings.multi_objective else [cost / base]
                self.study.add_trial(optuna.trial.create_trial(
                    params=params, distributions={k: self.distributions[k] for k in params}, values=values,
                    user_attrs=attrs, constraints={"preemptions": attrs["constraints"][0]}))

    def others_key(self, params: Mapping[str, Any]) -> str:
        """The key of a point's boundary: the settings of every knob but the boundary knob."""
        return flags_key({k: v for k, v in params.items() if k != self.settings.boundary_knob})

    def known_feasible(self, params: Mapping[str, Any]) -> bool | None:
        """What the probes say about these flags: True, False, or None (not probed, or not trustworthy)."""
        knob = self.settings.boundary_knob
        if knob not in params:
            return None
        boundary = self.boundaries.get(self.others_key(params))
        return boundary.feasible(params[knob]) if boundary else None

    def edge_distance(self, params: Mapping[str, Any]) -> float:
        """How far below (on the clean side of) its boundary a point lies, in steps of the knob."""
        knob = self.settings.boundary_knob
        boundary = self.boundaries.get(self.others_key(params))
        clean, _ = boundary.edge() if boundary else (None, None)
        if clean is None or params.get(knob) not in boundary.values:
            return math.inf
        return abs(boundary.values.index(params[knob]) - clean)

    def nearest_unanswered(self) -> dict[str, Any] | None:
        """The clean point nearest a boundary (probed or between clean probes) that is a new configuration: not
        answered, not compared before (a comparison without a verdict would only be run again), and no twin of
        what is known: recorded schedules decide where both are known (search/schedules.py), else any answered
        configuration that may share its schedule rules it out. Or None."""
        answers = self.answers()
        trials = self.study.get_trials(deepcopy=False)
        # compared without a verdict (no one to blame: the runs disagreed): another comparison would only repeat
        # it. A failed baseline or a lost slot answers nothing, so those points stay on offer
        withheld = {flags_key(t.params) for t in trials
                    if t.state == TrialState.FAIL and measured(t) and t.user_attrs.get("blame") is None}
        tried = withheld | set(answers)
        by_number = {t.number: t for t in trials}
        known = [self.candidate_flags(by_number[n].params) for n in answers.values() if n in by_number]
        known.append(self.baseline_flags)

        def twin(flags: Mapping[str, Any], other: Mapping[str, Any]) -> bool:
            if self.schedules.fingerprint(flags) is not None and self.schedules.fingerprint(other) is not None:
                return self.schedules.same(flags, other)
            return self.may_share_schedule(flags, other)

        points = []
        for boundary in self.boundaries.values():
            clean, _ = boundary.edge()
            if not boundary.settled or clean is None:
                continue
            for value in boundary.values:
                point = {**boundary.others, boundary.knob: value}
                flags = self.candidate_flags(point)
                if self.known_feasible(point) is True and flags_key(point) not in tried and not any(
                        twin(flags, other) for other in known):
                    points.append(point)
        return min(points, key=self.edge_distance, default=None)

    def close_beyond_boundary(self, trial: optuna.trial.Trial) -> None:
        """A proposal the probes already show preempting: told infeasible at once, not run. Its value is the
        nearest probe's, so the sampler learns where the infeasible region is."""
        knob = self.settings.boundary_knob
        others = self.others_key(trial.params)
        boundary = self.boundaries[others]
        index = boundary.values.index(trial.params[knob])
        nearest = min((i for i in boundary.probed if boundary.dirty(i)), key=lambda i: abs(i - index))
        base = self.yardstick_cost()
        cost = self.probe_cost(self.probe_records[(others, nearest)])
        count = boundary.counts[nearest][0]  # None: that probe's engine failed
        violation = float(count - self.settings.max_preemptions) if count is not None else 1.0
        what = "preempted" if count is not None else "failed"
        ratio = cost / base if cost and base else 1.0
        for key, value in {"source": "boundary", "status": "ok", "preemptions": count, "ratio": ratio,
                           "reason": f"beyond the probed boundary ({knob}={boundary.values[nearest]} {what}): not run",
                           "constraints": [violation], "constraint_names": ["preemptions"]}.items():
            trial.set_user_attr(key, value)
        trial.set_constraint("preemptions", violation)
        self.study.tell(trial, [ratio, 0.0] if self.settings.multi_objective else ratio)

    # ---- search -----------------------------------------------------------------------------------------
    def take_over(self) -> list[optuna.trial.Trial]:
        """Trials an earlier driver left RUNNING (killed, interrupted, or out of slots): this run owns them now."""
        stale = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        trials = [optuna.trial.Trial(self.study, t._trial_id) for t in stale]  # noqa: SLF001 - no public way
        self.open.update({t.number: t for t in trials})
        return trials

    def budget_left(self) -> str | None:
        """Why the search must stop now, or None."""
        s = self.settings
        if self.measured_trials() >= s.n_trials:
            return f"{s.n_trials} trials done"
        if s.timeout_s is not None and time.monotonic() - self.began >= s.timeout_s:
            return f"wall-time budget of {s.timeout_s:g}s spent"
        if s.budget_usd is not None:
            spent = sum(engine_seconds([r]) * (r.get("gpus") or 1) for r in self.records) / 3600 * s.usd_per_gpu_hour
            if spent >= s.budget_usd:
                return f"dollar budget spent (${spent:.4f} of ${s.budget_usd:g} at the assumed price)"
            if self.plan is not None and spent + self.plan.per_trial_usd > s.budget_usd:
                return (f"dollar budget: a comparison costs up to about ${self.plan.per_trial_usd:.4f}, more than is "
                        f"left (${spent:.4f} of ${s.budget_usd:g} spent at the assumed price)")
        return None

    def projected(self) -> Plan | None:
        """The rest of the sweep, projected from the probes' run times (none without probes)."""
        if self.baseline_probe is None:
            return None
        s = self.settings
        clean = [r for runs in self.probe_runs.values() for r in runs
                 if r.get("status") == "ok" and (r.get("preemptions") or 0) <= s.max_preemptions]
        reference = [r for r in clean if self.reference is not None
                     and all(r["flags"].get(k) == v for k, v in self.reference.items())]
        baseline_s = engine_seconds([self.baseline_probe])
        mean = lambda rs, default: engine_seconds(rs) / len(rs) if rs else default  # noqa: E731
        k = s.confirm_top
        return project(trials=max(0, s.n_trials - self.measured_trials()), replicates=s.replicates,
                       warmup=s.warmup_replicate, confirm=k, confirm_replicates=s.confirm_replicates,
                       joint=k > 1 and confirms_together(s, self.pool, k), slots=len(self.pool.slots),
                       baseline_s=baseline_s, yardstick_s=mean(reference, baseline_s),
                       candidate_s=mean(clean, baseline_s),
                       usd_per_s=s.usd_per_gpu_hour * (self.baseline_probe.get("gpus") or 1) / 3600)

    def runs_ahead(self) -> int:
        """The most runs the search and confirmation may still start: trials not yet under way, each a whole
        comparison, and the first round of confirmation (a progress estimate; early stops give runs back)."""
        s, warmup = self.settings, int(self.settings.warmup_replicate)
        trials = max(0, s.n_trials - self.measured_trials() - len(self.open))
        k = s.confirm_top
        confirm = ((k + 1) * s.confirm_replicates + warmup if confirms_together(s, self.pool, k)
                   else k * (2 * s.confirm_replicates + warmup)) if k else 0
        return trials * (2 * s.replicates + warmup) + confirm

    def measured_trials(self) -> int:
        """Finished trials that measured something: repeats, merged schedules and interrupted ones don't count."""
        return sum(1 for t in self.study.get_trials(deepcopy=False) if measured(t))

    def answers(self) -> dict[str, int]:
        """Flags already answered -> the trial that answers them: one in flight now, one that completed, one
        whose candidate failed, or one whose attempts were all spent on faults that could be the flags' or the
        slot's (a hang, a memory kill). One lost slot, or a failed baseline, answers nothing: measure again."""
        found = {flags_key(t.params): n for n, t in self.open.items()}
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
            a = t.user_attrs
            if "duplicate_of" not in a and (t.state == TrialState.COMPLETE or a.get("blame") == "candidate"
                                            or a.get("attempts_exhausted")):
                found.setdefault(flags_key(t.params), t.number)
        return found

    def propose(self) -> tuple[optuna.trial.Trial | None, bool]:
        """(the next trial to measure, or None for a repeat; whether the grid is exhausted). The next trial
        is a waiting one (enqueued earlier), the next grid point not yet answered, or the sampler's
        proposal. A proposal of flags already answered is closed at once as a repeat (never re-told as a new
        observation, never measured again)."""
        answers = self.answers()
        if self.grid is not None and not self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            point = next((p for p in self.grid if flags_key(p) not in answers), None)
            if point is None:
                return None, True
            self.study.enqueue_trial(point, skip_if_exists=False)
        trial = self.study.ask(self.distributions)  # takes the oldest waiting trial first
        twin = answers.get(flags_key(trial.params))
        if twin is not None:
            trial.set_user_attr("duplicate_of", twin)
            self.study.tell(trial, state=TrialState.FAIL)
            return None, False
        if self.known_feasible(trial.params) is False:
            self.close_beyond_boundary(trial)
            return None, False
        if (same := self.schedule_twin(trial.params)) is not None:
            self.tell_same_schedule(trial, same)
            return None, False
        self.open[trial.number] = trial
        return trial, False

    def candidate_flags(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return {**self.base_flags, **params}

    def schedule_twin(self, params: Mapping[str, Any]) -> optuna.trial.FrozenTrial | str | None:
        """What these flags are known to be the same configuration as (search/schedules.py): 'baseline', a
        completed trial measured by its own comparison, or None."""
        flags = self.candidate_flags(params)
        if self.schedules.fingerprint(flags) is None:
            return None
        if self.baseline_probe is not None and self.schedules.same(flags, self.baseline_flags):
            return BASELINE  # (its answer is the baseline probe's: without one, it is compared)
        return next((t for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                     if measured(t) and self.schedules.same(flags, self.candidate_flags(t.params))), None)

    def schedule_probe_wanted(self, params: Mapping[str, Any], in_flight: Sequence[Mapping[str, Any]] = ()) -> bool:
        """Is one run of these flags worth it before their comparison? When their schedule is unknown, the
        engine records schedules, and a measured configuration (the baseline, a trial, or one being compared on
        another slot: `in_flight`) differs from them in scheduling knobs alone, with the same max_num_seqs and
        boundary knob: if the run shows that one's schedule, it answers them for a single run instead of a
        comparison (search/schedules.py). Values of those knobs themselves nearly always schedule differently,
        so they are compared without one."""
        flags = self.candidate_flags(params)
        if not self.schedules or self.schedules.fingerprint(flags) is not None:
            return False
        known = [self.baseline_flags] if self.baseline_probe is not None else []
        known += [self.candidate_flags(t.params) for t in self.study.get_trials(
            deepcopy=False, states=(TrialState.COMPLETE,)) if measured(t)]
        known = [other for other in known if self.schedules.fingerprint(other) is not None]
        # one in flight may have no schedule yet: its first replicate will record it, most likely before the probe ends
        known += [self.candidate_flags(p) for p in in_flight]
        return any(self.may_share_schedule(flags, other) for other in known)

    def may_share_schedule(self, a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
        """Could two configurations run one schedule: scheduling knobs apart the same flags, and the same
        max_num_seqs and boundary knob (values of those nearly always schedule differently)?"""
        knobs = {self.settings.boundary_knob, "max_num_seqs"} - {None}
        return differs_in_scheduling_only(a, b) and all(a.get(k) == b.get(k) for k in knobs)

    def tell_same_schedule(self, trial: optuna.trial.Trial, twin: optuna.trial.FrozenTrial | str) -> None:
        """Flags whose recorded schedule is another configuration's, scheduling knobs apart: told that one's
        answer (the baseline's is a ratio of 1), never measured, never confirmed apart from it."""
        if twin == BASELINE:
            record = self.baseline_probe  # there is one: schedule_twin names the baseline only then
            preempt = record.get("preemptions") or 0
            p95 = {f"p95_{m}_s": _p95(record, m) for m in ("ttft", "tpot", "itl", "e2e")}
            # to the reference: one probe over the reference's (its ratio to the baseline is 1 exactly)
            yardstick, own = self.yardstick_cost(), self.probe_cost(record)
            ratio = own / yardstick if self.reference is not None and own and yardstick else 1.0
            attrs = {"ratio": ratio, "preemptions": preempt, "usd_per_mtok": own, **p95,
                     **constraint_attrs(preempt, p95["p95_ttft_s"], p95["p95_tpot_s"], p95["p95_itl_s"],
                                        self.settings)}
            values, name = [ratio, p95["p95_e2e_s"]], "the baseline"
        else:
            attrs = {k: twin.user_attrs[k] for k in SCHEDULE_ATTRS if k in twin.user_attrs}
            values, name = list(twin.values), f"trial {twin.number}"
        attrs.update(source="schedule", status="ok", same_schedule_as=name,
                     notes=[f"the same step-by-step engine schedule as {name}, which differs only in scheduling "
                            "knobs: one configuration, measured once"])
        for key, value in attrs.items():
            trial.set_user_attr(key, value)
        set_constraints(trial, attrs)
        self.study.tell(trial, values if self.settings.multi_objective else values[0])
        self.say(f"trial {trial.number} {trial.params}: the same engine schedule as {name} (not measured again)")

    def plan_after_probes(self) -> None:
        """What the probes change about the search: a grid drops the points they show preempting and measures
        the feasible ones nearest the boundary first (the cheapest point is usually just below it); a sampler
        gets each boundary's last clean point enqueued first."""
        if not self.boundaries:
            return
        if self.grid is not None:
            kept = [p for p in self.grid if self.known_feasible(p) is not False]
            self.grid = sorted(kept, key=lambda p: (self.known_feasible(p) is not True, self.edge_distance(p)))
            return
        answers = self.answers()
        for boundary in self.boundaries.values():
            clean, _ = boundary.edge()
            if boundary.settled and clean is not None and flags_key(
                    {**boundary.others, boundary.knob: boundary.values[clean]}) not in answers:
                self.study.enqueue_trial({**boundary.others, boundary.knob: boundary.values[clean]},
                                         skip_if_exists=True)

    def search(self) -> None:
        queue = self.take_over()  # first, before anything new is asked
        if queue:
            self.say(f"resuming: {len(queue)} trial(s) an earlier run left in flight are measured first")
        asks_left = 5 * self.settings.n_trials + 20  # a sampler that only repeats itself must still end
        probed: set[int] = set()  # trials to be told a twin's answer if they have one (after a probe or a wait)
        probe_started: set[int] = set()  # trials whose schedule probe was started (at most n_trials of them)
        taken_over = {t.number for t in queue}  # they keep their own comparisons
        comparing: dict[int, optuna.trial.Trial] = {}  # trials whose own comparison runs now, on some slot
        waiting: dict[int, list[optuna.trial.Trial]] = {}  # comparing trial -> trials of its schedule, for its answer

        def in_flight_twin(trial: optuna.trial.Trial) -> optuna.trial.Trial | None:
            """A trial being compared on another slot that may be this one's configuration: its recorded schedule
            is this one's, or it has recorded none yet (its first replicates may be the baseline's) and differs
            in scheduling knobs alone at the same max_num_seqs and boundary knob. Its answer comes first: then
            this one is told it, or compared. (With one slot nothing is in flight while a trial starts.)"""
            flags = self.candidate_flags(trial.params)
            if trial.number in taken_over or self.schedules.fingerprint(flags) is None:
                return None
            for other in comparing.values():
                if other.number == trial.number:  # its own comparison, started again after a fault
                    continue
                theirs = self.candidate_flags(other.params)
                if self.schedules.same(flags, theirs) or (
                        self.schedules.fingerprint(theirs) is None and self.may_share_schedule(flags, theirs)):
                    return other
            return None

        def start(slot: int) -> Comparison | None:
            nonlocal asks_left
            while True:
                while not queue:
                    if self.measured_trials() + len(self.open) >= self.settings.n_trials:
                        return None
                    if (why := self.budget_left()) is not None:
                        if why != self.stopped_by:  # said once
                            self.stopped_by = why
                            self.say(f"search: stops here, {why}")
                        return None
                    if asks_left <= 0 and (point := self.nearest_unanswered()) is not None:
                        # the sampler only repeats itself: the clean points nearest a boundary come next, where
                        # the cheapest point usually lies (asked like any other, so the sampler learns them)
                        self.say(f"search: the sampler repeats itself; next, {point}, beside the boundary")
                        self.study.enqueue_trial(point, skip_if_exists=False)
                        asks_left = 1
                    if asks_left <= 0:
                        if asks_left == 0:
                            under_way = f", and the {len(comparing)} under way finish" if comparing else ""
                            self.say("search: the sampler kept proposing flags already answered (measured, or the "
                                     "same engine schedule as measured ones); it is asked no more: "
                                     f"{self.measured_trials()} trials answered{under_way}")
                            asks_left -= 1
                        return None
                    asks_left -= 1
                    trial, exhausted = self.propose()
                    if exhausted:
                        return None
                    if trial is not None:
                        queue.append(trial)
                trial = queue.pop(0)
                # its schedule probe has run: its twin's answer, if it has one (a trial taken over on a resume
                # keeps its own comparison)
                twin = self.schedule_twin(trial.params) if trial.number in probed else None
                if twin is None and (running := in_flight_twin(trial)) is not None:
                    waiting.setdefault(running.number, []).append(trial)  # told when that one is answered
                    self.say(f"trial {trial.number} {trial.params}: waits for trial {running.number}, being compared "
                             "now, which may be the same engine schedule")
                    continue
                if twin is None:
                    break
                del self.open[trial.number]
                self.tell_same_schedule(trial, twin)
            others = [t.params for n, t in comparing.items() if n != trial.number]
            if trial.number not in probed and (trial.number in probe_started or len(probe_started) < SCHEDULE_PROBES_PER_TRIAL * self.settings.n_trials) \
                    and self.schedule_probe_wanted(trial.params, others):
                probe_started.add(trial.number)
                comp = self.comparison(f"schedule probe {resume_key(trial)}", "probe", {}, 1, slot,
                                       arms={CANDIDATE: self.candidate_flags(trial.params)}, order=[CANDIDATE])
                comp.trial, comp.probe = trial, ("schedule",)
                return comp
            comp = self.comparison(resume_key(trial), "search", trial.params, self.settings.replicates, slot,
                                   lead=leader(trial.number), arms=self.search_arms(trial.params))
            comp.trial = trial
            comparing[trial.number] = trial
            return comp

        def finish(comp: Comparison) -> None:
            trial = comp.trial
            if comp.retry():
                self._again(comp)
                # it runs again from the queue: not in flight meanwhile, and those waiting for it wait behind it
                # (they wait for it again once it restarts)
                comparing.pop(trial.number, None)
                queue[:0] = [trial, *waiting.pop(trial.number, [])]
                return
            if comp.probe is not None:  # a schedule probe: next, the trial is told its twin's answer or compared
                probed.add(trial.number)  # (a run that failed fails its comparison too, blamed as usual)
                queue.insert(0, trial)
                return
            del self.open[trial.number], comparing[trial.number]
            # the trials that waited for this answer: told it next (or compared, if it failed)
            for later in reversed(waiting.pop(trial.number, [])):
                probed.add(later.number)
                queue.insert(0, later)
            if comp.discarded:
                trial.set_user_attr("discarded_comparisons", comp.discarded)
            fault = comp.fault()
            if fault is not None:
                why = fault.reason if fault.blame == "candidate" else \
                    f"{comp.faults + 1} attempts, each stopped by a fault not shown to be the flags' ({fault.reason})"
                trial.set_user_attr("status", "failed")
                trial.set_user_attr("blame", fault.blame)
                trial.set_user_attr("reason", why)
                trial.set_user_attr("comparison", comp.id)
                trial.set_user_attr("attempts_exhausted", fault.blame == "slot")  # the flags' fault or the slot's
                self.study.tell(trial, state=TrialState.FAIL)
                self.say(f"trial {trial.number} {trial.params}: FAILED ({why})")
                if fault.blame == "baseline" and self.reference is not None:  # the yardstick's arm
                    raise BaselineFails(f"{self.yardstick()} failed again ({comp.faults + 1} attempts at this "
                                        f"comparison stopped by faults, the last: {fault.record.get('reason')}), "
                                        "though it ran clean in the probes: search comparisons against it cannot "
                                        "go on; run the same command again to resume, or give a new study.name "
                                        "with study.reference=baseline")
                if fault.blame == "baseline":
                    raise BaselineFails(f"the baseline {self.baseline_flags} failed again ({comp.faults + 1} attempts "
                                        f"at this comparison stopped by faults, the last: {fault.record.get('reason')});"
                                        " a comparison against it cannot mean anything: fix what makes it fail (the "
                                        "same baseline flags, or the study refuses them) and run again")
                return
            analysis = analyse(list(comp.records.values()), comp.thresholds,
                               token_tolerance=self.settings.token_tolerance, cost=self.settings.cost_basis)
            attrs = trial_summary(analysis, self.settings)
            sequential = {"alpha_per_look": comp.thresholds.alpha, "looks": len(comp.looks),
                          "stopped": comp.stopped, "measured_positions": len(comp.records)}
            for key, value in {**attrs, **sequential, "status": "ok", "comparison": comp.id}.items():
                trial.set_user_attr(key, value)
            if analysis.estimate is None:
                trial.set_user_attr("reason", "; ".join(analysis.notes))
                self.study.tell(trial, state=TrialState.FAIL)
                return
            if self.reference is not None and attrs["baseline_preemptions"] > self.settings.max_preemptions:
                # clean by its probes, not by law (a slot with less KV, an engine less deterministic than closed-
                # loop work promises): its inflated cost would flatter the candidate. Answers nothing; on offer again
                why = (f"the reference preempted ({attrs['baseline_preemptions']} in one run) in this comparison, "
                       "though clean in its probes: the ratio would flatter the candidate")
                for key, value in {"status": "failed", "blame": "baseline", "reason": why}.items():
                    trial.set_user_attr(key, value)
                self.study.tell(trial, state=TrialState.FAIL)
                self.say(f"trial {trial.number} {trial.params}: not answered ({why})")
                return
            set_constraints(trial, attrs)
            if self.settings.multi_objective:
                self.study.tell(trial, [analysis.estimate.ratio, attrs["p95_e2e_s"]])
            else:
                self.study.tell(trial, analysis.estimate.ratio)
            broken = broken_constraints(attrs, self.settings)
            flag = "feasible" if not broken else f"INFEASIBLE ({'; '.join(broken)})"
            best = self.best()
            early = f" (stopped after {len(comp.records)} runs: {comp.stopped})" if comp.stopped else ""
            self.say(f"trial {trial.number} {trial.params}: ratio {attrs['ratio']:.3f} "
                     f"[{attrs['ci'][0]:.3f}, {attrs['ci'][1]:.3f}] {analysis.verdict}, {flag}{early}; best so far: "
                     f"{best.params if best else None}")

        while True:
            self.run_comparisons(start, finish, rest=self.runs_ahead)
            if not waiting:
                return
            # nothing runs, yet some wait (for a comparison that ended without finishing): never left open
            for number in list(waiting):
                queue.extend(waiting.pop(number))

    def best(self) -> optuna.trial.FrozenTrial | None:
        ranked = self.ranked(1)
        return ranked[0] if ranked else None

    def ranked(self, k: int) -> list[optuna.trial.FrozenTrial]:
        """The k feasible trials with the lowest ratio (distinct configurations: distinct flags, and not the
        same schedule as one ranked higher), never an infeasible or failed one, nor one told another's answer."""
        ranked: list[optuna.trial.FrozenTrial] = []
        for t in sorted((t for t in self.study.get_trials(deepcopy=False)
                         if feasible(t) and t.user_attrs.get("source") != "schedule"), key=cost):
            if len(ranked) == k:
                break
            flags = self.candidate_flags(t.params)
            if self.schedules.same(flags, self.baseline_flags):
                continue  # the baseline itself, as far as cost goes: nothing to confirm
            if not any(r.params == t.params or self.schedules.same(flags, self.candidate_flags(r.params))
                       for r in ranked):
                ranked.append(t)
        return ranked

    def pareto(self) -> list[optuna.trial.FrozenTrial]:
        """Feasible trials no other feasible trial beats on both cost and p95 latency, cheapest first."""
        points = self.ranked(len(self.study.trials))
        front = [t for t in points if not any(o.values[0] <= t.values[0] and o.values[1] <= t.values[1]
                                              and o.values != t.values for o in points)]
        return sorted(front, key=cost)

    # ---- confirmation -----------------------------------------------------------------------------------
    def confirm(self) -> list[Confirmation]:
        """Fresh interleaved replicates for the best few; their intervals Bonferroni-adjusted across them (and
        across the looks each may take). Sequential: those the search already showed clearly pricier than the
        best wait, and are confirmed only if no earlier one wins; the family counts them all the same."""
        # multi-objective: the cheapest points of the Pareto front (the others trade cost for latency)
        todo = (self.pareto() if self.settings.multi_objective else self.ranked(self.settings.confirm_top)
                )[: self.settings.confirm_top]
        family = max(1, len(todo))
        rounds = [todo]
        if self.settings.sequential and not self.settings.multi_objective and len(todo) > 1:
            best = to_rank(todo[0].user_attrs)
            # at the screens' own alpha (the reference has none of its own: the best's, then the plain one)
            later = [t for t in todo[1:] if best and (r := to_rank(t.user_attrs)) and clearly_lower(
                best, r, t.user_attrs.get("alpha_per_look") or todo[0].user_attrs.get("alpha_per_look")
                or self.settings.thresholds.alpha)]
            if later:
                rounds = [[t for t in todo if t not in later], later]
        results: list[Confirmation] = []
        for number, batch in enumerate(rounds):
            if number and choose_winner(results, self.settings.thresholds.alpha)[0] is not None:
                self.say("confirm: not re-measured, clearly pricier than the winner in the search: "
                         + ", ".join(f"trial {t.number} {t.params}" for t in batch))
                break
            results += self._confirm_batch(batch, family, ranked=len(batch) > 1)
        return sorted(results, key=lambda c: c.source_trial)

    def _confirm_batch(self, todo: list[optuna.trial.FrozenTrial], family: int, ranked: bool) -> list[Confirmation]:
        results: list[Confirmation] = []
        queue: list[list[optuna.trial.FrozenTrial]] = [list(todo)] if confirms_together(self.settings, self.pool, len(todo)) else [[t] for t in todo]

        def start(slot: int) -> Comparison | None:
            if not queue:
                return None
            group = queue.pop(0)
            if len(group) == 1:
                (t,) = group
                comp = self.comparison(f"confirm-{resume_key(t)}", "confirm", t.params,
                                       self.settings.confirm_replicates, slot, lead=leader(t.number), family=family,
                                       ranked=ranked)
                comp.source_trial = t.number
                return comp
            labels = {joint_arm(i): t for i, t in enumerate(group)}
            arms = {BASELINE: dict(self.baseline_flags),
                    **{label: {**self.base_flags, **t.params} for label, t in labels.items()}}
            order = joint_schedule(len(group), self.settings.confirm_replicates, lead=group[0].number)
            if self.settings.warmup_replicate:
                order = with_warmup(order)
            comp = self.comparison("confirm-" + "+".join(resume_key(t) for t in group), "confirm", {}, 0, slot,
                                   arms=arms, order=order, family=family, ranked=ranked)
            comp.joint = {label: t.number for label, t in labels.items()}
            return comp

        def confirmed(number: int, records: list[dict[str, Any]], comp: Comparison) -> None:
            analysis = analyse(records, self.settings.thresholds, token_tolerance=self.settings.token_tolerance,
                               cost=self.settings.cost_basis)
            # the interval quoted is Bonferroni-adjusted for the family of confirmed candidates and the looks
            # each may take, and the label is read off that same interval
            quoted = analyse(records, comp.thresholds, token_tolerance=self.settings.token_tolerance,
                             cost=self.settings.cost_basis)
            broken = broken_constraints(trial_summary(analysis, self.settings), self.settings)
            if (fault := comp.fault()) is not None:  # the replicates that are left are not the comparison that was planned
                broken.insert(0, f"failed in confirmation ({fault.blame}: {fault.record.get('reason')})")
            results.append(Confirmation(number, self.study.trials[number].params, analysis, adjusted=quoted,
                                        broken=broken, family=family, looks=len(comp.looks), stopped=comp.stopped,
                                        shared=sorted(comp.joint.values()) if comp.joint else None))

        def finish(comp: Comparison) -> None:
            group = ([self.study.trials[comp.source_trial]] if comp.joint is None
                     else [self.study.trials[n] for n in comp.joint.values()])
            if comp.retry():
                self._again(comp)
                queue.insert(0, group)
                return
            fault = comp.fault()
            records = list(comp.records.values())
            if comp.joint is None:
                confirmed(comp.source_trial, records, comp)
                return
            if fault is not None and fault.blame == "candidate":  # it is out; the others start again without it
                failed = fault.record.get("trial")
                confirmed(failed, candidate_view(records, failed), comp)
                rest = [t for t in group if t.number != failed]
                self.say(f"confirm {comp.key}: trial {failed} failed ({fault.record.get('reason')}); the others "
                         "are confirmed again without it")
                queue.insert(0, rest)
                return
            for number in comp.joint.values():  # (a fault of the baseline or the slot, the attempts spent: all)
                confirmed(number, candidate_view(records, number), comp)

        # the answer is quoted from these runs: with no other engine beside them on the machine (a neighbour's
        # load that followed their arms could move the ratio; benchmarks/local_slots.py bounds it, not to zero)
        def rest() -> int:  # the groups not started yet, each its whole schedule
            warmup = int(self.settings.warmup_replicate)
            return sum(((len(g) + 1) if len(g) > 1 else 2) * self.settings.confirm_replicates + warmup for g in queue)

        self.run_comparisons(start, finish, alone=True, rest=rest)
        return results

    def run(self) -> SweepResult:
        told = told_reference(self.study)  # a study keeps its yardstick, probed again or not (same_yardstick)
        self.reference = dict(told.params) if told is not None else None
        self.find_boundaries()
        self.plan_after_probes()
        self.plan = self.projected()
        if self.plan is not None:
            self.say(self.plan.sentence(slots=len(self.pool.slots), budget_usd=self.settings.budget_usd,
                                        timeout_s=self.settings.timeout_s))
        self.search()
        confirmations = self.confirm()
        winner, tied = choose_winner(confirmations, self.settings.thresholds.alpha)
        return SweepResult(self.study, confirmations, winner, self.records,
                           pareto=self.pareto() if self.settings.multi_objective else [],
                           cost_basis=self.settings.cost_basis, tied=tied)
