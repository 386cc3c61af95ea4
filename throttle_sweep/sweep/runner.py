"""Comparisons on the slots, and the one writer of records: which comparison runs for a key (decided from
the records, so a resume reuses what finished and starts afresh what a fault or an interruption left), its
runs submitted in the schedule's order on one slot, each record appended (fsync) as it arrives, and the
stopping rule at each look. Stages (probes, screen, confirm) hand it comparisons one at a time (`Stage`)."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import optuna

from throttle_sweep.cluster.pool import Job, Pool
from throttle_sweep.cluster.signals import deferred, shielded
from throttle_sweep.errors import ThrottleSweepError
from throttle_sweep.stats.analysis import analyse
from throttle_sweep.stats.comparison import (
    MAX_ATTEMPTS,
    Fault,
    comparison_id,
    fault_of,
    measured_positions,
    retry_key,
    settle,
)
from throttle_sweep.stats.schedule import BASELINE, CANDIDATE, make_schedule, with_warmup
from throttle_sweep.stats.verdict import Thresholds
from throttle_sweep.sweep.events import SweepProgress, Unseen
from throttle_sweep.sweep.options import SweepSettings
from throttle_sweep.sweep.sequential import confirm_stop, look_ends, per_look, search_stop, to_rank
from throttle_sweep.sweep.state import StudyView
from throttle_sweep.sweep.trials import broken_constraints, trial_summary


class SweepStopped(ThrottleSweepError):
    """The sweep cannot go on; it stops with everything measured kept, and the same command resumes it."""


class NoSlotsLeft(SweepStopped):
    """Every engine slot was lost."""


class BaselineFails(SweepStopped):
    """The baseline failed on its own, attempt after attempt: no comparison against it can mean anything."""


@dataclass
class Comparison:
    """One candidate against the baseline, in progress on one slot."""

    key: str
    stage: str  # probe | search | confirm
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
    probe: tuple[Any, ...] | None = None  # a probe: (search, value index, repeat), or ("schedule",)
    workload: dict[str, Any] | None = None  # what its runs change in the workload (a probe's shorter work)
    family: int = 1  # confirmations judged together (their alpha is shared)
    ranked: bool = False  # a confirmation that must also be told apart from others confirmed with it
    joint: dict[str, int] | None = None  # several candidates sharing the baseline's runs: arm label -> trial
    # looks an earlier attempt already took (undecided) before it was interrupted: this one does not take them
    # again, so that the looks taken in all spend the alpha planned once (the last look is always taken)
    skipped_looks: int = 0

    def next_position(self) -> int | None:
        return next((p for p in range(len(self.order)) if p not in self.records), None)

    def fault(self) -> Fault | None:
        return fault_of(self.records)

    def done(self) -> bool:
        return self.fault() is not None or self.next_position() is None or self.stopped is not None

    def at_look(self) -> bool:
        """Every position up to a look is measured, and no more."""
        return len(self.records) in self.looks[self.skipped_looks:-1] and self.next_position() == len(self.records)

    def retry(self) -> bool:
        """Stopped by a fault that is not the candidate's, with attempts left: start again afresh."""
        fault = self.fault()
        return fault is not None and fault.blame != "candidate" and self.faults + 1 < MAX_ATTEMPTS


class Stage(Protocol):
    """A stage's comparisons, one at a time: the next one for a free slot (None: none now), and each done one
    back (which may queue its work again, to start afresh). `rest`: the runs of comparisons not started yet,
    this stage's and later ones', as now estimated (for the progress total)."""

    def next(self, slot: int) -> Comparison | None: ...
    def finished(self, comp: Comparison) -> None: ...
    def rest(self) -> int: ...


def confirms_together(settings: SweepSettings, pool: Pool, candidates: int) -> bool:
    """Confirm these candidates on one joint schedule: where they would run one after another anyway (one
    slot, or slots that share a machine and so confirm alone), one set of baseline runs serves them all."""
    return settings.shared_baseline and candidates > 1 and (len(pool.slots) == 1 or pool.shares_machine)


class Runner:
    def __init__(self, *, pool: Pool, view: StudyView, workload_key: Mapping[str, Any],
                 write: Callable[[dict[str, Any]], None], records: list[dict[str, Any]],
                 progress: SweepProgress | None = None) -> None:
        self.pool, self.view, self.settings = pool, view, view.settings
        self.workload_key, self._write = dict(workload_key), write
        self.records = records  # every record of the study's run folder, in order
        self.progress = progress or Unseen()
        self.say = self.progress.note
        self.began = time.monotonic()  # the sweep's clock (study.timeout_s)
        self.write_failed = False  # a record could not be written: nothing more is appended

    def write(self, record: dict[str, Any]) -> None:
        try:
            self._write(record)
        except OSError:  # (a full disk) nothing is appended after it: a retry could follow a torn line
            self.write_failed = True
            raise
        self.records.append(record)
        if self.settings.same_schedule:
            self.view.schedules.add(record)

    def comparison(self, key: str, stage: str, params: Mapping[str, Any], replicates: int, slot: int,
                   lead: str = BASELINE, *, arms: Mapping[str, Mapping[str, Any]] | None = None,
                   order: Sequence[str] | None = None, family: int = 1, ranked: bool = False,
                   workload: Mapping[str, Any] | None = None) -> Comparison:
        """The comparison to run for `key`, decided from the records (`settle`): a complete one is reused,
        and so is one that stopped at a look where the stopping rule says it is decided; one to redo is left
        as it is and the work starts afresh under the next key ('trial-4' -> 'trial-4~1'). `arms` and
        `order` replace the interleaved schedule (a probe: one run of one arm); `workload`, what its runs change in
        the workload (a probe's shorter work)."""
        s = self.settings
        planned = order is None
        if arms is None:
            arms = {BASELINE: dict(self.view.baseline_flags), CANDIDATE: self.view.candidate_flags(params)}
        if order is None:
            order = make_schedule(s.schedule, replicates, seed=s.schedule_seed, lead=lead)
            if s.warmup_replicate:
                order = with_warmup(order)
        every = 4 if stage == "confirm" else 2  # confirmations: only balanced pairs (see sweep/sequential.py)
        looks = look_ends(order, s.warmup_replicate, every) if planned and s.sequential else [len(order)]
        thresholds = per_look(s.thresholds, len(looks), family)
        discarded, faults, partial, taken = [], 0, None, 0
        while True:
            cid = comparison_id(arms, list(order), {**self.workload_key, "key": key, "stage": stage,
                                                    **({"changed": dict(workload)} if workload else {})})
            done = measured_positions(self.records, cid)
            fault = fault_of(done)
            last = fault is not None and faults + 1 >= MAX_ATTEMPTS  # the attempts are spent: give up on it
            comp = Comparison(key, stage, dict(arms), list(order), cid, slot, records=done, discarded=discarded,
                              faults=faults, looks=looks, thresholds=thresholds, family=family, ranked=ranked,
                              skipped_looks=min(taken, len(looks) - 1),
                              workload=dict(workload) if workload else None)
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
            # the looks it reached before it was cut short or failed were taken, and did not stop it: a fresh
            # attempt does not take them again
            reached = len(done) if fault is None else fault.record["position"]
            taken = max(taken, sum(end <= reached for end in looks[:-1]))
            discarded.append(cid)
            faults += fault is not None
            key = retry_key(key)

    def stop_rule(self, comp: Comparison) -> str | None:
        """At a look: why the comparison is decided (search_stop / confirm_stop), or None to go on."""
        s = self.settings
        # a search comparison is judged with the noise pooled over the others; a confirmation on its own runs
        prior = self.view.noise_prior() if comp.stage == "search" else None
        analysis = analyse(list(comp.records.values()), comp.thresholds, token_tolerance=s.token_tolerance,
                           cost=s.cost_basis, prior=prior)
        if comp.stage == "confirm":
            return confirm_stop(analysis.verdict, ranked=comp.ranked)
        if analysis.estimate is not None and broken_constraints(trial_summary(analysis, s), s):
            return "infeasible: it broke a constraint"
        rivals = self.view.points()  # the best so far is the lowest of these
        best = rivals[0] if rivals else None
        warmup = int(s.warmup_replicate)  # the warm-up run is not analysed
        shrink = math.sqrt((len(comp.records) - warmup) / (len(comp.order) - warmup))
        return search_stop(analysis.verdict, analysis.estimate, to_rank(best.user_attrs) if best else None,
                           comp.thresholds.alpha, shrink, needs_saving=self.view.findings.reference is None,
                           rivals=len(rivals))

    def again(self, comp: Comparison) -> None:
        """Say that a comparison stopped by a fault not the candidate's starts again from scratch."""
        fault = comp.fault()
        self.say(f"{comp.stage} {comp.key}: stopped by a fault that is not the candidate's ({fault.blame}: "
                 f"{fault.record.get('reason')}); it starts again from scratch "
                 f"(attempt {comp.faults + 2} of {MAX_ATTEMPTS})")

    def runs_ahead(self) -> int:
        """The most runs the search and confirmation may still start: trials not yet under way, each a whole
        comparison, and the first round of confirmation (a progress estimate; early stops give runs back)."""
        s, warmup = self.settings, int(self.settings.warmup_replicate)
        trials_left = max(0, s.n_trials - self.view.measured_trials() - len(self.view.open))
        k = s.confirm_top
        confirm = ((k + 1) * s.confirm_replicates + warmup if confirms_together(s, self.pool, k)
                   else k * (2 * s.confirm_replicates + warmup)) if k else 0
        return trials_left * (2 * s.replicates + warmup) + confirm

    # ---- running a stage --------------------------------------------------------------------------------
    def run(self, stage: Stage, alone: bool = False) -> None:
        """Keep every slot busy with the stage's comparisons; a comparison's replicates all run on its slot.
        `alone`: one comparison at a time, where slots share one machine (local slots share its cores and
        memory bus)."""
        try:
            self._run(stage, alone and self.pool.shares_machine)
        except BaseException:  # Ctrl-C, SIGTERM, a failed baseline: what other slots finished meanwhile is kept
            self.keep_finished()
            raise

    def keep_finished(self, *, cut_short: bool = True) -> None:
        """Write what the slots finished and the driver has not written yet (a run that is stopping), with a
        second Ctrl-C held off meanwhile. `cut_short=False` (after the slots were closed): not the replicates
        the closing itself cut short, which are the shutdown's doing and say nothing of the flags."""
        with shielded():
            for record in self.pool.drain():
                if self.write_failed:  # nothing is appended after a write that failed
                    return
                if not cut_short and record.get("infrastructure"):
                    continue
                with contextlib.suppress(OSError):
                    self.write(record)

    def _run(self, stage: Stage, alone: bool) -> None:
        running: dict[int, Comparison] = {}
        exhausted = False
        while True:
            if not self.pool.slots:
                raise NoSlotsLeft("every engine slot was lost (their nodes died); the records and the study "
                                  "keep everything measured: run the same command again to resume")
            for slot in self.pool.slots[:1] if alone else self.pool.slots:
                while slot not in running and not exhausted:
                    comp = stage.next(slot)
                    if comp is None:
                        exhausted = True
                    elif comp.done():
                        stage.finished(comp)  # everything was measured before an interruption
                    else:
                        running[slot] = comp
                        self.progress.plan(len(comp.order) - len(comp.records))
                        self.progress.expect(stage.rest())
                        self._submit(comp, running, alone)
            self.progress.expect(stage.rest())
            if not running:
                return
            batch = self.pool.wait()
            with deferred():  # every record is written before any is acted on (which may stop the run), and
                for job, record in batch:  # a Ctrl-C meanwhile waits until all are
                    self.write(record)
                    self.pool.written(job)
                    running[job.slot].records[job.position] = record
                    self.progress.finished()
            for job, _ in batch:
                comp = running[job.slot]
                if comp.at_look() and comp.fault() is None:
                    comp.stopped = self.stop_rule(comp)
                if comp.done():
                    del running[job.slot]
                    self.progress.plan(-(len(comp.order) - len(comp.records)))  # stopped early: never run
                    stage.finished(comp)
                    exhausted = False  # finished may have queued the work again
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
                   "slots": 1 if alone else len(self.pool.slots),  # how many measured side by side
                   **({"workload_changed": comp.workload} if comp.workload else {})}
        if comp.probe is not None:
            message = f"{comp.key} on slot {comp.slot}"
        else:
            message = (f"{comp.stage} {comp.key}: {arm} replicate at position {position + 1}/{len(comp.order)} "
                       f"on slot {comp.slot}")
        if len(self.pool.slots) > 1:  # what every slot is doing now
            busy = {s: f"{c.key} {c.order[p]} {p + 1}/{len(c.order)}" for s, c in running.items()
                    if (p := c.next_position()) is not None}
            message += "  | " + "  ".join(f"[{s}] {busy.get(s, 'idle')}" for s in self.pool.slots)
        self.progress.step(message, slot=str(comp.slot))
        # a joint comparison's candidates are each the candidate arm of their own view (analysis.candidate_view)
        self.pool.submit(Job(comp.slot, comp.arms[arm], BASELINE if arm == BASELINE else CANDIDATE, position, context,
                             comp.workload))
