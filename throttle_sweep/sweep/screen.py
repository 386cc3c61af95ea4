"""The search stage: the sampler proposes flags, each new configuration is compared against the yardstick
(interleaved, sequential), and the study is told its answer. A proposal already answered, beyond the
probed boundary, or known to run another configuration's engine schedule is told at once, never measured;
one whose schedule may be a measured one's gets a single schedule probe first (sweep/schedules.py).
Trials a killed or interrupted driver left RUNNING are taken over before anything new is asked."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import optuna
from optuna.trial import TrialState

from throttle_sweep.engines.flags import flags_key
from throttle_sweep.stats.analysis import analyse
from throttle_sweep.stats.schedule import CANDIDATE
from throttle_sweep.sweep.budget import budget_left
from throttle_sweep.sweep.plan import Plan
from throttle_sweep.sweep.probes import close_beyond_boundary
from throttle_sweep.sweep.refusals import refused, tell_refused
from throttle_sweep.sweep.runner import BaselineFails, Comparison, Runner
from throttle_sweep.sweep.state import StudyView
from throttle_sweep.sweep.study import left_running
from throttle_sweep.sweep.trials import (
    broken_constraints,
    leader,
    measured,
    resume_key,
    set_constraints,
    trial_summary,
)
from throttle_sweep.sweep.twins import tell_same_schedule

# a schedule probe is one run against a comparison's four or more: a sweep may run this many per trial it measures
SCHEDULE_PROBES_PER_TRIAL = 3


class Screen:
    """The search's comparisons (runner.Stage). State it keeps between them: trials queued to measure, those
    whose schedule probe has run, those compared now, and those waiting for a compared twin's answer."""

    def __init__(self, runner: Runner, view: StudyView, grid: list[dict[str, Any]] | None,
                 plan: Plan | None = None) -> None:
        self.runner, self.view, self.grid, self.plan = runner, view, grid, plan
        self.stopped_by: str | None = None  # why the search stopped before its trials were done
        self.queue = self.take_over()  # first, before anything new is asked
        self.asks_left = 5 * view.settings.n_trials + 20  # a sampler that only repeats itself must still end
        self.probed: set[int] = set()  # trials to be told a twin's answer if they have one (after a probe or a wait)
        self.probe_started: set[int] = set()  # trials whose schedule probe was started (at most a few per trial)
        self.taken_over = {t.number for t in self.queue}  # they keep their own comparisons
        self.comparing: dict[int, optuna.trial.Trial] = {}  # trials whose own comparison runs now, on some slot
        self.waiting: dict[int, list[optuna.trial.Trial]] = {}  # comparing trial -> trials of its schedule

    def run(self) -> None:
        if self.queue:
            self.runner.say(f"resuming: {len(self.queue)} trial(s) an earlier run left in flight are measured first")
        while True:
            self.runner.run(self)
            if not self.waiting:
                return
            # nothing runs, yet some wait (for a comparison that ended without finishing): never left open
            for number in list(self.waiting):
                self.queue.extend(self.waiting.pop(number))

    def take_over(self) -> list[optuna.trial.Trial]:
        """Trials an earlier driver left RUNNING (killed, interrupted, or out of slots): this run owns them now."""
        trials = left_running(self.view.study)
        self.view.open.update({t.number: t for t in trials})
        return trials

    def rest(self) -> int:
        return self.runner.runs_ahead()

    # ---- the next comparison ----------------------------------------------------------------------------
    def next(self, slot: int) -> Comparison | None:
        while True:
            if not self.queue and not self.ask():
                return None
            trial = self.queue.pop(0)
            # its schedule probe has run: its twin's answer, if it has one (a trial taken over on a resume
            # keeps its own comparison)
            twin = self.view.schedule_twin(trial.params) if trial.number in self.probed else None
            if twin is None and (running := self.in_flight_twin(trial)) is not None:
                self.waiting.setdefault(running.number, []).append(trial)  # told when that one is answered
                self.runner.say(f"trial {trial.number} {trial.params}: waits for trial {running.number}, being "
                                "compared now, which may be the same engine schedule")
                continue
            if twin is None:
                return self.comparison_for(trial, slot)
            del self.view.open[trial.number]
            tell_same_schedule(self.runner, self.view, trial, twin)

    def ask(self) -> bool:
        """Queue the next trial to measure; False when the search is done (its trials, its budget, or a
        sampler that only repeats itself)."""
        v = self.view
        while not self.queue:
            if v.measured_trials() + len(v.open) >= v.settings.n_trials:
                return False
            if (why := budget_left(self.runner, self.plan)) is not None:
                if why != self.stopped_by:  # said once
                    self.stopped_by = why
                    self.runner.say(f"search: stops here, {why}")
                return False
            if self.asks_left <= 0 and (point := v.nearest_unanswered()) is not None:
                # the sampler only repeats itself: the clean points nearest a boundary come next, where the
                # cheapest point usually lies (asked like any other, so the sampler learns them)
                self.runner.say(f"search: the sampler repeats itself; next, {point}, beside the boundary")
                v.study.enqueue_trial(point, skip_if_exists=False)
                self.asks_left = 1
            if self.asks_left <= 0:
                if self.asks_left == 0:
                    under_way = f", and the {len(self.comparing)} under way finish" if self.comparing else ""
                    self.runner.say("search: the sampler kept proposing flags already answered (measured, or the "
                                    "same engine schedule as measured ones); it is asked no more: "
                                    f"{v.measured_trials()} trials answered{under_way}")
                    self.asks_left -= 1
                return False
            self.asks_left -= 1
            trial, exhausted = self.propose()
            if exhausted:
                return False
            if trial is not None:
                self.queue.append(trial)
        return True

    def propose(self) -> tuple[optuna.trial.Trial | None, bool]:
        """(the next trial to measure, or None for a repeat; whether the grid is exhausted). The next trial
        is a waiting one (enqueued earlier), the next grid point not yet answered, or the sampler's
        proposal. A proposal of flags already answered is closed at once as a repeat (never re-told as a new
        observation, never measured again)."""
        v = self.view
        answers = v.answers()
        if self.grid is not None and not v.trials(TrialState.WAITING):
            point = next((p for p in self.grid if flags_key(p) not in answers), None)
            if point is None:
                return None, True
            v.study.enqueue_trial(point, skip_if_exists=False)
        trial = v.study.ask(v.distributions)  # takes the oldest waiting trial first
        twin = answers.get(flags_key(trial.params))
        if twin is not None:
            trial.set_user_attr("duplicate_of", twin)
            v.study.tell(trial, state=TrialState.FAIL)
            return None, False
        if (why := refused(v, trial.params)) is not None:  # never started: vLLM would refuse it
            tell_refused(v, trial, why)
            self.runner.say(f"trial {trial.number} {trial.params}: refused by the engine, not run ({why})")
            return None, False
        if v.known_feasible(trial.params) is False:
            close_beyond_boundary(v, trial)
            return None, False
        if (same := v.schedule_twin(trial.params)) is not None:
            tell_same_schedule(self.runner, v, trial, same)
            return None, False
        v.open[trial.number] = trial
        return trial, False

    def in_flight_twin(self, trial: optuna.trial.Trial) -> optuna.trial.Trial | None:
        """A trial being compared on another slot that may be this one's configuration: its recorded schedule
        is this one's, or it has recorded none yet (its first replicates may be the baseline's) and differs
        in scheduling knobs alone at the same max_num_seqs and boundary knob. Its answer comes first: then
        this one is told it, or compared. (With one slot nothing is in flight while a trial starts.)"""
        v = self.view
        flags = v.candidate_flags(trial.params)
        if trial.number in self.taken_over or v.schedules.fingerprint(flags) is None:
            return None
        for other in self.comparing.values():
            if other.number == trial.number:  # its own comparison, started again after a fault
                continue
            theirs = v.candidate_flags(other.params)
            if v.schedules.same(flags, theirs) or (
                    v.schedules.fingerprint(theirs) is None and v.may_share_schedule(flags, theirs)):
                return other
        return None

    def comparison_for(self, trial: optuna.trial.Trial, slot: int) -> Comparison:
        """The trial's schedule probe, if one is worth it (and the few per trial are not spent), else its
        comparison against the yardstick."""
        v, s = self.view, self.view.settings
        others = [t.params for n, t in self.comparing.items() if n != trial.number]
        if trial.number not in self.probed and (
                trial.number in self.probe_started
                or len(self.probe_started) < SCHEDULE_PROBES_PER_TRIAL * s.n_trials) \
                and schedule_probe_wanted(v, trial.params, others):
            self.probe_started.add(trial.number)
            comp = self.runner.comparison(f"schedule probe {resume_key(trial)}", "probe", {}, 1, slot,
                                          arms={CANDIDATE: v.candidate_flags(trial.params)}, order=[CANDIDATE])
            comp.trial, comp.probe = trial, ("schedule",)
            return comp
        comp = self.runner.comparison(resume_key(trial), "search", trial.params, s.replicates, slot,
                                      lead=leader(trial.number), arms=v.search_arms(trial.params))
        comp.trial = trial
        self.comparing[trial.number] = trial
        return comp

    # ---- a finished comparison --------------------------------------------------------------------------
    def finished(self, comp: Comparison) -> None:
        trial = comp.trial
        if comp.retry():
            self.runner.again(comp)
            # it runs again from the queue: not in flight meanwhile, and those waiting for it wait behind it
            # (they wait for it again once it restarts)
            self.comparing.pop(trial.number, None)
            self.queue[:0] = [trial, *self.waiting.pop(trial.number, [])]
            return
        if comp.probe is not None:  # a schedule probe: next, the trial is told its twin's answer or compared
            self.probed.add(trial.number)  # (a run that failed fails its comparison too, blamed as usual)
            self.queue.insert(0, trial)
            return
        del self.view.open[trial.number], self.comparing[trial.number]
        # the trials that waited for this answer: told it next (or compared, if it failed)
        for later in reversed(self.waiting.pop(trial.number, [])):
            self.probed.add(later.number)
            self.queue.insert(0, later)
        if comp.discarded:
            trial.set_user_attr("discarded_comparisons", comp.discarded)
        if comp.fault() is not None:
            self.failed(trial, comp)
        else:
            self.tell(trial, comp)

    def failed(self, trial: optuna.trial.Trial, comp: Comparison) -> None:
        """A comparison stopped by a fault: the trial fails, blamed; a yardstick that keeps failing stops the sweep."""
        fault = comp.fault()
        why = fault.reason if fault.blame == "candidate" else \
            f"{comp.faults + 1} attempts, each stopped by a fault not shown to be the flags' ({fault.reason})"
        for key, value in {"status": "failed", "blame": fault.blame, "reason": why, "comparison": comp.id,
                           "attempts_exhausted": fault.blame == "slot"}.items():  # the flags' fault or the slot's
            trial.set_user_attr(key, value)
        self.view.study.tell(trial, state=TrialState.FAIL)
        self.runner.say(f"trial {trial.number} {trial.params}: FAILED ({why})")
        if fault.blame != "baseline":
            return
        if self.view.findings.reference is not None:  # the yardstick's arm
            raise BaselineFails(f"{self.view.yardstick()} failed again ({comp.faults + 1} attempts at this "
                                f"comparison stopped by faults, the last: {fault.record.get('reason')}), "
                                "though it ran clean in the probes: search comparisons against it cannot "
                                "go on; run the same command again to resume, or give a new study.name "
                                "with study.reference=baseline")
        raise BaselineFails(f"the baseline {self.view.baseline_flags} failed again ({comp.faults + 1} attempts "
                            f"at this comparison stopped by faults, the last: {fault.record.get('reason')});"
                            " a comparison against it cannot mean anything: fix what makes it fail (the "
                            "same baseline flags, or the study refuses them) and run again")

    def tell(self, trial: optuna.trial.Trial, comp: Comparison) -> None:
        """A whole comparison: its ratio, interval and constraints told to the study."""
        v, s = self.view, self.view.settings
        analysis = analyse(list(comp.records.values()), comp.thresholds, token_tolerance=s.token_tolerance,
                           cost=s.cost_basis, prior=v.noise_prior())  # the noise pooled over the others so far
        attrs = trial_summary(analysis, s)
        sequential = {"alpha_per_look": comp.thresholds.alpha, "looks": len(comp.looks),
                      "stopped": comp.stopped, "measured_positions": len(comp.records)}
        for key, value in {**attrs, **sequential, "status": "ok", "comparison": comp.id}.items():
            trial.set_user_attr(key, value)
        if analysis.estimate is None:
            trial.set_user_attr("reason", "; ".join(analysis.notes))
            v.study.tell(trial, state=TrialState.FAIL)
            return
        if v.findings.reference is not None and attrs["baseline_preemptions"] > s.max_preemptions:
            # clean by its probes, not by law (a slot with less KV, an engine less deterministic than closed-
            # loop work promises): its inflated cost would flatter the candidate. Answers nothing; on offer again
            why = (f"the reference preempted ({attrs['baseline_preemptions']} in one run) in this comparison, "
                   "though clean in its probes: the ratio would flatter the candidate")
            for key, value in {"status": "failed", "blame": "baseline", "reason": why}.items():
                trial.set_user_attr(key, value)
            v.study.tell(trial, state=TrialState.FAIL)
            self.runner.say(f"trial {trial.number} {trial.params}: not answered ({why})")
            return
        set_constraints(trial, attrs)
        v.study.tell(trial, [analysis.estimate.ratio, attrs["p95_e2e_s"]] if s.multi_objective
                     else analysis.estimate.ratio)
        broken = broken_constraints(attrs, s)
        flag = "feasible" if not broken else f"INFEASIBLE ({'; '.join(broken)})"
        best = v.best()
        early = f" (stopped after {len(comp.records)} runs: {comp.stopped})" if comp.stopped else ""
        self.runner.say(f"trial {trial.number} {trial.params}: ratio {attrs['ratio']:.3f} "
                        f"[{attrs['ci'][0]:.3f}, {attrs['ci'][1]:.3f}] {analysis.verdict}, {flag}{early}; "
                        f"best so far: {best.params if best else None}")
        self.runner.progress.best(str(best.params if best else None))


def schedule_probe_wanted(view: StudyView, params: Mapping[str, Any],
                          in_flight: Sequence[Mapping[str, Any]] = ()) -> bool:
    """Is one run of these flags worth it before their comparison? When their schedule is unknown, the
    engine records schedules, and a measured configuration (the baseline, a trial, or one being compared on
    another slot: `in_flight`) differs from them in scheduling knobs alone, with the same max_num_seqs and
    boundary knob: if the run shows that one's schedule, it answers them for a single run instead of a
    comparison (sweep/schedules.py). Values of those knobs themselves nearly always schedule differently,
    so they are compared without one."""
    flags = view.candidate_flags(params)
    if not view.schedules or view.schedules.fingerprint(flags) is not None:
        return False
    known = [view.baseline_flags] if view.findings.baseline_probe is not None else []
    known += [view.candidate_flags(t.params) for t in view.trials(TrialState.COMPLETE) if measured(t)]
    known = [other for other in known if view.schedules.fingerprint(other) is not None]
    # one in flight may have no schedule yet: its first replicate will record it, most likely before the probe ends
    known += [view.candidate_flags(p) for p in in_flight]
    return any(view.may_share_schedule(flags, other) for other in known)
