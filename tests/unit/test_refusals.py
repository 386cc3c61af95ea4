"""Flags the engine refuses at start (vLLM: max_num_batched_tokens below max_num_seqs) are decided before any
start: never run, told to the study as refused, not as preempting, and named by the report apart from the
preemption boundary. On the fake engine, which refuses what vLLM refuses here."""

from __future__ import annotations

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, IntDistribution
from rich.console import Console

from tests.helpers import FakeOneSlot, compose_cfg
from throttle_sweep.commands import measure as measure_cmd
from throttle_sweep.commands import sweep as sweep_cmd
from throttle_sweep.engines import FakeEngine
from throttle_sweep.engines.base import engine_refusal
from throttle_sweep.errors import ConfigError, EngineStartError
from throttle_sweep.measurement.cost import Price
from throttle_sweep.measurement.workload import WorkloadSpec
from throttle_sweep.sweep.driver import Sweep
from throttle_sweep.sweep.options import SweepSettings
from throttle_sweep.sweep.report import lines

SPEC = WorkloadSpec(num_requests=8, prompt_len=16, output_len=8, concurrency=8, warmup_requests=0)
SPACE = {"max_num_seqs": IntDistribution(1, 2048, log=True),
         "max_num_batched_tokens": CategoricalDistribution([1024, 2048, 4096])}


class CountingFake(FakeEngine):
    """The fake engine, keeping the flags of every start it was asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.started: list[dict] = []

    def start(self, flags):
        self.started.append(dict(flags))
        return super().start(flags)


def refused_started(engine: CountingFake) -> list[dict]:
    return [f for f in engine.started if f.get("max_num_batched_tokens", 8192) < f.get("max_num_seqs", 1)]


def test_the_fake_engine_says_what_it_refuses_before_a_start_and_a_start_of_it_raises_the_same():
    engine = FakeEngine()
    why = engine.refusal({"max_num_seqs": 2048, "max_num_batched_tokens": 1024})
    assert why is not None and "max_num_batched_tokens (1024)" in why and "max_num_seqs (2048)" in why
    assert engine.refusal({"max_num_seqs": 256, "max_num_batched_tokens": 2048}) is None
    with pytest.raises(EngineStartError, match="max_num_seqs \\(2048\\)"):
        engine.start({"max_num_seqs": 2048, "max_num_batched_tokens": 1024})
    assert engine_refusal(object(), {"max_num_seqs": 2048, "max_num_batched_tokens": 1024}) is None  # none to ask


def test_a_sweep_never_starts_a_refused_combination_and_reports_it_apart_from_the_preemption_boundary():
    """#45: max_num_batched_tokens=1024 with max_num_seqs 1025-2048 used to reach the engine, fail to start,
    count as preempting, and be bisected into a 'boundary' at 1024/1025."""
    pool = FakeOneSlot(SPEC)
    pool.engine = engine = CountingFake()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    study.enqueue_trial({"max_num_seqs": 1500, "max_num_batched_tokens": 1024})  # refused: the first proposal
    sweep = Sweep(study=study, distributions=SPACE, base_flags={}, baseline_flags={"max_num_seqs": 1},
                  workload_key={}, pool=pool, write=lambda r: None, existing=[],
                  settings=SweepSettings(boundary_knob="max_num_seqs", n_trials=3, replicates=2, confirm_top=1,
                                         confirm_replicates=2, tiebreak_replicates=0),
                  refusal=engine.refusal)
    result = sweep.run()
    assert engine.started and not refused_started(engine), refused_started(engine)[:3]
    found = {b["others"]["max_num_batched_tokens"]: b for b in study.user_attrs["boundaries"]}
    assert found[1024]["high"] == 1024 and found[1024]["first_preempting"] is None, found[1024]
    assert all(b["first_preempting"] is None for b in found.values())  # nothing preempts this work
    (told,) = [t for t in study.trials if t.params == {"max_num_seqs": 1500, "max_num_batched_tokens": 1024}]
    assert told.state == optuna.trial.TrialState.COMPLETE and told.user_attrs["source"] == "refused"
    assert "max_num_seqs (1500)" in told.user_attrs["reason"] and "preemptions" not in told.user_attrs
    assert dict(zip(told.user_attrs["constraint_names"], told.user_attrs["constraints"], strict=True)) == {
        "refused": 1.0}
    text = "\n".join(lines(result, Price(), 0))
    assert "refused by vLLM: max_num_batched_tokens=1024 with max_num_seqs 1025-2048: " in text, text
    assert "1025" not in "\n".join(line for line in text.splitlines() if "preemption boundary" in line)
    assert "with preemption allowed" not in text  # a refused point is no preempting one


def test_measure_and_compare_refuse_a_refused_arm_before_any_engine_starts(tmp_path, monkeypatch):
    monkeypatch.setattr(FakeEngine, "start", lambda *a: pytest.fail("an engine started"))
    cfg = compose_cfg("backend=fake", "mode=measure", "engine.max_num_seqs=64",
                      "engine.max_num_batched_tokens=32", tmp_path=tmp_path)
    with pytest.raises(ConfigError) as refused:
        measure_cmd.run(cfg, Console(quiet=True))
    assert "engine" in str(refused.value) and "max_num_seqs (64)" in str(refused.value)
    assert "refuse" in str(refused.value)
    from throttle_sweep.settings.compare import load_compare

    cfg = compose_cfg("backend=fake", "mode=compare", "candidate.max_num_seqs=64",
                      "candidate.max_num_batched_tokens=32", tmp_path=tmp_path)
    with pytest.raises(ConfigError, match="candidate: .*max_num_batched_tokens=32.*max_num_seqs \\(64\\)"):
        load_compare(cfg)


def test_the_sweep_command_asks_its_engine_and_its_report_names_the_refusal(tmp_path, monkeypatch):
    started = []
    start = FakeEngine.start
    monkeypatch.setattr(FakeEngine, "start", lambda self, flags: started.append(dict(flags)) or start(self, flags))
    cfg = compose_cfg("backend=fake", "workload.num_requests=64", "workload.concurrency=64", "workload.prompt_len=16",
                      "workload.output_len=8", "workload.warmup_requests=0", "+space=batching",
                      "space.max_num_seqs.high=64", "space.max_num_batched_tokens.choices=[32,2048]",
                      "study.name=refused", "study.n_trials=3", "compare.replicates=2", "study.confirm_replicates=2",
                      "study.confirm_top=1", "plots=false", tmp_path=tmp_path)
    assert sweep_cmd.run(cfg, Console(quiet=True)) == 0
    assert started and not [f for f in started if f.get("max_num_batched_tokens", 8192) < f.get("max_num_seqs", 1)]
    report = (tmp_path / "refused" / "report.md").read_text()
    assert "refused by vLLM: max_num_batched_tokens=32 with max_num_seqs 33-64: SchedulerConfig: " in report


def test_a_knob_of_thousands_of_values_is_asked_at_samples_and_bisected_to_each_edge_exactly():
    from throttle_sweep.sweep.refusals import SAMPLES, sampled_reasons

    values = list(range(1, 2049))
    asked = []

    def ask(value: int) -> str | None:
        asked.append(value)
        return "too many" if value > 1024 or 300 <= value <= 340 else None

    reasons = sampled_reasons(values, ask)
    assert [v for v in values if reasons[v]] == [*range(300, 341), *range(1025, 2049)]
    assert len(asked) < SAMPLES + 3 * 12 and len(set(asked)) == len(asked)  # never all 2048, never twice
