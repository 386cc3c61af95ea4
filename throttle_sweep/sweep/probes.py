"""The probe stage: the baseline once (it must work before anything else is spent; the plan is said after
it), then single runs along the boundary knob for each setting of the other knobs, to find where preemption
starts (with closed-loop fixed work a configuration's preemption count is deterministic, so one run per point
tells). What it finds (`Findings`) steers the rest: preempting points are told to the study as infeasible
trials, the boundary's last clean point may become the search's yardstick, and proposals beyond the boundary
are closed unrun.

The first engine-minutes go to what decides the plan. Along max_num_seqs the baseline's KV capacity predicts
the boundary (kv_capacity.py): the search starts either side of it, never at the slow low end, and a range whose
every value fits is not probed. A probe runs a few waves of its own batch, not the whole work (a run of
max_num_seqs=1 through it would take as long as max_num_seqs replicates). The budgets bind the probes too."""

from __future__ import annotations

import itertools
import math
from typing import Any

import optuna

from throttle_sweep.engines.flags import flags_key
from throttle_sweep.measurement import calibration
from throttle_sweep.stats.schedule import BASELINE, CANDIDATE
from throttle_sweep.store.records import is_ok
from throttle_sweep.sweep.boundary import Boundary, BoundarySearch, knob_values
from throttle_sweep.sweep.budget import say_plan, spent
from throttle_sweep.sweep.kv_capacity import KV_NEUTRAL, PROBE_WAVES, capacity, in_flight, probe_work
from throttle_sweep.sweep.refusals import probe_distribution
from throttle_sweep.sweep.runner import BaselineFails, Comparison, Runner, SweepStopped
from throttle_sweep.sweep.state import StudyView
from throttle_sweep.sweep.trials import probed_attrs, told_reference, where

# a pending probe: (the search it serves, or None for the baseline; the value's index; which repeat)
Pending = tuple[BoundarySearch | None, int, int]


class Probes:
    """The probe stage's comparisons (runner.Stage): every search one round at a time, one probe per slot.
    The first setting of the other knobs is searched once the baseline's run is in (from its predicted
    boundary, or the ends); the others start where its boundary lies."""

    def __init__(self, runner: Runner, view: StudyView, knob: str, settings: list[dict[str, Any]]) -> None:
        self.runner, self.view, self.knob, self.settings = runner, view, knob, settings
        self.slots = len(runner.pool.slots)
        self.work: dict[str, Any] = dict(runner.workload_key.get("workload") or {})
        self.searches: list[BoundarySearch] = []  # the first once the baseline's run is in
        self.pending: list[Pending] = [(None, 0, 1)]  # the baseline first
        self.capacity: int | None = None  # the most full-length requests the baseline's KV cache holds
        self.roomy = False  # it holds twice what any value runs at once: other token budgets are not probed
        calibrated = next((r for r in runner.records if r.get("stage") == calibration.STAGE and is_ok(r)
                           and r.get("flags") == view.baseline_flags and r.get("workload") == self.work), None)
        if calibrated is not None:  # the work sized by time came out as configured: that run is the baseline's
            self.pending = []
            self.baseline_in(calibrated, basis="the calibration run's time")

    def first(self) -> BoundarySearch:
        """The first setting's search: from the values either side of the boundary the baseline's KV capacity
        predicts (none to probe where every value fits), else from both ends."""
        others = self.settings[0]
        dist = probe_distribution(self.view, self.knob, others)
        search = BoundarySearch.over(self.knob, dist, others, max_preemptions=self.view.settings.max_preemptions,
                                     parallel=self.slots)
        flags, baseline = self.view.candidate_flags(others), self.view.baseline_flags

        def differ(keys: set[str]) -> bool:
            return any(flags.get(k) != baseline.get(k) for k in keys)

        keys = (set(flags) | set(baseline)) - {self.knob}
        if self.knob != "max_num_seqs" or self.capacity is None or differ(keys - KV_NEUTRAL):
            return search
        values = search.boundary.values
        holds = (f"probes: the KV cache the baseline's engine reported holds {self.capacity} requests of this "
                 f"work at full length")
        most = min(values[-1], in_flight(self.work))
        self.roomy = self.capacity >= 2 * most  # no token budget's activation memory takes half of the cache
        if self.capacity >= most:
            fits = f"{holds}, {'twice ' if self.roomy else ''}as many as any {self.knob} in the range runs at once"
            if differ(keys) and not self.roomy:  # another token budget may move the memory profile: confirm it
                self.runner.say(f"{fits}: one probe at {self.knob}={values[-1]} confirms it")
                return BoundarySearch.over(self.knob, dist, others, parallel=self.slots, near=(values[-1],),
                                           max_preemptions=self.view.settings.max_preemptions, direction="up",
                                           recheck=False)
            search.boundary.proven, search.boundary.expected = True, "up"
            self.runner.say(f"{fits}: none can preempt, and none is probed")
            return search
        near = tuple(v for v in (max((v for v in values if v <= self.capacity), default=None),
                                 min((v for v in values if v > self.capacity), default=None)) if v is not None)
        short = probe_work(self.knob, near[-1], self.work, self.view.settings.max_preemptions)
        self.runner.say(f"{holds}: the boundary is probed from {self.knob}=" + " and ".join(map(str, near))
                        + (f", each probe {PROBE_WAVES} waves of its own batch" if short else ""))
        return BoundarySearch.over(self.knob, dist, others, max_preemptions=self.view.settings.max_preemptions,
                                   parallel=self.slots, near=near, direction="up", recheck=True, gallop=True)

    def baseline_in(self, record: dict[str, Any], *, basis: str) -> None:
        """The baseline's run of this work is in: what its KV capacity predicts, and the plan."""
        self.view.findings.baseline_probe = record
        self.capacity = capacity(record, self.work)
        self.searches.append(self.first())
        say_plan(self.runner, basis=f"{basis} (every run taken to be as long, until probes say more)")

    def follow(self, leader: Boundary) -> list[BoundarySearch]:
        clean, dirty = leader.edge()
        near = (leader.values[clean], leader.values[dirty]) if leader.settled and leader.exact() else None
        searches, clean_throughout = [], leader.settled and dirty is None and leader.direction == "up"
        for others in self.settings[1:]:
            dist = probe_distribution(self.view, self.knob, others)
            top = (knob_values(dist)[-1],)  # clean throughout: the top of its own range, once, confirms it
            search = BoundarySearch.over(self.knob, dist, others, max_preemptions=self.view.settings.max_preemptions,
                                         parallel=max(1, self.slots // (len(self.settings) - 1)),
                                         near=top if clean_throughout else near, direction=leader.direction,
                                         noisy=leader.noisy)
            search.boundary.proven = leader.proven and self.roomy  # (twice what any value runs at once)
            searches.append(search)
        return searches

    def next(self, slot: int) -> Comparison | None:
        if (gone := spent(self.runner)) is not None:
            key, value, why = gone
            raise SweepStopped(f"{key}={value:g} was spent during the probes ({why}); every record is kept: raise "
                               f"{key} and run the same command again to go on")
        if not self.pending:  # the next round of every search that can go on: one probe per slot
            if len(self.searches) == 1 < len(self.settings) and self.searches[0].done():
                self.searches.extend(self.follow(self.searches[0].boundary))
            for s in self.searches:
                self.pending.extend((s, *w) for w in s.wanted(self.slots))
        if not self.pending:
            return None
        item = self.pending.pop(0)
        search, index, repeat = item
        work = None
        if search is None:
            arms, order, key = {BASELINE: dict(self.view.baseline_flags)}, [BASELINE], "probe baseline"
        else:
            params = {**search.boundary.others, self.knob: search.boundary.values[index]}
            arms, order = {CANDIDATE: self.view.candidate_flags(params)}, [CANDIDATE]
            key = f"probe {' '.join(f'{k}={v}' for k, v in sorted(params.items()))} #{repeat}"
            work = probe_work(self.knob, params[self.knob], self.work, self.view.settings.max_preemptions)
        comp = self.runner.comparison(key, "probe", {}, 1, slot, arms=arms, order=order, workload=work)
        comp.probe = item
        return comp

    def finished(self, comp: Comparison) -> None:
        search, index, repeat = comp.probe
        if comp.retry():
            self.runner.again(comp)
            self.pending.insert(0, comp.probe)
            return
        record = comp.records[0]
        ok = is_ok(record)
        found = self.view.findings
        if search is None:
            if not ok:
                raise BaselineFails(f"the baseline {self.view.baseline_flags} failed ({record.get('reason')}); a "
                                    "comparison against it cannot mean anything: fix what makes it fail and run again")
            self.baseline_in(record, basis="the baseline's run time")
            return
        count = record.get("preemptions") if ok else None
        search.add(index, repeat, count)
        point = (flags_key(search.boundary.others), index)
        found.probe_records.setdefault(point, record)
        found.probe_runs.setdefault(point, []).append(record)
        self.runner.say(f"{comp.key}: " + (f"{count} preemptions" if ok else f"failed ({record.get('reason')})"))

    def rest(self) -> int:
        return self.runner.runs_ahead()


def find_boundaries(runner: Runner, view: StudyView) -> None:
    """Probe the baseline, then the boundary along the boundary knob for each setting of the other knobs, all
    searches sharing the slots; record them in the study, choose the yardstick, tell the preempting points."""
    s = view.settings
    knob = s.boundary_knob
    if knob is None or knob not in view.distributions:
        return
    settings = other_settings(view)
    if settings is None:
        runner.say(f"probes: the knobs other than {knob} have more than {s.boundary_settings_max} "
                   "settings (or a continuous one); feasibility is judged from each trial's replicates")
        return
    settings = [o for o in settings if probe_distribution(view, knob, o) is not None]  # (all refused: none)
    if not settings:
        return
    runner.say(f"probes: where preemption starts along {knob} "
               f"({len(knob_values(view.distributions[knob]))} values"
               + (f", for each of {len(settings)} settings of the other knobs; the others start from the "
                  "first one's boundary where it is exact" if len(settings) > 1 else "")
               + "), predicted from the KV capacity the baseline's run reports and probed near the prediction")
    stage = Probes(runner, view, knob, settings)
    runner.run(stage)
    summaries = []
    for i, search in enumerate(stage.searches):
        view.findings.boundaries[flags_key(search.boundary.others)] = search.boundary
        summaries.append({**search.boundary.summary(), "predicted_last_clean": predicted(
            view, search.boundary, stage.work, stage.capacity if i == 0 else None)})
    view.study.set_user_attr("boundaries", summaries)
    choose_reference(runner, view)
    tell_probes(view)


def other_settings(view: StudyView) -> list[dict[str, Any]] | None:
    """Every setting of the knobs other than the boundary knob, or None if they have too many (or a
    continuous one)."""
    knob = view.settings.boundary_knob
    values: dict[str, list[Any]] = {}
    for flag, dist in view.distributions.items():
        if flag == knob:
            continue
        if isinstance(dist, optuna.distributions.FloatDistribution) and not dist.step:
            return None
        values[flag] = list(dist.choices) if isinstance(dist, optuna.distributions.CategoricalDistribution) \
            else knob_values(dist)
    if math.prod(len(v) for v in values.values()) > view.settings.boundary_settings_max:
        return None
    return [dict(zip(values, combo, strict=True)) for combo in itertools.product(*values.values())]


def predicted(view: StudyView, boundary: Boundary, work: dict[str, Any], baseline: int | None) -> int | None:
    """The last clean max_num_seqs the engine's reported KV capacity predicts for this fixed work: from the
    setting's own first probe, else what the baseline's predicted (`baseline`)."""
    if boundary.knob != "max_num_seqs":
        return None
    first = sorted(boundary.counts)[:1]
    record = view.findings.probe_records.get((flags_key(boundary.others), first[0])) if first else None
    return capacity(record, work) if record is not None else baseline


def choose_reference(runner: Runner, view: StudyView) -> None:
    """What the search compares candidates against (`study.reference=auto`): the first boundary's last clean
    point, probed clean twice, instead of the baseline. The baseline is usually the slow end of the space
    and half of every comparison; a yardstick among the fast points halves what a screen costs. Every search
    ratio is then to the reference (one scale for the sampler; the reference's own trial is 1 exactly), and
    confirmation alone meets the baseline, with fresh replicates. Kept for the life of a study, so a resume
    never mixes two yardsticks. Not with latency limits or two objectives (a probe is one run: it cannot
    vouch for the reference's tail)."""
    found, s = view.findings, view.settings
    if found.reference is not None or told_reference(view.study) is not None:
        return  # (a resume: the driver took the study's own)
    if s.reference != "auto" or s.multi_objective or any(v is not None for v in s.latency_limits.values()):
        return
    if view.told_by_probes():
        return  # a study whose trials were told against the baseline keeps it
    boundary = next(iter(found.boundaries.values()), None)
    clean = boundary.edge()[0] if boundary is not None and boundary.settled else None
    if clean is None or not boundary.exact():
        return
    point = {**boundary.others, boundary.knob: boundary.values[clean]}
    runs = [r for r in found.probe_runs.get((flags_key(boundary.others), clean), []) if is_ok(r)]
    costs = [c for c in map(view.probe_cost, runs) if c]
    flags = view.candidate_flags(point)
    if len(costs) < 2 or flags == view.baseline_flags or view.schedules.same(flags, view.baseline_flags):
        return
    attrs = {"source": "reference", "status": "ok", "verdict": "-", "ratio": 1.0, "ci": [1.0, 1.0],
             "se_log": 0.0, "df": None, **probed_attrs(runs, costs, s),
             "notes": [f"the search's reference: every search ratio is to it ({len(runs)} clean probes)"]}
    view.study.add_trial(optuna.trial.create_trial(
        params=point, distributions={k: view.distributions[k] for k in point}, value=1.0, user_attrs=attrs,
        constraints=dict(zip(attrs["constraint_names"], attrs["constraints"], strict=True))))
    found.reference = point
    base = [w for w in [(found.baseline_probe or {}).get("wall_s")] if w]
    speed = (f" (a probe of it took {sum(r.get('wall_s') or 0 for r in runs) / len(runs):.1f} s, the baseline's "
             f"{base[0]:.1f} s)") if base else ""
    runner.say(f"search: candidates are compared against the reference {point}, the boundary's last clean "
               f"point{speed}; confirmation measures the best against the baseline")


def tell_probes(view: StudyView) -> None:
    """Probed preempting points become completed, infeasible trials (once): what the samplers learn the
    infeasible region from. Their ratio is one probe's cost over the yardstick's probes, not a comparison."""
    base = view.yardstick_cost()
    told = {t.user_attrs.get("probe_key") for t in view.trials()}
    for others, boundary in view.findings.boundaries.items():
        if not boundary.settled:
            continue
        for index in sorted(boundary.counts):
            record = view.findings.probe_records[(others, index)]
            count = boundary.counts[index][0]
            cost = view.probe_cost(record)
            key = f"{others}|{index}"
            if not boundary.dirty(index) or key in told or count is None or not base or not cost:
                continue
            params = {**boundary.others, boundary.knob: boundary.values[index]}
            attrs = {"source": "probe", "probe_key": key, "status": "ok", "preemptions": count,
                     "ratio": cost / base, "usd_per_mtok": cost, "record_ids": [record.get("record_id")],
                     "ran_on": [where(record)], "constraints": [float(count - view.settings.max_preemptions)],
                     "constraint_names": ["preemptions"],
                     "notes": [f"one probe run, not a comparison; its ratio is to {view.yardstick()}'s probe"]}
            e2e = ((record.get("latency_s") or {}).get("e2e") or {}).get("p95") or 0.0
            values = [cost / base, e2e] if view.settings.multi_objective else [cost / base]
            view.study.add_trial(optuna.trial.create_trial(
                params=params, distributions={k: view.distributions[k] for k in params}, values=values,
                user_attrs=attrs, constraints={"preemptions": attrs["constraints"][0]}))


def close_beyond_boundary(view: StudyView, trial: optuna.trial.Trial) -> None:
    """A proposal the probes already show preempting: told infeasible at once, not run. Its value is the
    nearest probe's, so the sampler learns where the infeasible region is."""
    knob = view.settings.boundary_knob
    others = view.others_key(trial.params)
    boundary = view.findings.boundaries[others]
    index = boundary.values.index(trial.params[knob])
    nearest = min((i for i in boundary.probed if boundary.dirty(i)), key=lambda i: abs(i - index))
    base = view.yardstick_cost()
    cost = view.probe_cost(view.findings.probe_records[(others, nearest)])
    count = boundary.counts[nearest][0]  # None: that probe's engine failed
    violation = float(count - view.settings.max_preemptions) if count is not None else 1.0
    what = "preempted" if count is not None else "failed"
    ratio = cost / base if cost and base else 1.0
    for key, value in {"source": "boundary", "status": "ok", "preemptions": count, "ratio": ratio,
                       "reason": f"beyond the probed boundary ({knob}={boundary.values[nearest]} {what}): not run",
                       "constraints": [violation], "constraint_names": ["preemptions"]}.items():
        trial.set_user_attr(key, value)
    trial.set_constraint("preemptions", violation)
    view.study.tell(trial, [ratio, 0.0] if view.settings.multi_objective else ratio)
