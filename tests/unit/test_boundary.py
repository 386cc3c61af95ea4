"""The boundary finder: single-run probes find where preemption starts, exactly, on surfaces of every shape
it must handle, and say so when a surface breaks its assumptions (then feasibility comes from replicates)."""

from __future__ import annotations

import optuna
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from rich.console import Console

from tests.helpers import PoolBasics, compose_cfg
from throttle_sweep.commands import sweep as sweep_cmd
from throttle_sweep.errors import ConfigError
from throttle_sweep.store.records import read_records
from throttle_sweep.sweep.boundary import (
    NOISY_REPEATS,
    BoundarySearch,
    describe,
    knob_values,
    predicted_last_clean,
)


def run(search: BoundarySearch, preemptions, slots: int = 1) -> tuple[int, int]:
    """Answer the search's probes with `preemptions(value, repeat)`, `slots` at a time, a round at a time;
    returns (probes, rounds)."""
    probes = rounds = 0
    while not search.done():
        batch = search.wanted(slots)
        assert batch, "a search that is not done must ask for something when nothing is in flight"
        rounds += 1
        for index, repeat in batch:
            search.add(index, repeat, preemptions(search.boundary.values[index], repeat))
            probes += 1
    return probes, rounds


def assert_found(search: BoundarySearch, edge: int, high: int) -> None:
    """The search over max_num_seqs 1..high on the surface max(0, v - edge) ended settled, at the true edge."""
    b = search.boundary.summary()
    assert b["settled"]
    if edge < 1:
        assert b["last_clean"] is None and b["first_preempting"] == 1
    elif edge >= high:
        assert b["last_clean"] == high and b["first_preempting"] is None
    else:
        assert (b["last_clean"], b["first_preempting"], b["exact"]) == (edge, edge + 1, True)
        assert search.boundary.feasible(edge) is True and search.boundary.feasible(edge + 1) is False
        assert search.boundary.feasible(1) is True and search.boundary.feasible(high) is False


@settings(max_examples=60, deadline=None)
@given(high=st.integers(2, 300), edge=st.integers(0, 300), slots=st.integers(1, 4))
def test_an_increasing_surface_gives_the_exact_boundary_in_logarithmic_probes(high, edge, slots):
    search = BoundarySearch.over("max_num_seqs", IntDistribution(1, high, log=True), {}, parallel=slots)
    probes, rounds = run(search, lambda v, _: max(0, v - edge), slots)
    assert_found(search, edge, high)
    one_slot = 2 + (high - 1).bit_length() + 2  # both ends, bisection, the recheck
    assert (probes if slots == 1 else rounds) <= one_slot  # more slots: more probes a round, fewer rounds


def test_a_decreasing_surface_kv_size_preempts_below_a_value():
    sizes = [1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20, 32 << 20]
    search = BoundarySearch.over("kv_cache_memory_bytes", CategoricalDistribution(sizes[::-1]), {})
    run(search, lambda v, _: 5 if v < (8 << 20) else 0)
    b = search.boundary
    assert b.direction == "down" and b.summary()["last_clean"] == 8 << 20 and b.summary()["first_preempting"] == 4 << 20
    assert b.feasible(16 << 20) is True and b.feasible(2 << 20) is False
    assert "last clean kv_cache_memory_bytes=8388608" in describe(b.summary())


def test_a_repeat_that_disagrees_makes_feasibility_noisy_and_the_clean_side_is_replicated():
    """On a GPU the engine core schedules asynchronously, so batch composition, and with it a preemption count,
    may depend on timing. A repeat that disagrees does not throw the probes away: the last clean value must
    then run clean in every one of NOISY_REPEATS probes, and a value that preempted in any probe counts as
    preempting (as a trial's replicates are judged: the worst count)."""
    search = BoundarySearch.over("max_num_seqs", IntDistribution(1, 16), {})
    # 8 preempts on its second run only; 7 on its third; 6 and below never
    flaky = {(8, 2), (7, 3)}
    probes, _ = run(search, lambda v, repeat: max(0, v - 8) + ((v, repeat) in flaky))
    b = search.boundary
    assert not b.consistent and b.noisy and b.settled
    summary = b.summary()
    assert (summary["last_clean"], summary["first_preempting"]) == (6, 7) and summary["noisy"]
    assert len(b.counts[b.values.index(6)]) == NOISY_REPEATS and b.feasible(6) is True and b.feasible(7) is False
    assert b.feasible(1) is True and b.feasible(16) is False
    text = describe(summary)
    assert "noisy" in text and f"clean in all {NOISY_REPEATS} of its probes" in text
    assert probes <= 2 + 4 + 2 + 2 * NOISY_REPEATS, probes


def test_noise_seen_in_another_setting_replicates_the_clean_side_from_the_start():
    search = BoundarySearch.over("max_num_seqs", IntDistribution(1, 16), {}, near=(8, 9), direction="up",
                                 noisy=True)
    run(search, lambda v, _: max(0, v - 8))
    b = search.boundary
    assert b.settled and b.noisy and (b.summary()["last_clean"], b.summary()["first_preempting"]) == (8, 9)
    assert len(b.counts[b.values.index(8)]) == NOISY_REPEATS and len(b.counts[b.values.index(9)]) == 1


def test_a_clean_value_beyond_a_preempting_one_is_no_boundary():
    search = BoundarySearch.over("max_num_seqs", IntDistribution(1, 16), {})
    run(search, lambda v, _: 0 if v in (1, 16) else (3 if v == 8 else 0))
    # the ends are both clean: no boundary in the range, and the recheck finds nothing odd
    assert search.boundary.summary()["first_preempting"] is None
    # bisection can only see what it probes: with three slots a round probes 5, 9 and 12 between the ends
    search = BoundarySearch.over("max_num_seqs", IntDistribution(1, 16), {}, parallel=3)
    run(search, lambda v, _: 4 if v == 5 or v >= 14 else 0, slots=3)
    assert not search.boundary.monotone and search.boundary.feasible(1) is None
    assert "interleave" in describe(search.boundary.summary())


@settings(max_examples=80, deadline=None)
@given(high=st.integers(2, 200), edge=st.integers(0, 200), near=st.integers(1, 199))
def test_a_search_started_near_a_known_boundary_finds_the_exact_boundary_and_confirms_an_unmoved_one_in_two(
        high, edge, near):
    """Another setting of the other knobs starts at the neighbours where the first setting's boundary lay. Where
    the boundary has not moved, two probes confirm it (determinism was checked on the first setting); where it
    has, the search goes on from there and still ends exact."""
    near = min(near, high - 1)
    search = BoundarySearch.over("max_num_seqs", IntDistribution(1, high, log=True), {}, near=(near, near + 1),
                                 direction="up")
    probes, _ = run(search, lambda v, _: max(0, v - edge))
    assert_found(search, edge, high)
    if edge == near:
        assert probes == 2
    assert probes <= 2 + 1 + (high - 1).bit_length()  # the two, one end, bisection of what is left; no recheck


def test_a_search_from_a_predicted_boundary_that_lies_a_little_higher_gallops_up_to_it():
    """The KV capacity's prediction is a floor (staggered admission can keep one more batch clean): where both
    values either side of it run clean, the search steps up by doubling distances, not to the top of the range
    (max_num_seqs=2048 is the longest probe there is)."""
    probed = []

    def count(v, _):
        probed.append(v)
        return max(0, v - 130)

    search = BoundarySearch.over("max_num_seqs", IntDistribution(1, 2048), {}, near=(126, 127), direction="up",
                                 recheck=True, gallop=True)
    run(search, count)
    b = search.boundary.summary()
    assert (b["last_clean"], b["first_preempting"], b["exact"], b["settled"]) == (130, 131, True, True)
    assert 2048 not in probed and len(probed) <= 9, probed


@settings(max_examples=60, deadline=None)
@given(high=st.integers(2, 300), edge=st.integers(0, 300), near=st.integers(1, 299))
def test_a_galloping_search_finds_the_exact_boundary_wherever_it_lies(high, edge, near):
    near = min(near, high - 1)
    search = BoundarySearch.over("max_num_seqs", IntDistribution(1, high, log=True), {}, near=(near, near + 1),
                                 direction="up", recheck=True, gallop=True)
    run(search, lambda v, _: max(0, v - edge))
    assert_found(search, edge, high)


def test_a_search_started_near_a_boundary_on_a_decreasing_knob_probes_only_the_end_it_needs():
    sizes = [1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20, 32 << 20]
    probed = []

    def count(v, _):
        probed.append(v)
        return 5 if v < (2 << 20) else 0

    search = BoundarySearch.over("kv_cache_memory_bytes", CategoricalDistribution(sizes), {},
                                 near=(8 << 20, 4 << 20), direction="down")
    run(search, count)
    b = search.boundary.summary()
    assert (b["last_clean"], b["first_preempting"], b["direction"]) == (2 << 20, 1 << 20, "down")
    assert 32 << 20 not in probed  # the clean end of a decreasing knob is never needed once a clean value is seen


def test_knob_values_are_the_full_resolution():
    assert knob_values(IntDistribution(1, 64, log=True)) == list(range(1, 65))
    assert knob_values(FloatDistribution(0.5, 0.9, step=0.1)) == [0.5, 0.6, 0.7, 0.8, 0.9]
    assert len(knob_values(FloatDistribution(0.5, 0.9))) == 33
    assert knob_values(CategoricalDistribution([4096, 1024, 2048])) == [1024, 2048, 4096]


def test_the_kv_capacity_predicts_how_many_full_requests_fit():
    assert predicted_last_clean(16, 128, [160]) == 8  # 2 blocks a request, 16 blocks
    assert predicted_last_clean(15, 128, [160]) == 7
    assert predicted_last_clean(None, 128, [160]) is None and predicted_last_clean(16, 128, [100, 160]) is None


KV = 48 * 16 * 1024  # the fake: 48 blocks of 16 tokens
WORK = ["workload.num_requests=32", "workload.prompt_len=16", "workload.output_len=48", "workload.concurrency=32",
        "workload.warmup_requests=0", "engine.block_size=16"]


def test_a_two_knob_space_gets_a_boundary_for_each_setting_of_the_other_knob(tmp_path):
    """max_num_seqs x KV size on the fake: more KV moves the boundary up; each is exact, and the sweep never
    measures a comparison past the boundary of its own KV size."""
    kvs = [KV // 2, KV, 2 * KV]
    cfg = compose_cfg("backend=fake", *WORK, "+space=batching", "space.max_num_seqs.low=1", "space.max_num_seqs.high=32",
                      "space.max_num_seqs.log=false", "~space.max_num_batched_tokens",
                      f"+space.kv_cache_memory_bytes={{type: categorical, choices: {kvs}}}", "study.name=two",
                      "study.n_trials=6", "compare.replicates=2", "study.confirm_replicates=2", "study.confirm_top=1",
                      "plots=false", tmp_path=tmp_path)
    assert sweep_cmd.run(cfg, Console(quiet=True)) == 0
    study = optuna.load_study(study_name="two", storage=f"sqlite:///{tmp_path / 'two' / 'study.db'}")
    found = {b["others"]["kv_cache_memory_bytes"]: b for b in study.user_attrs["boundaries"]}
    assert set(found) == set(kvs) and all(b["exact"] and b["settled"] for b in found.values())
    edges = [found[kv]["last_clean"] for kv in kvs]
    assert edges == sorted(edges) and len(set(edges)) == 3, edges
    for kv in kvs:  # each agrees with the fake run directly
        assert found[kv]["predicted_last_clean"] == found[kv]["last_clean"]
    for t in study.trials:
        if t.user_attrs.get("source") is None and t.state == optuna.trial.TrialState.COMPLETE:
            assert t.params["max_num_seqs"] <= found[t.params["kv_cache_memory_bytes"]]["last_clean"]
            assert t.user_attrs["preemptions"] == 0


class ParallelPool(PoolBasics):
    """Three slots on the noiseless fake that finish together: `wait` returns every job submitted."""

    slots, size = [0, 1, 2], 3

    def __init__(self):
        from throttle_sweep.engines import FakeEngine, FakeKnobs

        self.engine, self.queue, self.rounds = FakeEngine(FakeKnobs()), [], []

    def submit(self, job):
        self.queue.append(job)

    def wait(self):
        from throttle_sweep.measurement.cost import Price
        from throttle_sweep.measurement.replicate import measure_replicate
        from throttle_sweep.measurement.workload import WorkloadSpec

        spec = WorkloadSpec(num_requests=32, prompt_len=16, output_len=48, concurrency=32, warmup_requests=0)
        done, self.queue = self.queue, []
        self.rounds.append(len(done))
        return [(job, measure_replicate(self.engine, job.flags, spec, Price(), run_id="t", arm=job.arm,
                                        position=job.position, environment={}, context=dict(job.context)))
                for job in done]

    def close(self):
        pass


def test_probes_use_every_free_slot_in_each_round():
    from throttle_sweep.sweep.driver import Sweep
    from throttle_sweep.sweep.options import SweepSettings

    pool = ParallelPool()
    flags = {"kv_cache_memory_bytes": KV, "block_size": 16, "max_model_len": 1024}
    sweep = Sweep(study=optuna.create_study(), distributions={"max_num_seqs": IntDistribution(1, 64)},
                  base_flags=flags, baseline_flags={**flags, "max_num_seqs": 1}, workload_key={}, pool=pool,
                  write=lambda r: None, existing=[], settings=SweepSettings(boundary_knob="max_num_seqs"))
    sweep.find_boundaries()
    (found,) = sweep.view.study.user_attrs["boundaries"]
    assert found["exact"] and found["settled"]
    # the baseline and both ends at once, then rounds of 3 points (64 -> 16 -> 4 -> 1 values), then the recheck
    assert len(pool.rounds) <= 6 and max(pool.rounds) == 3, pool.rounds


def probe_sweep(distributions):
    from throttle_sweep.sweep.driver import Sweep
    from throttle_sweep.sweep.options import SweepSettings

    pool = ParallelPool()
    flags = {"kv_cache_memory_bytes": KV, "block_size": 16, "max_model_len": 1024}
    sweep = Sweep(study=optuna.create_study(), distributions=distributions, base_flags=flags,
                  baseline_flags={**flags, "max_num_seqs": 1}, workload_key={}, pool=pool, write=lambda r: None,
                  existing=[], settings=SweepSettings(boundary_knob="max_num_seqs"))
    sweep.find_boundaries()
    return sweep.view.study.user_attrs["boundaries"], sum(pool.rounds)


def test_a_knob_that_does_not_move_the_boundary_costs_two_probes_a_setting():
    """max_num_batched_tokens far above what this work schedules in a step leaves the boundary where it is: the
    first setting is searched in full, each other one is confirmed with the two values either side of it."""
    alone, probes_alone = probe_sweep({"max_num_seqs": IntDistribution(1, 64)})
    tokens = CategoricalDistribution([2048, 4096, 8192])
    found, probes = probe_sweep({"max_num_seqs": IntDistribution(1, 64), "max_num_batched_tokens": tokens})
    assert len(found) == 3 and all(b["exact"] and b["settled"] for b in found)
    assert {(b["last_clean"], b["first_preempting"]) for b in found} == {(alone[0]["last_clean"],
                                                                          alone[0]["first_preempting"])}
    assert probes == probes_alone + 2 * 2, (probes, probes_alone)


def test_a_search_started_near_a_boundary_that_probes_the_wrong_way_round_is_not_settled():
    """An 'up' knob whose two start values answer preempting-then-clean (a failed run counts as preempting) is
    no boundary pointing down: the ends are probed, and a clean value past a preempting one unsettles it."""
    search = BoundarySearch.over("max_num_seqs", IntDistribution(1, 16), {}, near=(8, 9), direction="up")
    run(search, lambda v, _: 0 if v in (1, 9, 16) else 3)
    b = search.boundary
    assert 0 in b.probed and not b.monotone and not b.settled and b.feasible(1) is None and b.feasible(16) is None


def test_a_search_started_near_a_boundary_that_finds_none_knows_which_side_is_clean():
    sizes = [1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20, 32 << 20]
    clean = BoundarySearch.over("kv_cache_memory_bytes", CategoricalDistribution(sizes), {},
                                near=(8 << 20, 4 << 20), direction="down")
    run(clean, lambda v, _: 0)
    b = clean.boundary.summary()
    assert (b["last_clean"], b["first_preempting"]) == (1 << 20, None)  # every size is clean, the smallest too
    assert clean.boundary.feasible(32 << 20) is True and clean.boundary.feasible(1 << 20) is True
    dirty = BoundarySearch.over("kv_cache_memory_bytes", CategoricalDistribution(sizes), {},
                                near=(8 << 20, 4 << 20), direction="down")
    run(dirty, lambda v, _: 2)
    b = dirty.boundary.summary()
    assert (b["last_clean"], b["first_preempting"]) == (None, 32 << 20)  # every size preempts, the largest too
    assert dirty.boundary.feasible(1 << 20) is False and dirty.boundary.feasible(16 << 20) is False


def test_a_sampler_that_only_repeats_itself_is_followed_by_the_clean_points_nearest_the_boundary(tmp_path,
                                                                                                 monkeypatch):
    """The main command once stopped after 6 trials because TPE proposed only flags already answered, and never
    tried max_num_seqs=7, beside the boundary (8/9), where the cheapest point usually lies. When the sampler
    only repeats, the search takes the unanswered clean points nearest the boundary, within the trial budget."""
    study, _ = repeating_sweep(tmp_path, monkeypatch, "repeats", {"max_num_seqs": 2},
                               "~space.max_num_batched_tokens")
    (found,) = study.user_attrs["boundaries"]
    edge = found["last_clean"]
    assert found["first_preempting"] == edge + 1 < 32 and edge - 3 > 2, found
    assert measured_seqs(study) == [2, edge - 3, edge - 2, edge - 1, edge]


def repeating_sweep(tmp_path, monkeypatch, name, fixed, *overrides):
    """A five-trial fake sweep whose sampler proposes `fixed` every time: it only repeats itself."""
    monkeypatch.setattr(sweep_cmd, "make_sampler", lambda *a, **k: optuna.samplers.PartialFixedSampler(
        fixed, optuna.samplers.RandomSampler(seed=0)))
    cfg = compose_cfg("backend=fake", *WORK, f"engine.kv_cache_memory_bytes={KV}", "+space=batching",
                      "space.max_num_seqs.low=1", "space.max_num_seqs.high=32", "space.max_num_seqs.log=false",
                      *overrides, f"study.name={name}", "study.n_trials=5", "compare.replicates=2",
                      "study.confirm_replicates=2", "study.confirm_top=1", "plots=false", tmp_path=tmp_path)
    assert sweep_cmd.run(cfg, Console(quiet=True)) == 0
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path / name / 'study.db'}")
    return study, read_records(tmp_path / name / "replicates.jsonl")


def measured_seqs(study):
    """The max_num_seqs of the trials their own comparison answered, and the search's reference (its probes)."""
    return sorted(t.params["max_num_seqs"] for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE
                  and t.user_attrs.get("source") in (None, "reference"))


def test_the_points_after_a_repeating_sampler_are_new_configurations_not_schedule_twins(tmp_path, monkeypatch):
    """max_num_batched_tokens 2048, 4096 and 8192 never bind for this work: at one max_num_seqs they are one
    configuration. Once the sampler only repeats, the next points are max_num_seqs values nothing has answered
    yet, not other token budgets at a max_num_seqs already measured (the main command compared
    max_num_seqs=6 twice that way)."""
    study, records = repeating_sweep(tmp_path, monkeypatch, "twins", {"max_num_seqs": 2, "max_num_batched_tokens": 2048},
                                     "space.max_num_batched_tokens.choices=[2048,4096,8192]")
    edge = study.user_attrs["boundaries"][0]["last_clean"]
    assert measured_seqs(study) == [2, edge - 3, edge - 2, edge - 1, edge]
    assert not [r["key"] for r in records if r["key"].startswith("schedule probe")]


def probed_sweep(distributions):
    """A driver whose probes have run (the noiseless fake, three slots at once), nothing else measured yet."""
    from throttle_sweep.sweep.driver import Sweep
    from throttle_sweep.sweep.options import SweepSettings

    flags = {"kv_cache_memory_bytes": KV, "block_size": 16, "max_model_len": 1024}
    sweep = Sweep(study=optuna.create_study(), distributions=distributions, base_flags=flags,
                  baseline_flags={**flags, "max_num_seqs": 1}, workload_key={}, pool=ParallelPool(),
                  write=lambda r: None, existing=[],  # (the baseline as yardstick: no reference answers a point)
                  settings=SweepSettings(boundary_knob="max_num_seqs", reference="baseline"))
    sweep.find_boundaries()
    return sweep


def told(sweep, params, state, **attrs):
    sweep.view.study.enqueue_trial(params)
    trial = sweep.view.study.ask(sweep.view.distributions)
    for key, value in attrs.items():
        trial.set_user_attr(key, value)
    sweep.view.study.tell(trial, 0.5 if state == optuna.trial.TrialState.COMPLETE else None, state=state)


def test_the_point_after_a_repeating_sampler_is_never_one_whose_own_comparison_already_ended():
    """A comparison that ended without a verdict (its runs disagreed on the token count: no blame) answers
    nothing for the sampler, but offering that point again after a repeating sampler would measure it again
    and again, nearest the boundary as it is, until the budget is gone."""
    sweep = probed_sweep({"max_num_seqs": IntDistribution(1, 32)})
    edge = sweep.view.nearest_unanswered()
    assert edge is not None
    told(sweep, edge, optuna.trial.TrialState.FAIL, reason="token counts differ")
    after = sweep.view.nearest_unanswered()
    assert after is not None and after != edge and after["max_num_seqs"] == edge["max_num_seqs"] - 1
    # a comparison stopped by a failing baseline (or a lost slot) answers nothing: its point stays on offer
    told(sweep, after, optuna.trial.TrialState.FAIL, blame="baseline", reason="the baseline failed")
    assert sweep.view.nearest_unanswered() == after


def test_a_token_budget_whose_probes_show_another_schedule_is_a_new_configuration():
    """max_num_batched_tokens=16 chunks every prefill of this work (16-token prompts, several a step), 8192
    never binds: at one max_num_seqs their probes record different schedules, so measuring one leaves the
    other a new configuration worth its own comparison; a budget whose schedule nothing shows is offered after."""
    tokens = CategoricalDistribution([16, 8192])
    sweep = probed_sweep({"max_num_seqs": IntDistribution(1, 32), "max_num_batched_tokens": tokens})
    first = sweep.view.nearest_unanswered()
    edge = first["max_num_seqs"]
    other = {**first, "max_num_batched_tokens": 8192 if first["max_num_batched_tokens"] == 16 else 16}
    a, b = (sweep.view.candidate_flags(p) for p in (first, other))
    assert sweep.view.schedules.fingerprint(a) and sweep.view.schedules.fingerprint(b) and not sweep.view.schedules.same(a, b)
    told(sweep, first, optuna.trial.TrialState.COMPLETE, ratio=0.5)
    assert sweep.view.nearest_unanswered() == other, edge


def reference_sweep(tmp_path, name, *overrides):
    cfg = compose_cfg("backend=fake", *WORK, f"engine.kv_cache_memory_bytes={KV}", "+space=batching",
                      "space.max_num_seqs.low=1", "space.max_num_seqs.high=32", "space.max_num_seqs.log=false",
                      "~space.max_num_batched_tokens", f"study.name={name}", "study.n_trials=4",
                      "compare.replicates=2", "study.confirm_replicates=2", "study.confirm_top=2", "plots=false",
                      *overrides, tmp_path=tmp_path)
    assert sweep_cmd.run(cfg, Console(quiet=True)) == 0
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path / name / 'study.db'}")
    return study, read_records(tmp_path / name / "replicates.jsonl")


def test_search_comparisons_run_against_the_boundarys_last_clean_point_and_confirmations_against_the_baseline(
        tmp_path):
    """The baseline (max_num_seqs=1) is the slowest point of the space and was half of every search comparison:
    the demo's search spent 132 of its 178 engine-seconds on it. Once the probes name the boundary, the search
    compares candidates against its last clean point instead (probed clean twice, fast); only confirmation
    meets the baseline, so the answer quoted is still against it."""
    study, records = reference_sweep(tmp_path, "ref")
    edge = study.user_attrs["boundaries"][0]["last_clean"]
    (ref,) = [t for t in study.trials if t.user_attrs.get("source") == "reference"]
    assert ref.params == {"max_num_seqs": edge} and ref.value == 1.0 and ref.user_attrs["preemptions"] == 0
    search = [r for r in records if r["stage"] == "search"]
    assert search and {r["flags"]["max_num_seqs"] for r in search if r["arm"] == "baseline"} == {edge}
    confirm = [r for r in records if r["stage"] == "confirm"]
    assert confirm and {r["flags"]["max_num_seqs"] for r in confirm if r["arm"] == "baseline"} == {1}
    for t in study.trials:  # every search ratio is to the reference: the candidate's cost over the reference's
        if t.user_attrs.get("source") is None and t.state == optuna.trial.TrialState.COMPLETE:
            expected = t.user_attrs["usd_per_mtok"] / ref.user_attrs["usd_per_mtok"]
            assert abs(t.value / expected - 1) < 0.1, (t.params, t.value, expected)
    winner = study.user_attrs["winner"]
    assert winner["params"]["max_num_seqs"] <= edge


def test_study_reference_baseline_compares_the_search_against_the_baseline_and_a_bad_value_is_refused(tmp_path):
    study, records = reference_sweep(tmp_path, "base", "study.reference=baseline")
    assert not [t for t in study.trials if t.user_attrs.get("source") == "reference"]
    assert {r["flags"]["max_num_seqs"] for r in records if r["stage"] == "search" and r["arm"] == "baseline"} == {1}
    cfg = compose_cfg("backend=fake", "+space=batching", "study.reference=fastest", tmp_path=tmp_path)
    with pytest.raises(ConfigError, match="study.reference must be auto or baseline, but got 'fastest'"):
        sweep_cmd.run(cfg, Console(quiet=True))


def test_a_study_keeps_its_reference_on_a_resume_and_refuses_settings_that_need_the_baseline(tmp_path):
    """A resume that probes no more (study.boundary=none) still compares against the study's reference, never
    the baseline beside ratios to the reference; one that asks for the baseline as yardstick (or latency limits,
    which one probe cannot vouch for) is refused with a clear error before anything is measured."""
    study, records = reference_sweep(tmp_path, "keep")
    (ref,) = [t for t in study.trials if t.user_attrs.get("source") == "reference"]
    study, after = reference_sweep(tmp_path, "keep", "study.boundary=none", "study.n_trials=6")
    new = [r for r in after[len(records):] if r["stage"] == "search"]
    assert new and {r["flags"]["max_num_seqs"] for r in new if r["arm"] == "baseline"} == {ref.params["max_num_seqs"]}
    for bad in ("study.reference=baseline", "study.max_p95_ttft_s=1.0"):
        with pytest.raises(ConfigError, match=f"study 'keep' searched against the reference .*{bad.split('=')[0]}"):
            reference_sweep(tmp_path, "keep", bad, "study.n_trials=8")
        assert len(read_records(tmp_path / "keep" / "replicates.jsonl")) == len(after)


class ReferencePreemptsPool(ParallelPool):
    """The noiseless fake, except that the search's reference arm preempts in search comparisons (a slot with
    less KV than the probes', or an engine less deterministic than closed-loop work promises)."""

    def wait(self):
        done = super().wait()
        for job, record in done:
            if job.context.get("stage") == "search" and job.arm == "baseline":
                record["preemptions"] = 2
        return done


def test_a_reference_that_preempts_in_a_search_comparison_answers_nothing():
    """The reference is clean by its probes, not by law: where its arm preempts in a comparison, its cost is
    inflated and the ratio flatters the candidate. That comparison answers nothing (blamed on the yardstick,
    the point stays on offer) instead of ranking the candidate on it."""
    from throttle_sweep.sweep.driver import Sweep
    from throttle_sweep.sweep.options import SweepSettings

    flags = {"kv_cache_memory_bytes": KV, "block_size": 16, "max_model_len": 1024}
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    sweep = Sweep(study=study, distributions={"max_num_seqs": IntDistribution(1, 32)}, base_flags=flags,
                  baseline_flags={**flags, "max_num_seqs": 1}, workload_key={}, pool=ReferencePreemptsPool(),
                  write=lambda r: None, existing=[],
                  settings=SweepSettings(boundary_knob="max_num_seqs", n_trials=3, replicates=2, confirm_top=1,
                                         confirm_replicates=2))
    result = sweep.run()
    compared = [t for t in study.trials if t.user_attrs.get("comparison") and t.user_attrs.get("source") is None]
    assert compared and all(t.state == optuna.trial.TrialState.FAIL and t.user_attrs["blame"] == "baseline"
                            and "the reference preempted" in t.user_attrs["reason"] for t in compared)
    assert result.winner is not None and result.winner.params == sweep.view.findings.reference  # confirmed against the baseline


def test_a_gallop_from_a_high_prediction_takes_steps_in_proportion_to_it():
    """On the H100 twin the KV capacity predicted 2005 of 2048 while nothing up to 2048 preempted (admission
    staggers the batch): steps of one, two, four values took seven probes to reach the top."""
    probed = []

    def count(v, _):
        probed.append(v)
        return 0

    search = BoundarySearch.over("max_num_seqs", IntDistribution(1, 2048, log=True), {}, near=(2005, 2006),
                                 direction="up", recheck=True, gallop=True)
    run(search, count)
    assert search.boundary.summary()["last_clean"] == 2048 and len(set(probed)) <= 3, probed
