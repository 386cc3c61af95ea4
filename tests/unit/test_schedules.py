"""Same schedule, same configuration: a replicate records its engine's step-by-step schedule, and a sweep
measures flags that differ only in scheduling knobs once when their schedules are the same."""

from __future__ import annotations

from collections import Counter

import optuna
from rich.console import Console

from tests.helpers import PoolBasics, compose_cfg
from throttle_sweep.commands import sweep as sweep_cmd
from throttle_sweep.engines import FakeEngine, FakeKnobs
from throttle_sweep.measurement.cost import Price
from throttle_sweep.measurement.replicate import measure_replicate
from throttle_sweep.measurement.workload import WorkloadSpec
from throttle_sweep.store.records import read_records
from throttle_sweep.sweep.schedules import ScheduleIndex, differs_in_scheduling_only

KV = 48 * 16 * 1024
FLAGS = {"kv_cache_memory_bytes": KV, "block_size": 16, "max_model_len": 1024}
SPEC = WorkloadSpec(num_requests=32, prompt_len=16, output_len=48, concurrency=32, warmup_requests=0)


def schedule(noise: float = 0.0, seed: int = 0, **flags) -> dict:
    record = measure_replicate(FakeEngine(FakeKnobs(noise_sd=noise, seed=seed)), {**FLAGS, **flags}, SPEC, Price(),
                               run_id="t", arm="candidate", position=seed, environment={})
    assert record["status"] == "ok"
    return record


def test_the_fingerprint_follows_the_schedule_not_the_speed():
    # 32 requests of 16 prompt tokens need at most 512 tokens in a step: a budget of 2048 or 8192 never binds
    loose, looser = schedule(max_num_seqs=12, max_num_batched_tokens=2048), schedule(max_num_seqs=12,
                                                                                    max_num_batched_tokens=8192)
    assert loose["engine_schedule"] == looser["engine_schedule"] and loose["engine_schedule"]["steps"] > 48
    # a budget of 64 tokens chunks the first prefills over several steps: another schedule
    tight = schedule(max_num_seqs=12, max_num_batched_tokens=64)
    assert tight["engine_schedule"]["fingerprint"] != loose["engine_schedule"]["fingerprint"]
    assert schedule(max_num_seqs=11)["engine_schedule"] != schedule(max_num_seqs=12)["engine_schedule"]
    # noise moves the time of every step and the cost, never the schedule
    noisy = schedule(noise=0.05, seed=3, max_num_seqs=12, max_num_batched_tokens=2048)
    assert noisy["steady"]["usd_per_mtok"] != loose["steady"]["usd_per_mtok"]
    assert noisy["engine_schedule"] == loose["engine_schedule"]


def test_only_scheduling_knobs_are_merged_and_only_on_a_schedule_every_run_agrees_on():
    a = {**FLAGS, "max_num_seqs": 8, "max_num_batched_tokens": 2048}
    b = {**FLAGS, "max_num_seqs": 8, "max_num_batched_tokens": 4096}
    runs = [{"status": "ok", "flags": f, "engine_schedule": {"fingerprint": "x"}} for f in (a, b, b)]
    assert differs_in_scheduling_only(a, b) and ScheduleIndex(runs).same(a, b)
    # prefix caching (like CUDA graphs or a dtype) changes what a step costs, not which requests it runs
    c = {**b, "enable_prefix_caching": True}
    assert not differs_in_scheduling_only(a, c)
    assert not ScheduleIndex([*runs, {"status": "ok", "flags": c, "engine_schedule": {"fingerprint": "x"}}]).same(a, c)
    # runs of one configuration that disagree: its schedule is not deterministic here, so nothing is merged
    disagree = ScheduleIndex([*runs, {"status": "ok", "flags": b, "engine_schedule": {"fingerprint": "y"}}])
    assert disagree.fingerprint(b) is None and not disagree.same(a, b)
    # failed runs, warm-up runs and runs with no schedule (an HTTP engine) say nothing
    assert ScheduleIndex([{"status": "failed", "flags": a, "engine_schedule": {"fingerprint": "x"}}]).fingerprint(a) is None
    http = ScheduleIndex([{"status": "ok", "flags": a}])
    assert http.fingerprint(a) is None and not http
    warm = ScheduleIndex([*runs, {"status": "ok", "flags": a, "warmup": True, "engine_schedule": {"fingerprint": "z"}}])
    assert warm.fingerprint(a) == ScheduleIndex(runs).fingerprint(a) is not None
    # records that arrive later count too
    later = ScheduleIndex()
    later.add({"status": "ok", "flags": a, "engine_schedule": {"fingerprint": "x"}})
    assert later.fingerprint(a) == ScheduleIndex(runs).fingerprint(a) and later.fingerprint(b) is None


WORK = ["workload.num_requests=32", "workload.prompt_len=16", "workload.output_len=48", "workload.concurrency=32",
        "workload.warmup_requests=0", f"engine.kv_cache_memory_bytes={KV}", "engine.block_size=16"]


def two_knob_sweep(tmp_path, tokens: str, name: str, *overrides: str):
    cfg = compose_cfg("backend=fake", *WORK, "+space=batching", "space.max_num_seqs.low=1",
                      "space.max_num_seqs.high=32", "space.max_num_seqs.log=false",
                      f"space.max_num_batched_tokens.choices={tokens}", "study.sampler=grid", "study.n_trials=4",
                      "compare.replicates=2", "study.confirm_replicates=2", "study.confirm_top=2",
                      "fake.noise_sd=0.01", f"study.name={name}", *overrides, tmp_path=tmp_path)
    assert sweep_cmd.run(cfg, Console(quiet=True)) == 0
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path / name / 'study.db'}")
    return study, read_records(tmp_path / name / "replicates.jsonl")


def test_a_sweep_measures_a_schedule_once_and_confirms_it_once(tmp_path):
    """max_num_batched_tokens 2048, 4096 and 8192 never bind for this work: at the boundary's last clean
    value the probes saw one schedule for all three, so the comparison of the first answers the other two."""
    study, records = two_knob_sweep(tmp_path, "[2048,4096,8192]", "same")
    merged = [t for t in study.trials if t.user_attrs.get("source") == "schedule"]
    assert len(merged) >= 2, [(t.params, t.user_attrs.get("source")) for t in study.trials]
    by_number = {t.number: t for t in study.trials}
    for t in merged:
        twin = by_number[int(t.user_attrs["same_schedule_as"].removeprefix("trial "))]
        assert twin.params["max_num_seqs"] == t.params["max_num_seqs"]  # (the twin: measured, or the reference)
        assert twin.user_attrs.get("source") in (None, "reference")
        assert t.values == twin.values and t.user_attrs["ci"] == twin.user_attrs["ci"]
        flags = {**FLAGS, **t.params}
        # never compared or confirmed itself: its only runs are probes
        assert {r["stage"] for r in records if r["flags"] == flags} <= {"probe"}
    confirmed = [t for t in study.trials if t.number in {r["trial"] for r in records if r["stage"] == "confirm"}]
    assert confirmed
    assert len({t.params["max_num_seqs"] for t in confirmed}) == len(confirmed)  # never one schedule twice
    assert study.user_attrs["winner"] is not None
    report = (tmp_path / "same" / "report.md").read_text()
    assert "same engine schedule as trial" in report
    winner = study.user_attrs["winner"]["trial"]
    if any(t.user_attrs["same_schedule_as"] == f"trial {winner}" for t in merged):
        assert "the same configuration as the winner" in report


def test_merging_schedules_can_be_turned_off(tmp_path):
    study, records = two_knob_sweep(tmp_path, "[2048,4096,8192]", "off", "study.same_schedule=false")
    assert not [t for t in study.trials if t.user_attrs.get("source") == "schedule"]
    # (twins confirmed side by side cost the same: a tie-break among them is what the winner rule does then)
    assert {r["stage"] for r in records} - {"tiebreak"} == {"probe", "search", "confirm"}
    assert not [r for r in records if r["key"].startswith("schedule probe")]


def test_a_budget_that_binds_is_another_configuration(tmp_path):
    """A token budget of 64 chunks this work's prefills: its schedule differs from 8192's at every max_num_seqs
    above 4, so nothing there is merged and both are measured."""
    study, records = two_knob_sweep(tmp_path, "[64,8192]", "binds")
    for t in study.trials:
        if t.user_attrs.get("source") == "schedule":
            assert t.params["max_num_seqs"] * 16 <= 64 or t.user_attrs["same_schedule_as"] == "the baseline"
    measured = {t.params["max_num_batched_tokens"] for t in study.trials if t.user_attrs.get("source") is None
                and t.state == optuna.trial.TrialState.COMPLETE}
    assert measured == {64, 8192}


def test_repeated_proposals_are_one_line_of_the_table_not_one_each(tmp_path):
    from throttle_sweep.measurement.cost import Price
    from throttle_sweep.sweep.driver import SweepResult
    from throttle_sweep.sweep.report import lines

    study = optuna.create_study()
    dist = {"max_num_seqs": optuna.distributions.IntDistribution(1, 8)}
    study.add_trial(optuna.trial.create_trial(params={"max_num_seqs": 4}, distributions=dist, values=[0.5],
                                              user_attrs={"ratio": 0.5, "ci": [0.4, 0.6], "verdict": "CHEAPER",
                                                          "preemptions": 0, "constraints": [0.0]}))
    for _ in range(5):
        study.add_trial(optuna.trial.create_trial(params={"max_num_seqs": 4}, distributions=dist,
                                                  state=optuna.trial.TrialState.FAIL, user_attrs={"duplicate_of": 0}))
    out = lines(SweepResult(study, [], None, []), Price(), 0)
    table = [line for line in out if "max_num_seqs=4" in line]
    assert len(table) == 1 and "5 more proposal(s) repeated flags already answered" in "\n".join(out)


def test_a_chunking_the_outputs_do_not_show_is_another_schedule():
    """Two prompts of 1500 and 1000 tokens: a budget of 1600 starts the second one's prefill with 100 tokens in
    the first step, 1500 does not; which requests get tokens when is the same, the work per step is not
    (found by review: the output pattern alone could not tell them apart)."""
    from throttle_sweep.engines.base import Request
    from throttle_sweep.measurement.workload import drive

    def trace(budget):
        session = FakeEngine(FakeKnobs()).start({"max_num_seqs": 8, "max_num_batched_tokens": budget,
                                                 "kv_cache_memory_bytes": 64 << 20})
        work = [Request("a", 20, tuple(range(1500))), Request("b", 20, tuple(range(1000)))]
        return drive(session, work, loop="closed", concurrency=2).schedule

    assert trace(1500) != trace(1600)


def test_what_the_trace_cannot_show_keeps_configurations_apart():
    """Preemptions (recomputed work) and prefix-cache hits (work not done: a smaller KV cache evicts sooner) are
    part of a run's schedule, so equal step traces with different ones are two configurations."""
    a = {**FLAGS, "kv_cache_memory_bytes": 64 << 20}
    b = {**FLAGS, "kv_cache_memory_bytes": 4 << 20}
    base = {"status": "ok", "engine_schedule": {"fingerprint": "x"}, "preemptions": 0}
    assert ScheduleIndex([{**base, "flags": a}, {**base, "flags": b}]).same(a, b)
    hits = ScheduleIndex([{**base, "flags": a, "prefix_cache": {"hits": 1800}},
                          {**base, "flags": b, "prefix_cache": {"hits": 0}}])
    assert not hits.same(a, b)
    assert not ScheduleIndex([{**base, "flags": a}, {**base, "flags": b, "preemptions": 2}]).same(a, b)


def test_without_a_baseline_probe_nothing_is_told_the_baselines_answer(tmp_path):
    """No boundary probes: the baseline's answer would have to be made up, so flags with its schedule are
    compared like any others (found by review: they were told 0 preemptions and p95 latencies of 0)."""
    study, records = two_knob_sweep(tmp_path, "[2048,4096,8192]", "nobase", "study.boundary=none",
                                    "space.max_num_seqs.high=2", "study.n_trials=6")
    assert not [t for t in study.trials if t.user_attrs.get("same_schedule_as") == "the baseline"]
    at_one = [t for t in study.trials if t.params["max_num_seqs"] == 1 and t.user_attrs.get("source") is None]
    assert at_one and all("p95_itl_s" in t.user_attrs for t in at_one)


class TwoSlots(PoolBasics):
    """Two slots on the fake engine, in this process: each `wait` answers the oldest job, so two comparisons
    advance side by side as on two GPUs."""

    size = 2
    slots = [0, 1]  # noqa: RUF012 - two fixed slots

    def __init__(self, engine, spec, price) -> None:
        self.engine, self.spec, self.price, self.queue = engine, spec, price, []

    def submit(self, job) -> None:
        self.queue.append(job)

    def wait(self):
        job = self.queue.pop(0)
        return [(job, measure_replicate(self.engine, job.flags, self.spec, self.price, run_id="t", arm=job.arm,
                                        position=job.position, environment={},
                                        context={**job.context, "slot": f"s{job.slot}"}))]


def test_with_two_slots_a_schedule_in_flight_on_one_is_not_compared_again_on_the_other(tmp_path, monkeypatch):
    """max_num_batched_tokens 2048, 4096 and 8192 run one schedule at each clean max_num_seqs. With two slots the
    second of those configurations used to be compared in full beside the first, whose answer was not in yet
    (every clean max_num_seqs was compared twice here). Now it waits for that answer while its slot takes other
    work, and is told it."""
    monkeypatch.setattr(sweep_cmd, "make_pool", lambda run, **_: (TwoSlots(run.engine, run.spec, run.price),
                                                                   lambda: None))
    study, records = two_knob_sweep(tmp_path, "[2048,4096,8192]", "two", "study.n_trials=6")
    assert {r["slot"] for r in records if r["stage"] == "search"} == {"s0", "s1"}  # both slots compared
    compared = [t for t in study.trials if t.number in {r["trial"] for r in records if r["stage"] == "search"}]
    probed = {r["trial"] for r in records if r["key"].startswith("schedule probe")}
    by_seqs = Counter(t.params["max_num_seqs"] for t in compared)
    for t in compared:  # a schedule compared twice: only once the schedule probes' budget (n_trials) is spent
        if by_seqs[t.params["max_num_seqs"]] > 1:
            assert t.number not in probed and len(probed) == 3 * 6, [x.params for x in compared]
    told = [t for t in study.trials if t.user_attrs.get("source") == "schedule"]
    assert len({t.params["max_num_seqs"] for t in told}) >= 3  # three schedules answered twins in flight
    assert all(t.state == optuna.trial.TrialState.COMPLETE and t.user_attrs["same_schedule_as"].startswith("trial ")
               for t in told)


class FaultyTwoSlots(TwoSlots):
    """Two slots whose every `every`-th search replicate is lost to the slot (a node or actor fault): its
    comparison starts again from scratch."""

    def __init__(self, engine, spec, price, every: int) -> None:
        super().__init__(engine, spec, price)
        self.every, self.search_jobs = every, 0

    def wait(self):
        from throttle_sweep.measurement.replicate import failed_record, record_header

        job = self.queue[0]
        if job.context.get("stage") == "search":
            self.search_jobs += 1
            if self.search_jobs % self.every == 0:
                self.queue.pop(0)
                header = record_header(self.engine, job.flags, self.spec, self.price, run_id="t", arm=job.arm,
                                       position=job.position, environment={},
                                       context={**job.context, "slot": f"s{job.slot}"})
                return [(job, failed_record(header, "node died", infrastructure=True))]
        return super().wait()


def test_trials_waiting_for_a_twin_whose_comparison_is_lost_are_all_answered(tmp_path, monkeypatch):
    """A comparison lost to its slot starts again; the trials waiting for its answer wait behind it. None is
    ever left open (RUNNING), which would also hold a place in the trial budget for good."""
    monkeypatch.setattr(sweep_cmd, "make_pool", lambda run, **_: (
        FaultyTwoSlots(run.engine, run.spec, run.price, every=7), lambda: None))
    study, records = two_knob_sweep(tmp_path, "[2048,4096,8192]", "faulty", "study.n_trials=6")
    assert [r for r in records if r.get("infrastructure")]
    assert not [t.number for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
    by_number = {t.number: t for t in study.trials}
    twins = [by_number[int(t.user_attrs["same_schedule_as"].removeprefix("trial "))] for t in study.trials
             if t.user_attrs.get("source") == "schedule" and t.user_attrs["same_schedule_as"].startswith("trial ")]
    assert [t for t in twins if t.user_attrs.get("discarded_comparisons")]  # answered after its comparison was lost


class FirstRunLost(TwoSlots):
    """One slot whose first replicate of every comparison's first attempt is lost to the slot."""

    size = 1
    slots = [0]  # noqa: RUF012 - one fixed slot

    def wait(self):
        from throttle_sweep.measurement.replicate import failed_record, record_header

        job = self.queue[0]
        if job.context.get("stage") == "search" and job.position == 0 and "~" not in job.context["key"]:
            self.queue.pop(0)
            header = record_header(self.engine, job.flags, self.spec, self.price, run_id="t", arm=job.arm,
                                   position=job.position, environment={}, context={**job.context, "slot": "s0"})
            return [(job, failed_record(header, "node died", infrastructure=True))]
        return super().wait()


def test_a_comparison_started_again_is_never_probed_against_itself(tmp_path, monkeypatch):
    """One slot: a comparison lost to its slot starts again as it was, with no schedule probe in between (a
    trial in flight is never its own neighbour)."""
    monkeypatch.setattr(sweep_cmd, "make_pool", lambda run, **_: (
        FirstRunLost(run.engine, run.spec, run.price), lambda: None))
    study, records = two_knob_sweep(tmp_path, "[2048,4096,8192]", "again", "study.n_trials=6")
    lost = {r["trial"] for r in records if r.get("infrastructure")}
    assert len(lost) >= 3
    for r in records:
        if r["key"].startswith("schedule probe") and r["trial"] in lost:
            first_search = min(x["started_at"] for x in records if x["trial"] == r["trial"] and x["stage"] == "search")
            assert r["started_at"] < first_search, f"trial {r['trial']} was probed after its comparison began"
    assert not [t.number for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]


def test_schedule_probes_outlast_a_trial_budget_spent_on_twins(tmp_path):
    """Four token budgets that never bind, four trials: the grid takes each max_num_seqs at every budget in turn.
    A probe is one run against a comparison's four: the twins the boundary probes did not already show are
    each probed and told, and every measured trial is a new configuration. (With as many schedule probes as
    trials, max_num_seqs=10 was compared twice, as the main command compared max_num_seqs=5 and 1.)"""
    study, _ = two_knob_sweep(tmp_path, "[2048,4096,8192,16384]", "outlast", "study.n_trials=4")
    compared = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE
                and t.user_attrs.get("source") in (None, "reference")]  # (the reference: answered by its probes)
    assert len(compared) == 4 and len({t.params["max_num_seqs"] for t in compared}) == 4, \
        [t.params for t in compared]
    assert len([t for t in study.trials if t.user_attrs.get("source") == "schedule"]) >= 3
