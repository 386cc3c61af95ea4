"""The sweep, in order: probes (the preemption boundary, the yardstick), the projection of what the rest
costs, the search (the Optuna loop), confirmation of the best few against the baseline, a tie-break among
confirmed savings it could not tell apart, and the winner.
Each stage lives in its own module and hands its comparisons to the runner, the only writer of records;
what the stages learn is kept in one `StudyView`.

A resume is the same command again: what a comparison's records say decides what happens to it (the
runner's `settle`), and trials a killed driver left RUNNING are taken over before anything new is asked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna

from throttle_sweep.cluster.pool import Pool
from throttle_sweep.engines.flags import flags_key
from throttle_sweep.sweep.budget import projected, say_plan
from throttle_sweep.sweep.confirm import confirm
from throttle_sweep.sweep.events import SweepProgress
from throttle_sweep.sweep.options import SweepSettings
from throttle_sweep.sweep.plan import Plan
from throttle_sweep.sweep.probes import find_boundaries
from throttle_sweep.sweep.refusals import record_refusals
from throttle_sweep.sweep.runner import Runner
from throttle_sweep.sweep.schedules import ScheduleIndex
from throttle_sweep.sweep.screen import Screen
from throttle_sweep.sweep.state import StudyView
from throttle_sweep.sweep.tiebreak import TieBreak, break_tie, tiebreak_needed
from throttle_sweep.sweep.trials import told_reference
from throttle_sweep.sweep.winner import Certainty, Confirmation, choose_winner, how_sure


@dataclass
class SweepResult:
    study: optuna.Study
    confirmations: list[Confirmation]
    winner: Confirmation | None
    records: list[dict[str, Any]]
    pareto: list[optuna.trial.FrozenTrial] = field(default_factory=list)  # multi-objective only
    cost_basis: str = "steady"  # which cost per token the ratios judge
    tied: list[Confirmation] = field(default_factory=list)  # confirmed savings the winner could not be told from
    certainty: Certainty | None = None  # how sure the pick is (None: no rival to be surer than)
    tiebreak: TieBreak | None = None  # the runs that broke a tie among confirmed savings (None: no tie to break)
    stopped_by: str | None = None  # why the search stopped before its trials were done (its budget), if it did
    confirm_cut: bool = False  # the budget stopped the confirmation before every candidate was confirmed


class Sweep:
    def __init__(self, *, study: optuna.Study, distributions: Mapping[str, Any], base_flags: Mapping[str, Any],
                 baseline_flags: Mapping[str, Any], workload_key: Mapping[str, Any], pool: Pool,
                 write: Callable[[dict[str, Any]], None], existing: Sequence[dict[str, Any]],
                 settings: SweepSettings, grid: Sequence[Mapping[str, Any]] | None = None,
                 progress: SweepProgress | None = None,
                 refusal: Callable[[Mapping[str, Any]], str | None] | None = None) -> None:
        records = list(existing)
        # flags -> the engine schedules their runs recorded (left empty, nothing is merged on schedules)
        schedules = ScheduleIndex(records if settings.same_schedule else ())
        self.view = StudyView(study=study, distributions=distributions, settings=settings, base_flags=base_flags,
                              baseline_flags=baseline_flags, schedules=schedules, refusal=refusal)
        self.runner = Runner(pool=pool, view=self.view, workload_key=workload_key, write=write, records=records,
                             progress=progress)
        self.grid = [dict(p) for p in grid] if grid is not None else None  # grid points, in the order to measure

    def run(self) -> SweepResult:
        view, runner, s = self.view, self.runner, self.view.settings
        told = told_reference(view.study)  # a study keeps its yardstick, probed again or not (same_yardstick)
        view.findings.reference = dict(told.params) if told is not None else None
        self.find_boundaries()
        self.grid = arranged(view, self.grid)
        # said once the baseline ran (probes.py); again only if probes ran since, with their times
        probed = any(view.findings.probe_runs.values())
        plan = say_plan(runner, basis="the probes' run times") if probed else projected(runner)
        stopped_by = self.search(plan)
        confirmations, confirm_stopped = self.confirm()
        stopped_by = confirm_stopped or stopped_by
        winner, tied = choose_winner(confirmations, s.thresholds.alpha)
        tie = break_tie(runner, view, [winner, *tied]) if tiebreak_needed(winner, tied, s.tiebreak_replicates) \
            else None
        runs = tie.observations if tie is not None else []
        if runs:
            winner, tied = choose_winner(confirmations, s.thresholds.alpha, tiebreak=runs)
        sure = how_sure(winner, confirmations, s.thresholds.claim, tiebreak=runs) if winner is not None else None
        return SweepResult(view.study, confirmations, winner, runner.records,
                           pareto=view.pareto() if s.multi_objective else [], cost_basis=s.cost_basis, tied=tied,
                           certainty=sure, tiebreak=tie, stopped_by=stopped_by,
                           confirm_cut=confirm_stopped is not None)

    def find_boundaries(self) -> None:
        find_boundaries(self.runner, self.view)
        record_refusals(self.view)

    def search(self, plan: Plan | None = None) -> str | None:
        """The search; why it stopped early (its budget), or None."""
        screen = Screen(self.runner, self.view, self.grid, plan)
        screen.run()
        return screen.stopped_by

    def confirm(self) -> tuple[list[Confirmation], str | None]:
        return confirm(self.runner, self.view)

    def keep_finished(self, *, cut_short: bool = True) -> None:
        self.runner.keep_finished(cut_short=cut_short)


def arranged(view: StudyView, grid: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """What the probes change about the search: a grid drops the points they show preempting and measures
    the feasible ones nearest the boundary first (the cheapest point is usually just below it); a sampler
    gets each boundary's last clean point enqueued first."""
    boundaries = view.findings.boundaries
    if not boundaries:
        return grid
    if grid is not None:
        kept = [p for p in grid if view.known_feasible(p) is not False]
        return sorted(kept, key=lambda p: (view.known_feasible(p) is not True, view.edge_distance(p)))
    answers = view.answers()
    for boundary in boundaries.values():
        clean, _ = boundary.edge()
        if boundary.settled and clean is not None:
            point = {**boundary.others, boundary.knob: boundary.values[clean]}
            if flags_key(point) not in answers:
                view.study.enqueue_trial(point, skip_if_exists=True)
    return grid
