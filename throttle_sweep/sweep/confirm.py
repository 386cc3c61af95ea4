"""The confirmation stage: the best few re-measured against the baseline with fresh interleaved replicates,
their intervals Bonferroni-adjusted across the family (and the looks each may take), alone on the machine.
Where they would run one after another anyway, one joint schedule shares the baseline's runs among them."""

from __future__ import annotations

from typing import Any

import optuna

from throttle_sweep.stats.analysis import Analysis, analyse, analyse_joint, candidate_view
from throttle_sweep.stats.schedule import BASELINE, joint_arm, joint_schedule, with_warmup
from throttle_sweep.stats.verdict import clearly_lower
from throttle_sweep.sweep.budget import spent
from throttle_sweep.sweep.runner import Comparison, Runner, confirms_together
from throttle_sweep.sweep.sequential import selected, to_rank
from throttle_sweep.sweep.state import StudyView
from throttle_sweep.sweep.trials import broken_constraints, leader, resume_key, trial_summary
from throttle_sweep.sweep.winner import Confirmation, choose_winner


def confirm(runner: Runner, view: StudyView) -> tuple[list[Confirmation], str | None]:
    """Fresh interleaved replicates for the best few, and why the budget stopped them (None: it did not).
    Sequential: those the search already showed clearly pricier than the best wait, and are confirmed only if
    no earlier one wins; the family counts them all the same."""
    s = view.settings
    # multi-objective: the cheapest points of the Pareto front (the others trade cost for latency)
    todo = (view.pareto() if s.multi_objective else view.ranked(s.confirm_top))[: s.confirm_top]
    family = max(1, len(todo))
    rounds = [todo]
    if s.sequential and not s.multi_objective and len(todo) > 1:
        best = to_rank(todo[0].user_attrs)
        rivals = len(view.points())  # the best is the lowest of these
        # at the screens' own alpha (the reference has none of its own: the best's, then the plain one), over
        # the rivals an estimated best was selected from (sequential.selected)
        later = [t for t in todo[1:] if best and (r := to_rank(t.user_attrs)) and clearly_lower(
            best, r, selected(t.user_attrs.get("alpha_per_look") or todo[0].user_attrs.get("alpha_per_look")
                              or s.thresholds.alpha, best, rivals))]
        if later:
            rounds = [[t for t in todo if t not in later], later]
    results: list[Confirmation] = []
    stopped_by = None
    for number, batch in enumerate(rounds):
        if number and choose_winner(results, s.thresholds.alpha)[0] is not None:
            runner.say("confirm: not re-measured, clearly pricier than the winner in the search: "
                       + ", ".join(f"trial {t.number} {t.params}" for t in batch))
            break
        stage = Confirm(runner, view, batch, family, ranked=len(batch) > 1)
        # the answer is quoted from these runs: with no other engine beside them on the machine (a neighbour's
        # load that followed their arms could move the ratio; benchmarks/local_slots.py bounds it, not to zero)
        runner.run(stage, alone=True)
        results += stage.results
        if (stopped_by := stage.stopped_by) is not None:
            break
    return sorted(results, key=lambda c: c.source_trial), stopped_by


class Confirm:
    """One round of confirmations (runner.Stage): each candidate alone against the baseline, or all on one
    joint schedule."""

    def __init__(self, runner: Runner, view: StudyView, todo: list[optuna.trial.FrozenTrial], family: int,
                 ranked: bool) -> None:
        self.runner, self.view, self.family, self.ranked = runner, view, family, ranked
        together = confirms_together(view.settings, runner.pool, len(todo))
        self.queue: list[list[optuna.trial.FrozenTrial]] = [list(todo)] if together else [[t] for t in todo]
        self.results: list[Confirmation] = []
        self.stopped_by: str | None = None  # the budget spent before every group was confirmed

    def next(self, slot: int) -> Comparison | None:
        if not self.queue:
            return None
        group = self.queue.pop(0)
        comp = self.comparison(slot, group)
        # the search kept the confirmation's share of the budget; a resume may find it spent: what the records
        # already hold is still read, nothing new is run
        if not comp.done() and (gone := spent(self.runner)) is not None:
            self.stopped_by = f"{gone[0]}: {gone[2]}"
            self.runner.say(f"confirm: stopped, {gone[2]} ({gone[0]}={gone[1]:g}); not confirmed: "
                            + ", ".join(f"trial {t.number}" for g in (group, *self.queue) for t in g))
            self.queue.clear()
            return None
        return comp

    def comparison(self, slot: int, group: list[optuna.trial.FrozenTrial]) -> Comparison:
        s = self.view.settings
        if len(group) == 1:
            (t,) = group
            comp = self.runner.comparison(f"confirm-{resume_key(t)}", "confirm", t.params, s.confirm_replicates,
                                          slot, lead=leader(t.number), family=self.family, ranked=self.ranked)
            comp.source_trial = t.number
            return comp
        labels = {joint_arm(i): t for i, t in enumerate(group)}
        arms = {BASELINE: dict(self.view.baseline_flags),
                **{label: self.view.candidate_flags(t.params) for label, t in labels.items()}}
        order = joint_schedule(len(group), s.confirm_replicates, lead=group[0].number)
        if s.warmup_replicate:
            order = with_warmup(order)
        comp = self.runner.comparison("confirm-" + "+".join(resume_key(t) for t in group), "confirm", {}, 0, slot,
                                      arms=arms, order=order, family=self.family, ranked=self.ranked)
        comp.joint = {label: t.number for label, t in labels.items()}
        return comp

    def finished(self, comp: Comparison) -> None:
        trials = self.view.study.trials
        group = [trials[comp.source_trial]] if comp.joint is None else [trials[n] for n in comp.joint.values()]
        if comp.retry():
            self.runner.again(comp)
            self.queue.insert(0, group)
            return
        fault = comp.fault()
        records = list(comp.records.values())
        if comp.joint is None:
            self.confirmed(comp.source_trial, records, comp)
            return
        if fault is not None and fault.blame == "candidate":  # it is out; the others start again without it
            failed = fault.record.get("trial")
            self.confirmed(failed, candidate_view(records, failed), comp)
            self.runner.say(f"confirm {comp.key}: trial {failed} failed ({fault.record.get('reason')}); the others "
                            "are confirmed again without it")
            self.queue.insert(0, [t for t in group if t.number != failed])
            return
        # (a fault of the baseline or the slot, the attempts spent: all) one fit over all the runs
        s = self.view.settings
        plain, quoted = (analyse_joint(records, t, token_tolerance=s.token_tolerance, cost=s.cost_basis)
                         for t in (s.thresholds, comp.thresholds))
        for number in comp.joint.values():
            self.confirmed(number, candidate_view(records, number), comp,
                           fitted=(plain[number], quoted[number]) if number in plain else None)

    def confirmed(self, number: int, records: list[dict[str, Any]], comp: Comparison,
                  fitted: tuple[Analysis, Analysis] | None = None) -> None:
        """`fitted`: its analyses from the joint comparison's one fit, plain and quoted."""
        s = self.view.settings
        # the interval quoted is Bonferroni-adjusted for the family of confirmed candidates and the looks
        # each may take, and the label is read off that same interval
        analysis, quoted = fitted or (analyse(records, t, token_tolerance=s.token_tolerance, cost=s.cost_basis)
                                      for t in (s.thresholds, comp.thresholds))
        broken = broken_constraints(trial_summary(analysis, s), s)
        if (fault := comp.fault()) is not None:  # the replicates that are left are not the comparison planned
            broken.insert(0, f"failed in confirmation ({fault.blame}: {fault.record.get('reason')})")
        self.results.append(Confirmation(number, self.view.study.trials[number].params, analysis, adjusted=quoted,
                                         broken=broken, family=self.family, looks=len(comp.looks),
                                         stopped=comp.stopped,
                                         shared=sorted(comp.joint.values()) if comp.joint else None))

    def rest(self) -> int:  # the groups not started yet, each its whole schedule
        s = self.view.settings
        warmup = int(s.warmup_replicate)
        return sum(((len(g) + 1) if len(g) > 1 else 2) * s.confirm_replicates + warmup for g in self.queue)
