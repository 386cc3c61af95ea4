"""The tie-break stage: when no direct contrast tells the winner from other confirmed savings, those alone are
run again against each other, with no baseline runs (schedule.tiebreak_schedule), and the winner rule ranks
them on one fit over these runs and their joint confirmation's (winner.broken_tie). Their claims against the
baseline stay the confirmation's. Simulated (tests/unit/test_tiebreak.py: three costs within 1.35%, 2% noise),
8 more runs each put the pick within 1% of the cheapest in 0.97 of runs, against 0.89 on the confirmation's
4; the same runs spread over every confirmed arm, baseline included, would buy less where the tie is."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from throttle_sweep.stats.schedule import joint_arm, tiebreak_schedule, with_warmup
from throttle_sweep.stats.verdict import Observation
from throttle_sweep.store.records import is_ok
from throttle_sweep.sweep.budget import spent
from throttle_sweep.sweep.runner import Comparison, Runner
from throttle_sweep.sweep.state import StudyView
from throttle_sweep.sweep.trials import resume_key
from throttle_sweep.sweep.winner import Confirmation

STAGE = "tiebreak"


@dataclass
class TieBreak:
    """What a tie-break ran: its candidates (source trials), runs planned each, and the runs as observations
    for the winner rule's fit (segment 1: their own schedule). Empty observations: it failed, and the
    confirmation's ranking stands."""
    trials: list[int]
    replicates: int
    observations: list[Observation] = field(default_factory=list)
    failed: str | None = None


def tiebreak_needed(winner: Confirmation | None, tied: Sequence[Confirmation], replicates: int) -> bool:
    """Ties to break, all on the winner's joint schedule (separate confirmations share no runs to fit with)."""
    return bool(winner is not None and tied and replicates and winner.shared
                and all(c.shared == winner.shared for c in tied))


def break_tie(runner: Runner, view: StudyView, contenders: Sequence[Confirmation]) -> TieBreak:
    # each run's cost as the confirmation judged its runs (the basis its records allowed)
    stage = TieBreakStage(runner, view, sorted(c.source_trial for c in contenders), contenders[0].analysis.cost_of)
    runner.say(f"tie-break: trials {', '.join(map(str, stage.trials))} could not be told apart in confirmation; "
               f"{view.settings.tiebreak_replicates} more runs each, against each other alone")
    runner.run(stage, alone=True)  # like confirmation: the pick is made on these runs
    return stage.result


class TieBreakStage:
    """One comparison of candidate runs only (runner.Stage); a fault not a candidate's starts it afresh."""

    def __init__(self, runner: Runner, view: StudyView, trials: list[int],
                 cost_of: Callable[[dict[str, Any]], float]) -> None:
        self.runner, self.view, self.trials, self.cost_of = runner, view, trials, cost_of
        self.result = TieBreak(trials, view.settings.tiebreak_replicates)
        self.pending = True

    def next(self, slot: int) -> Comparison | None:
        if not self.pending:
            return None
        self.pending = False
        s, trials = self.view.settings, self.view.study.trials
        labels = {joint_arm(i): n for i, n in enumerate(self.trials)}
        arms = {label: self.view.candidate_flags(trials[n].params) for label, n in labels.items()}
        order = tiebreak_schedule(len(labels), s.tiebreak_replicates, lead=self.trials[0])
        if s.warmup_replicate:
            order = with_warmup(order)
        key = f"{STAGE}-" + "+".join(resume_key(trials[n]) for n in self.trials)
        comp = self.runner.comparison(key, STAGE, {}, 0, slot, arms=arms, order=order)
        comp.joint = labels
        if not comp.done() and (gone := spent(self.runner)) is not None:  # what the records hold is still read
            self.runner.say(f"tie-break: not run, {gone[2]} ({gone[0]}={gone[1]:g}); the confirmation's ranking "
                            "stands")
            return None
        return comp

    def finished(self, comp: Comparison) -> None:
        if comp.retry():
            self.runner.again(comp)
            self.pending = True
            return
        if (fault := comp.fault()) is not None:
            self.result.failed = f"{fault.blame}: {fault.record.get('reason')}"
            self.runner.say(f"tie-break {comp.key} failed ({self.result.failed}); the confirmation's ranking stands")
            return
        self.result.observations = [
            Observation(f"trial-{r['trial']}", r["position"], self.cost_of(r), segment=1)
            for r in sorted(comp.records.values(), key=lambda r: r["position"])
            if is_ok(r) and r.get("usd_per_mtok") is not None and not r.get("warmup")]

    def rest(self) -> int:
        s = self.view.settings
        return (len(self.trials) * s.tiebreak_replicates + int(s.warmup_replicate)) if self.pending else 0

