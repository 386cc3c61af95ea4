"""The sweep on the fake engine, whose cost surface and preemption boundary follow from its simulation."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from rich.console import Console

from tests.helpers import PoolBasics, compose_cfg
from throttle_sweep.commands import export as export_cmd
from throttle_sweep.commands import sweep as sweep_cmd
from throttle_sweep.engines import FakeEngine, FakeKnobs
from throttle_sweep.errors import ConfigError
from throttle_sweep.measurement.cost import Price
from throttle_sweep.measurement.replicate import measure_replicate
from throttle_sweep.measurement.workload import WorkloadSpec
from throttle_sweep.store.records import read_records

ROOT = Path(__file__).resolve().parents[2]
KV = 48 * 16 * 1024  # 48 blocks of 16 tokens: the fake preempts once ~12 sequences of 64 tokens run at once
WORK = ["workload.num_requests=32", "workload.prompt_len=16", "workload.output_len=48", "workload.concurrency=32",
        "workload.warmup_requests=0", f"engine.kv_cache_memory_bytes={KV}", "engine.block_size=16"]
SPACE = ["+space=batching", "space.max_num_seqs.low=1", "space.max_num_seqs.high=32", "space.max_num_seqs.log=false",
         "~space.max_num_batched_tokens"]


def truth():
    """Cost and preemptions of every point, measured directly on the noiseless fake."""
    spec = WorkloadSpec(num_requests=32, prompt_len=16, output_len=48, concurrency=32, warmup_requests=0)
    out = {}
    for n in range(1, 33):
        r = measure_replicate(FakeEngine(FakeKnobs()), {"max_num_seqs": n, "kv_cache_memory_bytes": KV,
                                                        "block_size": 16, "max_model_len": 1024}, spec, Price(), run_id="t",
                              arm="x", position=0, environment={})
        out[n] = (r["steady"]["usd_per_mtok"], r["preemptions"])  # the cost the sweep judges
    return out


def sweep(tmp_path, *overrides, name="s"):
    cfg = compose_cfg("backend=fake", *WORK, *SPACE, f"study.name={name}", *overrides, tmp_path=tmp_path)
    assert sweep_cmd.run(cfg, Console(quiet=True)) == 0
    return optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path / name / 'study.db'}")


def test_the_fake_surface_has_a_boundary_inside_the_range():
    surface = truth()
    assert surface[1][1] == 0 and surface[32][1] > 0
    feasible = {n: c for n, (c, p) in surface.items() if p == 0}
    assert max(feasible) < 32 and surface[max(feasible) + 1][1] > 0


def test_grid_sweep_finds_the_cheapest_feasible_point_and_never_an_infeasible_one(tmp_path):
    surface = truth()
    best = min((n for n, (c, p) in surface.items() if p == 0), key=lambda n: surface[n][0])
    study = sweep(tmp_path, "study.sampler=grid", "study.n_trials=32", "study.confirm_top=2",
                  "compare.replicates=2", "study.confirm_replicates=2")
    winner = study.user_attrs["winner"]
    assert winner["params"] == {"max_num_seqs": best}
    assert surface[winner["params"]["max_num_seqs"]][1] == 0
    cheapest_overall = min(surface, key=lambda n: surface[n][0])
    assert surface[cheapest_overall][1] > 0, "the surface should tempt the search past the boundary"
    report = (tmp_path / "s" / "report.md").read_text()
    edge = max(n for n, (c, p) in surface.items() if p == 0)
    assert (f"preemption boundary: last clean max_num_seqs={edge} (0, 0 preemptions in 2 probes), first preempting "
            f"max_num_seqs={edge + 1}") in report
    assert f"the KV capacity the engine reported predicts the last clean max_num_seqs={edge}" in report
    assert (tmp_path / "s" / "history.png").exists() and (tmp_path / "s" / "cost_vs_max_num_seqs.png").exists()


def test_tpe_sweep_with_noise_reports_a_feasible_winner(tmp_path):
    study = sweep(tmp_path, "study.n_trials=10", "fake.noise_sd=0.02", "fake.drift_per_start=0.01")
    surface = truth()
    assert surface[study.user_attrs["winner"]["params"]["max_num_seqs"]][1] == 0
    for t in study.trials:  # every measured trial's preemption count is the fake's, which is deterministic
        if t.user_attrs.get("verdict") is not None:
            assert t.user_attrs["preemptions"] == surface[t.params["max_num_seqs"]][1]
            assert (t.user_attrs["constraints"][0] <= 0) == (surface[t.params["max_num_seqs"]][1] == 0)


def test_failed_trials_never_win(tmp_path):
    study = sweep(tmp_path, "study.sampler=grid", "study.n_trials=32", "+fake.fail_start_when.max_num_seqs=6",
                  "compare.replicates=2", "study.confirm_replicates=2", "study.boundary=none")
    failed = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL]
    assert failed and all(t.params["max_num_seqs"] > 6 for t in failed)
    assert all("refuses max_num_seqs" in t.user_attrs["reason"] for t in failed)
    assert study.user_attrs["winner"]["params"]["max_num_seqs"] <= 6


def test_probes_count_a_failing_start_as_infeasible_and_never_measure_past_it(tmp_path):
    study = sweep(tmp_path, "study.sampler=grid", "study.n_trials=32", "+fake.fail_start_when.max_num_seqs=6",
                  "compare.replicates=2", "study.confirm_replicates=2", name="p")
    (found,) = study.user_attrs["boundaries"]
    assert (found["last_clean"], found["first_preempting"], found["exact"]) == (6, 7, True)
    assert found["probes"]["7"] == [None, None]  # failed, twice
    measured = {t.params["max_num_seqs"] for t in study.trials if t.user_attrs.get("source") is None}
    assert measured and max(measured) <= 6
    assert study.user_attrs["winner"]["params"]["max_num_seqs"] <= 6


def test_export_writes_configs_and_export_mode_rebuilds_them(tmp_path):
    sweep(tmp_path, "study.n_trials=4", "space.max_num_seqs.low=2", "space.max_num_seqs.high=8", "compare.replicates=2",
          "study.confirm_replicates=2", "study.confirm_top=1")
    best = tmp_path / "s" / "best"
    yaml_text = (best / "vllm_config.yaml").read_text()
    (best / "vllm_config.yaml").unlink()
    cfg = compose_cfg("backend=fake", *WORK, "mode=export", "study.name=s", tmp_path=tmp_path)
    assert export_cmd.run(cfg, Console(quiet=True)) == 0
    assert (best / "vllm_config.yaml").read_text() == yaml_text
    assert "max-num-seqs:" in yaml_text and "disable-log-stats" not in yaml_text
    assert (best / "vllm_serve.sh").read_text().startswith("#!/usr/bin/env bash\nvllm serve ")
    assert json.loads((best / "best.json").read_text())["params"]["max_num_seqs"] >= 1


@pytest.mark.parametrize("override, message", [
    ("space.max_num_seqs.low=5000", r"space 'batching' .*max_num_seqs: low <= high must hold, but got \(low=5000"),
    ("+space.max_num_seq={type:int,low:1,high:4}", "unknown engine flag 'max_num_seq'"),
    ("space.max_num_batched_tokens.choices=[]", "max_num_batched_tokens.choices must be a non-empty list"),
    ("space.max_num_seqs.type=integer", "max_num_seqs.type must be one of int, float, categorical"),
    ("space.max_num_seqs.high=2.5", "max_num_seqs.high must be an integer"),
    ("study.sampler=cmaes", "study.sampler must be one of"),
    ("study.n_trials=0", "study.n_trials must be at least 1"),
])
def test_bad_space_fails_before_any_engine_starts_or_any_file_is_written(tmp_path, monkeypatch, override, message):
    """The whole configuration is checked at once (settings/sweep.load_sweep) before the command writes its
    results folder or opens its study: a bad key costs nothing and leaves nothing behind."""
    monkeypatch.setattr(FakeEngine, "start", lambda *a: pytest.fail("engine started"))
    cfg = compose_cfg("backend=fake", "+space=batching", override, tmp_path=tmp_path)
    with pytest.raises(ConfigError, match=message):
        sweep_cmd.run(cfg, Console(quiet=True))
    assert not list(tmp_path.iterdir())


WHOLE = 2 + 2  # replicates of one comparison: 2 per arm (each engine warms itself, unrecorded)


@pytest.mark.parametrize("overrides", [
    [], ["+space=batching"], ["+space=memory"], ["+space=scheduler"], ["+experiment=demo"], ["engine=gpu"],
    ["engine=gpu", "+space=gpu_memory"],
    ["workload=open_loop"],
])
def test_every_shipped_config_composes_and_passes_its_checks(overrides):
    from throttle_sweep.engines.fake import FAKE_FLAG_SCHEMA
    from throttle_sweep.settings.sections import plain, price_from, workload_from
    from throttle_sweep.sweep.space import build_space

    cfg = compose_cfg(*overrides)
    price_from(cfg)
    workload_from(cfg).check(max_model_len=cfg.engine.max_model_len)
    if cfg.space is not None:
        assert build_space(plain(cfg.space), FAKE_FLAG_SCHEMA, source="space")


def pareto_of(points):
    """StudyView.pareto on a study holding exactly these (ratio, p95 latency, feasible) trials."""
    from optuna.distributions import IntDistribution
    from optuna.trial import create_trial

    from throttle_sweep.cluster.pool import LocalPool
    from throttle_sweep.sweep.driver import Sweep
    from throttle_sweep.sweep.options import SweepSettings

    study = optuna.create_study(directions=["minimize", "minimize"])
    for i, (ratio, latency, ok) in enumerate(points):
        study.add_trial(create_trial(params={"max_num_seqs": i + 1}, distributions={"max_num_seqs":
                                     IntDistribution(1, 64)}, values=[ratio, latency],
                                     user_attrs={"constraints": [0.0 if ok else 3.0]}))
    sweep = Sweep(study=study, distributions={}, base_flags={}, baseline_flags={}, workload_key={},
                  pool=LocalPool(lambda *a: {}), write=lambda r: None, existing=[],
                  settings=SweepSettings(multi_objective=True))
    return [t.params["max_num_seqs"] - 1 for t in sweep.view.pareto()]


def test_pareto_front_keeps_trade_offs_drops_dominated_and_infeasible_points():
    points = [(0.50, 1.0, True),  # 0: cheapest feasible
              (0.60, 0.5, True),  # 1: dearer but faster: a trade-off, on the front
              (0.70, 0.6, True),  # 2: dominated by 1
              (0.40, 0.4, False),  # 3: beats everything but preempts: never on the front
              (0.90, 0.2, True)]  # 4: fastest
    assert pareto_of(points) == [0, 1, 4]


def test_multi_objective_sweep_reports_a_front_and_refuses_a_single_objective_resume(tmp_path):
    from optuna.trial import TrialState

    study = sweep(tmp_path, "study.sampler=grid", "study.n_trials=32", "compare.replicates=2",
                  "study.confirm_replicates=2", "study.multi_objective=true", name="mo")
    assert len(study.directions) == 2
    done = [t for t in study.trials if t.state == TrialState.COMPLETE and t.user_attrs["constraints"][0] <= 0]
    report = (tmp_path / "mo" / "report.md").read_text()
    assert "Pareto front of feasible trials" in report
    cheapest = min(done, key=lambda t: t.values[0])
    assert f"trial {cheapest.number:>3} max_num_seqs={cheapest.params['max_num_seqs']}" in report
    won = next(t for t in done if t.params == study.user_attrs["winner"]["params"])
    assert won.values[0] == pytest.approx(cheapest.values[0])  # the cheapest point of the front (or its tie)
    with pytest.raises(ConfigError, match="has 2 objective"):
        sweep(tmp_path, "study.sampler=grid", "study.n_trials=32", name="mo")


def test_the_study_opens_in_optuna_dashboard_with_verdicts_and_feasibility(tmp_path):
    from wsgiref.util import setup_testing_defaults

    from optuna_dashboard import wsgi

    sweep(tmp_path, "study.sampler=grid", "study.n_trials=4", "compare.replicates=2", "study.confirm_replicates=2",
          "study.confirm_top=1", name="dash")
    app = wsgi(f"sqlite:///{tmp_path / 'dash' / 'study.db'}")

    def get(path: str, query: str = "") -> dict:
        env: dict = {}
        setup_testing_defaults(env)
        env.update(PATH_INFO=path, QUERY_STRING=query)
        status: list[str] = []
        body = b"".join(app(env, lambda s, h, e=None: status.append(s)))
        assert status[0].startswith("200"), (path, status, body[:200])
        return json.loads(body)

    [summary] = get("/api/studies")["study_summaries"]
    assert summary["study_name"] == "dash"
    detail = get(f"/api/studies/{summary['study_id']}", "after=0")
    trials = [t for t in detail["trials"] if t["state"] == "Complete"]
    answered = [t for t in trials if {a["key"]: a["value"] for a in t["user_attrs"]}.get("source") in (None, "reference")]
    assert len(answered) == 4 and len(trials) > 4  # the preempting probes are trials too: infeasible ones
    for t in trials:
        attrs = {a["key"]: a["value"] for a in t["user_attrs"]}
        if attrs.get("source") == "probe":
            assert json.loads(attrs["constraints"])[0] > 0
            continue
        if attrs.get("source") == "reference":  # the search's yardstick: 1 exactly, feasible by its probes
            assert t["values"] == [1.0] and json.loads(attrs["constraints"]) == [0.0]
            continue
        assert attrs["verdict"] in ("CHEAPER", "PRICIER", "NO DIFFERENCE", "INCONCLUSIVE")
        assert json.loads(attrs["constraints"]) == [0.0 if int(attrs["preemptions"]) == 0 else
                                                    float(attrs["preemptions"])]  # feasibility, readable there


def test_a_latency_limit_is_a_constraint_like_preemption(tmp_path):
    from optuna.trial import TrialState

    limit = 0.006  # the fake's step time grows with the batch: only small max_num_seqs keep ITL under 6 ms
    study = sweep(tmp_path, "study.sampler=grid", "study.n_trials=32", "compare.replicates=2",
                  "study.confirm_replicates=2", "study.max_preemptions=1000", f"study.max_p95_itl_s={limit}",
                  name="itl")
    done = [t for t in study.trials if t.state == TrialState.COMPLETE]
    fast = [t for t in done if t.user_attrs["p95_itl_s"] <= limit]
    assert fast and len(fast) < len(done)
    for t in done:
        assert (t.user_attrs["constraints"][1] <= 0) == (t in fast)
        assert t.constraints["p95_itl_s"] == t.user_attrs["constraints"][1]  # Optuna's own record agrees
    winner = next(t for t in fast if t.params == study.user_attrs["winner"]["params"])
    assert winner.values[0] == pytest.approx(min(t.values[0] for t in fast))


class LosingPool(PoolBasics):
    """Two slots measuring on the fake engine; the node under slot 1 'dies' on its `lose_at`-th job (an
    infrastructure failure), after which slot 1 is retired, or every slot if `lose_all`."""

    def __init__(self, lose_at: int, lose_all: bool = False) -> None:
        from throttle_sweep.measurement.replicate import failed_record, record_header

        self.engine, self.spec = FakeEngine(FakeKnobs()), WorkloadSpec(num_requests=8, prompt_len=16, output_len=16,
                                                                      concurrency=8, warmup_requests=0)
        self.slots, self.size, self.queue, self.jobs_on_1 = [0, 1], 2, [], 0
        self.lose_at, self.lose_all = lose_at, lose_all
        self._header, self._failed = record_header, failed_record

    def submit(self, job):
        self.queue.append(job)

    def wait(self):
        job = self.queue.pop(0)
        context = {**job.context, "slot": f"s{job.slot}"}
        if job.slot == 1:
            self.jobs_on_1 += 1
            if self.jobs_on_1 == self.lose_at:
                self.slots = [] if self.lose_all else [0]
                header = self._header(self.engine, job.flags, self.spec, Price(), run_id="t", arm=job.arm,
                                      position=job.position, context=context)
                return [(job, self._failed(header, "node died", infrastructure=True))]
        return [(job, measure_replicate(self.engine, job.flags, self.spec, Price(), run_id="t", arm=job.arm,
                                        position=job.position, environment={}, context=context))]

    def close(self):
        pass


def losing_sweep(pool):
    from throttle_sweep.sweep.driver import Sweep
    from throttle_sweep.sweep.options import SweepSettings

    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for n in (2, 3, 4, 5):
        study.enqueue_trial({"max_num_seqs": n})
    written = []
    sweep = Sweep(study=study, distributions={"max_num_seqs": optuna.distributions.IntDistribution(1, 8)},
                  base_flags={"max_model_len": 1024}, baseline_flags={"max_model_len": 1024, "max_num_seqs": 1},
                  workload_key={}, pool=pool, write=written.append, existing=[],
                  settings=SweepSettings(n_trials=4, replicates=2, confirm_top=1, confirm_replicates=2))
    return sweep, written


def test_a_comparison_whose_slot_is_lost_starts_again_on_a_live_slot_and_nothing_is_lost():
    from optuna.trial import TrialState

    sweep, written = losing_sweep(LosingPool(lose_at=2))
    result = sweep.run()
    lost = [r for r in written if r.get("infrastructure")]
    assert len(lost) == 1 and lost[0] in written  # the lost replicate is recorded, not dropped
    [hit] = [t for t in result.study.trials if lost[0]["comparison"] in t.user_attrs.get("discarded_comparisons", [])]
    assert hit.state == TrialState.COMPLETE and hit.user_attrs.get("blame") is None  # the candidate is not blamed
    redo = [r for r in written if r["comparison"] == hit.user_attrs["comparison"]]
    assert len(redo) == WHOLE and {r["key"] for r in redo} == {f"trial-{hit.number}~1"} and {r["slot"] for r in redo} == {"s0"}
    assert {r["slot"] for r in written if r["started_at"] > lost[0]["ended_at"]} == {"s0"}
    assert sum(t.state == TrialState.COMPLETE for t in result.study.trials) == 4 and result.winner is not None


def test_losing_every_slot_stops_the_sweep_with_everything_measured_kept():
    from throttle_sweep.sweep.runner import NoSlotsLeft

    sweep, written = losing_sweep(LosingPool(lose_at=2, lose_all=True))
    with pytest.raises(NoSlotsLeft, match="run the same command again"):
        sweep.run()
    assert written and sweep.runner.records == written


def test_a_failed_replicate_keeps_the_sweep_stage_it_belongs_to_and_says_where_it_failed(tmp_path):
    """A record's `stage` is the sweep's (probe, search, confirm); where a run failed is `failed_at` (start,
    run): a failure must not overwrite which part of the sweep its record belongs to."""
    sweep(tmp_path, "study.n_trials=4", "study.sampler=grid", "+fake.fail_start_when.max_num_seqs=12", name="f")
    records = read_records(tmp_path / "f" / "replicates.jsonl")
    failed = [r for r in records if r["status"] == "failed"]
    assert failed and all(r["stage"] in ("probe", "search", "confirm") for r in records)
    assert all(r["failed_at"] == "start" and "max_num_seqs" in r["reason"] for r in failed)
    assert all("failed_at" not in r for r in records if r["status"] == "ok")


def test_max_num_seqs_above_what_the_workload_keeps_in_flight_is_not_searched(tmp_path):
    """A closed loop with 8 in flight runs at most 8 at once: max_num_seqs 9..64 are all the 8 engine (they
    can only cost memory), so the sweep searches 1..8, says so, and never probes or measures above it."""
    cfg = compose_cfg("backend=fake", "workload.num_requests=16", "workload.prompt_len=16", "workload.output_len=48",
                      "workload.concurrency=8", "workload.warmup_requests=0", "+space=batching",
                      "space.max_num_seqs.high=64", "~space.max_num_batched_tokens", "study.name=clip",
                      "study.n_trials=3", "study.confirm_top=1", "plots=false", tmp_path=tmp_path)
    console = Console(record=True, width=400)
    assert sweep_cmd.run(cfg, console) == 0
    said = console.export_text()
    assert "searched up to max_num_seqs=8" in said, said
    study = optuna.load_study(study_name="clip", storage=f"sqlite:///{tmp_path / 'clip' / 'study.db'}")
    assert all(t.distributions["max_num_seqs"].high == 8 for t in study.trials if t.distributions)
    seqs = [r["flags"].get("max_num_seqs") for r in read_records(tmp_path / "clip" / "replicates.jsonl")]
    assert max(seqs) == 8 and len(seqs) > 3


@pytest.mark.parametrize("entry", ["{type: int, low: 16, high: 64}", "{type: categorical, choices: [16, 32]}"])
def test_a_max_num_seqs_range_wholly_above_the_work_in_flight_is_refused_before_any_work(tmp_path, entry):
    cfg = compose_cfg("backend=fake", "workload.num_requests=16", "workload.concurrency=8", "+space=batching",
                      "~space.max_num_seqs", f"+space.max_num_seqs={entry}", "study.name=above", tmp_path=tmp_path)
    with pytest.raises(ConfigError, match=r"max_num_seqs.*above the 8 requests"):
        sweep_cmd.run(cfg, Console(quiet=True))
    assert not (tmp_path / "above" / "replicates.jsonl").exists()


def test_a_single_max_num_seqs_value_is_left_as_it_is_whatever_the_work_in_flight():
    from optuna.distributions import CategoricalDistribution, IntDistribution

    from throttle_sweep.sweep.space import within_in_flight

    for dist in (CategoricalDistribution([32]), IntDistribution(32, 32)):
        assert within_in_flight({"max_num_seqs": dist}, 8, source="s") == ({"max_num_seqs": dist}, None)
    clipped, note = within_in_flight({"max_num_seqs": IntDistribution(2, 62, step=4)}, 8, source="s")
    assert clipped["max_num_seqs"].high == 10 and "up to max_num_seqs=10" in note  # 2, 6, 10: 10 runs all 8


def test_a_sweep_whose_budget_ran_out_before_any_comparison_says_it_stopped_before_an_answer(tmp_path):
    """study.timeout_s spent before the search compared anything: no candidate was measured, so "none was
    confirmed cheaper" would be an answer where nothing was measured (#47)."""
    console = Console(record=True, width=250)
    code = sweep_cmd.run(compose_cfg("backend=fake", *WORK, *SPACE, "study.boundary=none", "study.timeout_s=0.001",
                                     "study.name=late", "plots=false", tmp_path=tmp_path), console)
    said = console.export_text()
    assert code != 0, said
    assert "no candidate was confirmed cheaper" not in said
    assert "stopped before an answer" in said and "study.timeout_s" in said
    assert "stopped before an answer" in (tmp_path / "late" / "report.md").read_text()
    assert not (tmp_path / "late" / "best").exists()
