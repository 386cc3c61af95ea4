"""What the sweep knows so far, read from the study and the probes' findings: which flags are answered, the
ranking, what the boundary says of a point, which configurations share an engine schedule, and what search
ratios are to. It tells the study nothing; the stages do (probes.py, screen.py, confirm.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import TrialState

from throttle_sweep.engines.flags import flags_key
from throttle_sweep.stats.analysis import judged_cost
from throttle_sweep.stats.schedule import BASELINE, CANDIDATE
from throttle_sweep.stats.verdict import Prior, pooled_prior
from throttle_sweep.sweep.boundary import Boundary
from throttle_sweep.sweep.options import SweepSettings
from throttle_sweep.sweep.schedules import ScheduleIndex, differs_in_scheduling_only
from throttle_sweep.sweep.trials import NOT_COMPARED, cost, feasible, measured, told_reference


@dataclass
class Findings:
    """What the probes found (probes.py): read by every later stage."""

    boundaries: dict[str, Boundary] = field(default_factory=dict)  # flags_key(other knobs) -> the boundary
    probe_records: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)  # (others, index) -> first
    probe_runs: dict[tuple[str, int], list[dict[str, Any]]] = field(default_factory=dict)  # every probe, in order
    baseline_probe: dict[str, Any] | None = None
    reference: dict[str, Any] | None = None  # the search's yardstick point; None: the baseline
    refused: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # flags_key(others) -> refused stretches


class StudyView:
    def __init__(self, *, study: optuna.Study, distributions: Mapping[str, Any], settings: SweepSettings,
                 base_flags: Mapping[str, Any], baseline_flags: Mapping[str, Any], schedules: ScheduleIndex,
                 refusal: Callable[[Mapping[str, Any]], str | None] | None = None) -> None:
        self.study, self.distributions, self.settings = study, dict(distributions), settings
        # flags -> the engine's reason for refusing them at start, or None (sweep/refusals.py)
        self.refusal = refusal or (lambda flags: None)
        self.base_flags, self.baseline_flags = dict(base_flags), dict(baseline_flags)
        self.schedules = schedules  # flags -> the engine schedules their runs recorded
        self.findings = Findings()
        self.open: dict[int, optuna.trial.Trial] = {}  # trials asked or taken over, not yet told

    def trials(self, *states: TrialState) -> list[optuna.trial.FrozenTrial]:
        return self.study.get_trials(deepcopy=False, states=states or None)

    def candidate_flags(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return {**self.base_flags, **params}

    # ---- answers and ranking ----------------------------------------------------------------------------
    def noise_prior(self) -> Prior | None:
        """The search comparisons' noise so far, pooled (stats.pooled_prior): what a later search comparison is
        judged with (study.pooled_noise). None until enough are in."""
        if not self.settings.pooled_noise:
            return None
        return pooled_prior([(t.user_attrs.get("resid_var"), t.user_attrs.get("resid_df") or 0)
                             for t in self.trials(TrialState.COMPLETE) if measured(t)])

    def measured_trials(self) -> int:
        """Finished trials that measured something: repeats, merged schedules and interrupted ones don't count."""
        return sum(1 for t in self.trials() if measured(t))

    def answers(self) -> dict[str, int]:
        """Flags already answered -> the trial that answers them: one in flight now, one that completed, one
        whose candidate failed, or one whose attempts were all spent on faults that could be the flags' or the
        slot's (a hang, a memory kill). One lost slot, or a failed baseline, answers nothing: measure again."""
        found = {flags_key(t.params): n for n, t in self.open.items()}
        for t in self.trials(TrialState.COMPLETE, TrialState.FAIL):
            a = t.user_attrs
            if "duplicate_of" not in a and (t.state == TrialState.COMPLETE or a.get("blame") == "candidate"
                                            or a.get("attempts_exhausted")):
                found.setdefault(flags_key(t.params), t.number)
        return found

    def best(self) -> optuna.trial.FrozenTrial | None:
        ranked = self.ranked(1)
        return ranked[0] if ranked else None

    def points(self) -> list[optuna.trial.FrozenTrial]:
        """Every distinct feasible point, cheapest first: what an estimated best was selected from."""
        return self.ranked(len(self.study.trials))

    def ranked(self, k: int) -> list[optuna.trial.FrozenTrial]:
        """The k feasible trials with the lowest ratio (distinct configurations: distinct flags, and not the
        same schedule as one ranked higher), never an infeasible or failed one, nor one told another's answer."""
        ranked: list[optuna.trial.FrozenTrial] = []
        for t in sorted((t for t in self.trials()
                         if feasible(t) and t.user_attrs.get("source") not in ("schedule", "baseline")), key=cost):
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
        points = self.points()
        front = [t for t in points if not any(o.values[0] <= t.values[0] and o.values[1] <= t.values[1]
                                              and o.values != t.values for o in points)]
        return sorted(front, key=cost)

    # ---- one configuration, one schedule (sweep/schedules.py) ------------------------------------------
    def schedule_twin(self, params: Mapping[str, Any]) -> optuna.trial.FrozenTrial | str | None:
        """What these flags are known to be the same configuration as: 'baseline', a completed trial measured
        by its own comparison, or None."""
        if self.is_baseline(params):
            return BASELINE
        flags = self.candidate_flags(params)
        if self.schedules.fingerprint(flags) is None:
            return None
        if self.findings.baseline_probe is not None and self.schedules.same(flags, self.baseline_flags):
            return BASELINE  # (its answer is the baseline probe's: without one, it is compared)
        return next((t for t in self.trials(TrialState.COMPLETE)
                     if measured(t) and self.schedules.same(flags, self.candidate_flags(t.params))), None)

    def is_baseline(self, params: Mapping[str, Any]) -> bool:
        """Are these flags the baseline's own configuration: its flags, with those it left to vLLM as its run
        resolved them (served_defaults; known once the baseline probe ran)?"""
        probe = self.findings.baseline_probe
        if probe is None:
            return False
        served = probe.get("served_defaults") or {}
        resolved = {**self.baseline_flags, **served}
        # what the candidate leaves to vLLM, vLLM resolves as it did for the baseline (the same GPU and model)
        return flags_key({**served, **self.candidate_flags(params)}) == flags_key(resolved)

    def may_share_schedule(self, a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
        """Could two configurations run one schedule: scheduling knobs apart the same flags, and the same
        max_num_seqs and boundary knob (values of those nearly always schedule differently)?"""
        knobs = {self.settings.boundary_knob, "max_num_seqs"} - {None}
        return differs_in_scheduling_only(a, b) and all(a.get(k) == b.get(k) for k in knobs)

    def twin(self, flags: Mapping[str, Any], other: Mapping[str, Any]) -> bool:
        """One configuration: by recorded schedules where both have one, else by what may share one."""
        if self.schedules.fingerprint(flags) is not None and self.schedules.fingerprint(other) is not None:
            return self.schedules.same(flags, other)
        return self.may_share_schedule(flags, other)

    # ---- what the boundary says -------------------------------------------------------------------------
    def others_key(self, params: Mapping[str, Any]) -> str:
        """The key of a point's boundary: the settings of every knob but the boundary knob."""
        return flags_key({k: v for k, v in params.items() if k != self.settings.boundary_knob})

    def known_feasible(self, params: Mapping[str, Any]) -> bool | None:
        """What the probes say about these flags: True, False, or None (not probed, or not trustworthy)."""
        knob = self.settings.boundary_knob
        if knob not in params:
            return None
        boundary = self.findings.boundaries.get(self.others_key(params))
        return boundary.feasible(params[knob]) if boundary else None

    def edge_distance(self, params: Mapping[str, Any]) -> float:
        """How far below (on the clean side of) its boundary a point lies, in steps of the knob."""
        knob = self.settings.boundary_knob
        boundary = self.findings.boundaries.get(self.others_key(params))
        clean, _ = boundary.edge() if boundary else (None, None)
        if clean is None or params.get(knob) not in boundary.values:
            return float("inf")
        return abs(boundary.values.index(params[knob]) - clean)

    def nearest_unanswered(self) -> dict[str, Any] | None:
        """The clean point nearest a boundary (probed or between clean probes) that is a new configuration: not
        answered, not compared before (a comparison without a verdict would only be run again), and no twin of
        what is known. Or None."""
        answers = self.answers()
        trials = self.trials()
        # compared without a verdict (no one to blame: the runs disagreed): another comparison would only repeat
        # it. A failed baseline or a lost slot answers nothing, so those points stay on offer
        withheld = {flags_key(t.params) for t in trials
                    if t.state == TrialState.FAIL and measured(t) and t.user_attrs.get("blame") is None}
        tried = withheld | set(answers)
        by_number = {t.number: t for t in trials}
        known = [self.candidate_flags(by_number[n].params) for n in answers.values() if n in by_number]
        known.append(self.baseline_flags)
        points = []
        for boundary in self.findings.boundaries.values():
            if not boundary.settled or boundary.edge()[0] is None:
                continue
            for value in boundary.values:
                point = {**boundary.others, boundary.knob: value}
                flags = self.candidate_flags(point)
                if self.known_feasible(point) is True and flags_key(point) not in tried and not any(
                        self.twin(flags, other) for other in known):
                    points.append(point)
        return min(points, key=self.edge_distance, default=None)

    # ---- the yardstick: what search ratios are to -------------------------------------------------------
    def told_by_probes(self) -> bool:
        """Has a trial been measured or told from probes against the yardstick the study has now?"""
        return any(measured(t) or t.user_attrs.get("source") in NOT_COMPARED for t in self.trials())

    def yardstick(self) -> str:
        """What search ratios are to, in words."""
        reference = self.findings.reference
        if reference is None:
            return "the baseline"
        return "the reference " + " ".join(f"{k}={v}" for k, v in sorted(reference.items()))

    def probe_cost(self, record: Mapping[str, Any] | None) -> float | None:
        try:
            return judged_cost(record, self.settings.cost_basis)
        except (KeyError, TypeError, ValueError):
            return None

    def yardstick_cost(self) -> float | None:
        """What a probe's cost is divided by: the reference's probes (geometric mean), or the baseline probe."""
        if self.findings.reference is not None:
            ref = told_reference(self.study)
            return ref.user_attrs.get("usd_per_mtok") if ref is not None else None
        probe = self.findings.baseline_probe
        return self.probe_cost(probe) if probe else None

    def search_arms(self, params: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """A search comparison's two arms: the yardstick (in the baseline's place) and the candidate."""
        reference = self.findings.reference
        yardstick = self.candidate_flags(reference) if reference is not None else self.baseline_flags
        return {BASELINE: dict(yardstick), CANDIDATE: self.candidate_flags(params)}
