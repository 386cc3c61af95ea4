"""The goodput sweep (`study.objective=goodput`): the flags that keep a latency SLO at the lowest cost per
million output tokens, and the replicas a target rate needs.

1. Screen: the baseline, then each configuration the sampler proposes, gets its own rate search on the one
   slot (capacity/rates.py: bracket, bisection, knee runs); the sampler is told its cost per million output
   tokens at its estimated capacity (the price of the GPUs it holds over its goodput).
2. Confirm: the `confirm_top` cheapest and the baseline run their knee rates again, fresh, interleaved in time
   (at each rate step every configuration runs before the next step; the next pass backwards), so that drift
   lands on all of them alike. Fresh: on arrival schedules the screen never drew (selection on the screen's
   luck would carry into a confirmation that re-ran it), pass k's the same for every configuration. Each
   capacity interval is at alpha / (configurations confirmed), so that all
   hold together and disjoint cost intervals differ beyond doubt.
3. The answer (sweep/goodput/pick.py): the cheapest confirmed capacity, at the target rate's replicas if given.

With GPU types (`cost.prices`), the type is one more knob: every type is tried first, each configuration runs on
its type's slot (cluster/gpu_types.py), and each type's cheapest is confirmed too. Runs on different types cannot be
paired; interleaving them in time still spreads drift over all of them.

Every run is recorded as it comes. The same command again replays the records (each rate search is
deterministic given its runs) and goes on where they end. Its study (sweep/study.py): in memory, its seeded
sampler proposes the same trials again; at study.storage, the trials it holds are rebuilt from it, one an
interrupted run left open is taken over, and only the rest are proposed. A spent budget (study.timeout_s,
study.budget_usd: sweep/budget.spent_by) starts no new trial and no new confirmation run."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import optuna

from throttle_sweep.capacity.knee import Knee, fit_knee
from throttle_sweep.capacity.rates import ALWAYS_MET, FOUND, RateSearch
from throttle_sweep.capacity.report import at_rate, per_request_tokens
from throttle_sweep.capacity.runs import met_of
from throttle_sweep.engines.flags import flags_key
from throttle_sweep.errors import ConfigError
from throttle_sweep.measurement.cost import Price
from throttle_sweep.settings.capacity import CapacitySettings
from throttle_sweep.settings.goodput import GPU_TYPE, without_type
from throttle_sweep.store.records import is_ok
from throttle_sweep.sweep.study import left_running

SCREEN, CONFIRM = "goodput-screen", "goodput-confirm"
FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL, optuna.trial.TrialState.PRUNED)
BASELINE = "baseline"
# confirmation pass p draws arrival schedule CONFIRM_SCHEDULES + p: a range of its own, far beyond the replicate
# indices a screen's rate search reaches, so that the luck a configuration was selected on is not re-run
CONFIRM_SCHEDULES = 1_000_000


@dataclass
class Contender:
    label: str  # "baseline" | "trial N"
    params: dict[str, Any]
    flags: dict[str, Any]
    price: Price  # charged for its flags, at its GPU type's price
    search: RateSearch
    gpu_type: str | None = None  # (cost.prices) the type of the slot it runs on; not among its flags
    records: list[dict[str, Any]] = field(default_factory=list)  # its usable runs, screen and confirmation
    confirm_runs: list[tuple[float, int, int]] = field(default_factory=list)  # (rate, met, counted)
    failed: str | None = None

    def screen_rate(self) -> float | None:
        """The capacity the screen estimates (the knee fit's, else the bracket's middle); at an SLO kept up
        to the highest rate, that rate (a cost at most this)."""
        s = self.search
        if s.status == FOUND:
            knee = fit_knee([(r.rate, r.met, r.counted) for r in s.knee_runs], s.target)
            return knee.capacity_rps or math.sqrt(s.low * s.high)
        if s.status == ALWAYS_MET:
            return s.low
        return None

    def knee_rates(self) -> list[float]:
        plan = self.search.plan or []
        return sorted(set(plan))


# measure(contender, rate, stage, search_stage, replicate) -> a usable record, or a failed one (status != ok);
# `replicate`: the run's index at that rate, its arrival schedule
Measure = Callable[[Contender, float, str, str, int], dict[str, Any]]


class GoodputSweep:
    def __init__(self, *, settings: CapacitySettings, distributions: Mapping[str, Any], base: Mapping[str, Any],
                 baseline: Mapping[str, Any], price: Price, n_trials: int, confirm_top: int,
                 existing: list[dict[str, Any]], measure: Measure, say: Callable[[str], None],
                 study: optuna.Study, alpha: float = 0.05, spent: Callable[[], str | None] = lambda: None,
                 grid: list[dict[str, Any]] | None = None, prices: Mapping[str, float] | None = None,
                 baseline_type: str | None = None) -> None:
        self.settings, self.distributions, self.base = settings, dict(distributions), dict(base)
        self.alpha, self.spent = alpha, spent  # spent(): why a budget stops it now, or None
        self.stopped_by: str | None = None  # why a budget stopped it before its trials or its confirmation were done
        self.confirm_cut = False  # the confirmation stopped before its runs were done
        self.prices = dict(prices) if prices else None
        self.price, self.n_trials, self.confirm_top, self.say = price, n_trials, confirm_top, say
        self.measure_run = measure
        self.recorded: dict[tuple[str, str], list[dict[str, Any]]] = {}  # (stage, label) -> records, in order
        for r in existing:
            # a void run was run again; one the shutdown cut short (infrastructure) is run again now
            if r.get("stage") in (SCREEN, CONFIRM) and not r.get("void") and not r.get("infrastructure"):
                self.recorded.setdefault((r["stage"], r.get("config")), []).append(r)
        self.study = study
        if not study.trials:  # a new study; a resumed one has its queue already
            for gpu_type in self.prices or ():  # every priced type is tried first (its other knobs sampled)
                study.enqueue_trial({GPU_TYPE: gpu_type})
        self.grid = grid or []  # sampler=grid: every point, in the order settings/sweep.grid_points shuffled
        # the baseline's params: where it differs from the engine's flags the space's knobs are set on
        params = {k: v for k, v in baseline.items() if self.base.get(k) != v}
        if self.prices:
            params[GPU_TYPE] = baseline_type or next(iter(self.prices))
        self.baseline = self.contender(BASELINE, params, dict(baseline))
        self.trials: list[Contender] = []

    def contender(self, label: str, params: dict[str, Any], flags: dict[str, Any]) -> Contender:
        s = self.settings.search
        search = RateSearch(start=s.start, target=s.target, rel_tol=s.rel_tol, knee_rates=s.knee_rates,
                            knee_replicates=s.knee_replicates, knee_margin=s.knee_margin, min_rate=s.min_rate,
                            max_rate=s.max_rate)
        gpu_type = params.get(GPU_TYPE)
        price = replace(self.price, usd_per_gpu_hour=self.prices[gpu_type]) if gpu_type is not None else self.price
        return Contender(label, params, flags, price.charged(flags), search, gpu_type=gpu_type)

    # ---- 1. screen -------------------------------------------------------------------------------------
    def screen(self) -> None:
        self.search_one(self.baseline)
        if self.baseline.failed:
            raise BaselineFailed(f"the baseline failed: {self.baseline.failed}; every run so far is kept")
        seen = {flags_key({**self.baseline.flags, GPU_TYPE: self.baseline.gpu_type}): self.baseline}
        for done in self.study.get_trials(deepcopy=False, states=FINISHED):  # a resumed study: told already
            self.contender_for(done.number, done.params, seen)
        for trial in left_running(self.study):  # an interrupted run's: its own params, its runs replayed
            if not self.may_start(trial.number):
                return
            self.tell(trial, self.contender_for(trial.number, trial.params, seen))
        while len(self.study.get_trials(deepcopy=False, states=FINISHED)) < self.n_trials:
            self.enqueue_grid_point()
            if not self.may_start(self.next_number()):
                return
            trial = self.study.ask(self.distributions)
            self.tell(trial, self.contender_for(trial.number, trial.params, seen))

    def enqueue_grid_point(self) -> None:
        """sampler=grid: the next point no trial has asked, enqueued just before the ask (as the cost sweep: no
        waiting trials are left behind; the sampler fills in once every point is asked)."""
        if not self.grid or self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)):
            return
        asked = [t.params for t in self.study.get_trials(deepcopy=False)]
        point = next((p for p in self.grid if p not in asked), None)
        if point is not None:
            self.study.enqueue_trial(point)

    def next_number(self) -> int:
        """The number of the trial `ask` gives next: the first enqueued one waiting, else a new one."""
        waiting = self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
        return min((t.number for t in waiting), default=len(self.study.trials))

    def may_start(self, number: int) -> bool:
        """Whether trial `number` may start: one whose runs are recorded is read again; a new one only if no
        budget is spent (said once, then the screen stops)."""
        if (SCREEN, f"trial {number}") in self.recorded or (why := self.spent()) is None:
            return True
        self.stopped_by = why
        self.say(f"screen: stops here, {why}")
        return False

    def contender_for(self, number: int, params: dict[str, Any], seen: dict[str, Contender]) -> Contender:
        """Trial `number`'s configuration, its rate search run (replayed where recorded); one already searched
        (the same flags on the same GPU type) is that one."""
        flags = {**self.base, **without_type(params)}
        key = flags_key({**flags, GPU_TYPE: params.get(GPU_TYPE)})
        if (earlier := seen.get(key)) is not None:
            return earlier
        c = self.contender(f"trial {number}", dict(params), flags)
        self.search_one(c)
        seen[key] = c
        self.trials.append(c)
        return c

    def tell(self, trial: optuna.trial.Trial, c: Contender) -> None:
        """The study is told its cost per million output tokens at its estimated capacity, and keeps what it was."""
        rate = c.screen_rate()
        trial.set_user_attr("config", c.label)
        trial.set_user_attr("status", c.failed or c.search.status)
        trial.set_user_attr("capacity_rps", rate)
        if c.failed:
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:  # an SLO never kept costs more than at min_rate: TPE learns from that, not from a FAIL it skips
            self.study.tell(trial, self.usd_per_mtok(c, rate or c.search.min_rate))

    def usd_per_mtok(self, c: Contender, rate: float) -> float:
        return at_rate(rate, per_request_tokens(c.records) or 1.0, self.settings.slo, c.price)["usd_per_mtok"]

    def search_one(self, c: Contender) -> None:
        """Its rate search: the recorded runs replayed, then measured on until the search ends."""
        replay = list(self.recorded.get((SCREEN, c.label), []))
        while (step := c.search.next()) is not None:
            rate, stage = step
            record = replayed(replay, c, rate) if replay else self.measure_run(c, rate, SCREEN, stage,
                                                                               c.search.replicate_of(rate))
            if not is_ok(record):
                c.failed = str(record.get("reason"))
                self.say(f"  {c.label} failed at {rate:g} req/s: {c.failed}; it is out")
                return
            c.records.append(record)
            c.search.tell(rate, *met_of(record, self.settings), stage)

    # ---- 2. confirm ------------------------------------------------------------------------------------
    def confirmed(self) -> list[Contender]:
        """The `confirm_top` cheapest of the screen, and the baseline (if it found a knee); with GPU types, also
        each type's cheapest, so that every type's answer has an interval."""
        found = [c for c in self.trials if not c.failed and c.search.status == FOUND and c.screen_rate()]
        ranked = sorted(found, key=lambda c: self.usd_per_mtok(c, c.screen_rate()))
        best = ranked[: self.confirm_top]
        for gpu_type in self.prices or ():
            if not any(c.gpu_type == gpu_type for c in best):
                best += [c for c in ranked if c.gpu_type == gpu_type][:1]
        return ([self.baseline] if self.baseline.search.status == FOUND else []) + best

    def confirm(self, family: list[Contender]) -> None:
        """Fresh runs at each one's knee rates, interleaved: every configuration at its i-th rate before any at
        the next; the next pass runs the rates and the configurations backwards."""
        if not family:
            return
        rates = {c.label: self.confirm_rates(c, family) for c in family}
        replicates = self.settings.search.knee_replicates
        order = []
        for p in range(replicates):
            members = family if p % 2 == 0 else family[::-1]
            steps = range(max(len(r) for r in rates.values()))
            for i in (steps if p % 2 == 0 else reversed(steps)):
                # pass p draws one fresh schedule for every configuration: common random numbers
                order += [(c, rates[c.label][i], CONFIRM_SCHEDULES + p) for c in members if i < len(rates[c.label])]
        replay = {c.label: list(self.recorded.get((CONFIRM, c.label), [])) for c in family}
        for c, rate, schedule in order:
            if c.failed:
                continue
            if not replay[c.label] and (why := self.spent()) is not None:
                self.stopped_by, self.confirm_cut = why, True
                self.say(f"confirmation: stops here, {why}")
                return
            record = replayed(replay[c.label], c, rate, self.settings.at(rate, schedule)["arrival_seed"]) \
                if replay[c.label] else self.measure_run(c, rate, CONFIRM, "confirm", schedule)
            if not is_ok(record):
                c.failed = f"failed in confirmation: {record.get('reason')}"
                self.say(f"  {c.label} {c.failed}; it is out")
                continue
            c.records.append(record)
            c.confirm_runs.append((rate, *met_of(record, self.settings)))

    def confirm_rates(self, c: Contender, family: list[Contender]) -> list[float]:
        """Its knee rates; the baseline's also the lowest of the others' lowest knee rates above its own. A
        baseline whose knee rates all kept the SLO (its screen placed them low) has no upper bound, and no
        saving against it could be claimed; a rate above its own is read first by the fixed-order test from
        the top, and where the candidates can go it fails beyond doubt (simulated, a 3x capacity: the claim
        made in 0.81 of runs against 0.61). One such rate bounds it; higher ones (another GPU type's, say,
        at many times its capacity) would only queue for minutes."""
        own = c.knee_rates()
        if c is not self.baseline or not own:
            return own
        above = sorted(r for o in family if o is not c and o.knee_rates() for r in [min(o.knee_rates())]
                       if r > own[-1])
        return own + above[:1]

    def knee_of(self, c: Contender, family: int, one_sided: bool = False) -> Knee:
        """Its confirmed capacity, each side at alpha / (2 x family) (alpha: compare.alpha); `one_sided`: at
        alpha / family a side, for the claim against the baseline, which reads one side of each
        (pick.cheaper_beyond_doubt)."""
        alpha = self.alpha / max(1, family)
        return fit_knee(c.confirm_runs, self.settings.slo.attainment, alpha=2 * alpha if one_sided else alpha)


def replayed(replay: list[dict[str, Any]], c: Contender, rate: float, arrival_seed: int | None = None
             ) -> dict[str, Any]:
    """The next recorded run of this configuration, which must be the run asked for now (on `arrival_seed`'s
    schedule, where given)."""
    record = replay.pop(0)
    if abs(record["workload"]["rate"] - rate) > 1e-9 * rate or record.get("params", {}) != c.params or (
            arrival_seed is not None and record["workload"].get("arrival_seed") != arrival_seed):
        raise ConfigError(f"the records in this run's folder follow another sweep ({c.label} ran at "
                          f"{record['workload']['rate']:g} req/s with {record.get('params')}, where this one asks "
                          f"for {rate:g} with {c.params}): choose another study.name")
    return record


class BaselineFailed(Exception):
    """The baseline could not be measured: no configuration can be judged against it."""


def best_attainment(c: Contender) -> tuple[float, float] | None:
    """(attainment, rate) of its best run: what an SLO it never met came to."""
    best = c.search.best()
    return (best.attainment, best.rate) if best is not None else None
