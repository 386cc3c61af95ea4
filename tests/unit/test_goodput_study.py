"""The goodput sweep honours the study's settings (#47): the configured sampler proposes its trials, a
persistent study at study.storage resumes it (its trials are not proposed again, its records are read again),
study.budget_usd and study.timeout_s stop it before a new trial, and compare.alpha is its confirmation's
family-wise alpha."""

from __future__ import annotations

import json
import shutil

import optuna
import pytest
from rich.console import Console

from tests.helpers import compose_cfg
from throttle_sweep.commands import export as export_cmd
from throttle_sweep.commands import goodput as goodput_cmd
from throttle_sweep.commands import sweep as sweep_cmd
from throttle_sweep.errors import ConfigError
from throttle_sweep.store.records import read_records

# a goodput sweep on the fake engine: a second or two a trial
TINY = ("backend=fake", "+space=batching", "study.objective=goodput", "workload=open_loop", "workload.num_requests=40",
        "workload.output_len=16", "capacity.run_s=2", "capacity.knee_rates=3", "capacity.knee_replicates=4",
        "slo.p95_ttft_s=0.2", "slo.p95_tpot_s=0.05", "space.max_num_seqs.high=16",
        "space.max_num_batched_tokens.choices=[2048]", "study.n_trials=1", "study.confirm_top=1", "plots=false",
        "study.name=g")


def run(tmp_path, *args) -> tuple[int, str]:
    console = Console(record=True, width=250)
    code = sweep_cmd.run(compose_cfg(*TINY, *args, tmp_path=tmp_path), console)
    return code, console.export_text()


def proposals(folder) -> list[dict]:
    """The params of every configuration the screen measured, in the order proposed."""
    return [s["params"] for s in json.loads((folder / "summary.json").read_text())["screen"][1:]]


def test_the_configured_sampler_proposes_the_trials(tmp_path):
    # TPE's first trials are its random sampler's, on the same seed: they part after its 3 start-up trials
    code, said = run(tmp_path / "tpe", "study.n_trials=5")
    assert code in (0, 1), said
    code, said = run(tmp_path / "random", "study.n_trials=5", "study.sampler=random")
    assert code in (0, 1), said
    tpe, random = proposals(tmp_path / "tpe" / "g"), proposals(tmp_path / "random" / "g")
    assert tpe[:1] == random[:1] and tpe != random


def test_a_persistent_study_holds_the_trials_and_a_resume_goes_on_from_it(tmp_path, monkeypatch):
    storage = f"sqlite:///{tmp_path / 'goodput.db'}"
    measure, calls = goodput_cmd.measure_rate, []

    def cut_short(*args, **kwargs):  # Ctrl-C in trial 1's rate search, after two of its runs
        calls.append(args[3]["config"])
        if calls.count("trial 1") > 2:
            raise KeyboardInterrupt
        return measure(*args, **kwargs)

    monkeypatch.setattr(goodput_cmd, "measure_rate", cut_short)
    code, said = run(tmp_path, "study.n_trials=2", f"study.storage={storage}")
    assert code == 130, said
    assert f"study: {storage}" in said
    assert (tmp_path / "goodput.db").is_file()
    study = optuna.load_study(study_name="g", storage=storage)
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.RUNNING]
    first = study.trials[0]
    assert first.value > 0 and first.user_attrs["config"] == "trial 0" and first.user_attrs["capacity_rps"] > 0
    before = read_records(tmp_path / "g" / "replicates.jsonl")
    interrupted = study.trials[1].params

    monkeypatch.setattr(goodput_cmd, "measure_rate", measure)
    code, said = run(tmp_path, "study.n_trials=3", f"study.storage={storage}")
    assert code in (0, 1), said
    study = optuna.load_study(study_name="g", storage=storage)
    assert len(study.trials) == 3 and all(t.state.is_finished() for t in study.trials)
    assert study.trials[1].params == interrupted  # taken over, not proposed again
    after = read_records(tmp_path / "g" / "replicates.jsonl")
    assert after[: len(before)] == before
    # nothing measured is run again: trial 0's runs are the first run's, trial 1's go on from its two
    assert sum(r.get("config") == "trial 0" and r.get("stage") == "goodput-screen" for r in after) == \
        sum(r.get("config") == "trial 0" and r.get("stage") == "goodput-screen" for r in before)
    assert [r["workload"]["rate"] for r in after if r.get("config") == "trial 1"][:2] == \
        [r["workload"]["rate"] for r in before if r.get("config") == "trial 1"]
    summary = json.loads((tmp_path / "g" / "summary.json").read_text())
    assert [s["params"] for s in summary["screen"][1:]] == [t.params for t in study.trials][: len(summary["screen"]) - 1]
    # its export is best/, whatever study.storage holds: mode=export names it, never reads the study as a cost sweep's
    with pytest.raises(ConfigError, match=r"goodput sweep.*best"):
        export_cmd.run(compose_cfg("mode=export", "study.name=g", f"study.storage={storage}", tmp_path=tmp_path),
                       Console())


def test_without_a_storage_the_study_is_in_memory_and_no_study_file_is_written(tmp_path):
    code, said = run(tmp_path)
    assert code in (0, 1), said
    assert not list((tmp_path / "g").glob("*.db")) and "study:" not in said


@pytest.mark.parametrize(("setting", "words"), [("study.budget_usd=0.0000001", "dollar budget spent"),
                                                ("study.timeout_s=0.001", "wall-time budget")])
def test_a_spent_budget_stops_the_sweep_before_a_new_trial_and_before_an_answer(tmp_path, setting, words):
    code, said = run(tmp_path, "study.n_trials=3", setting)
    assert code == 3, said
    line = next(x for x in said.splitlines() if x.startswith("screen: stops here"))
    assert words in line
    assert "stopped before an answer" in said and "run the same command again" in said
    records = read_records(tmp_path / "g" / "replicates.jsonl")
    assert records and {r["config"] for r in records} == {"baseline"}  # kept; no trial started
    assert not (tmp_path / "g" / "best").exists()


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    folder = tmp_path_factory.mktemp("swept")
    code, said = run(folder)
    assert code in (0, 1), said
    return folder


def test_compare_alpha_is_the_confirmations_family_wise_alpha(swept, tmp_path):
    shutil.copytree(swept / "g", tmp_path / "g")
    records = len(read_records(tmp_path / "g" / "replicates.jsonl"))
    at_05 = json.loads((tmp_path / "g" / "summary.json").read_text())["confirmed"]
    code, said = run(tmp_path, "compare.alpha=0.5")
    assert code in (0, 1), said
    assert len(read_records(tmp_path / "g" / "replicates.jsonl")) == records  # read again, not measured again
    at_50 = json.loads((tmp_path / "g" / "summary.json").read_text())["confirmed"]
    assert "50% intervals adjusted for 2 configurations" in said

    def width(c):
        low, high = c["capacity_ci"]
        return (high if high is not None else 1e9) - (low or 0)

    assert all(width(b) <= width(a) for a, b in zip(at_05, at_50, strict=True))
    assert any(width(b) < width(a) for a, b in zip(at_05, at_50, strict=True))


def test_a_grid_study_measures_the_grid_points_in_their_seeded_order(tmp_path):
    from throttle_sweep.settings.goodput import load_goodput

    points = load_goodput(compose_cfg(*TINY, "study.sampler=grid", tmp_path=tmp_path)).grid
    code, said = run(tmp_path, "study.n_trials=3", "study.sampler=grid")
    assert code in (0, 1), said
    assert proposals(tmp_path / "g") == points[:3]


def test_a_storage_holding_a_cost_sweeps_study_of_that_name_is_refused_before_any_engine_starts(tmp_path):
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    optuna.create_study(study_name="g", storage=storage).add_trial(optuna.trial.create_trial(value=1.0))
    with pytest.raises(ConfigError, match=r"study 'g' in .*shared\.db holds another sweep's trials"):
        run(tmp_path, f"study.storage={storage}")
    assert not (tmp_path / "g" / "replicates.jsonl").exists()
