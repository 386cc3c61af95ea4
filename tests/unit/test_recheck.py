"""mode=recheck on the fake engine: the exported winner re-measured against its baseline; exit 0 while the saving
holds, 1 when it no longer does, and every input error or setup difference refused (exit 2) before any run."""

from __future__ import annotations

import io
import json
import shutil
from types import SimpleNamespace

import pytest
import yaml
from rich.console import Console

from tests.helpers import compose_cfg, deploy
from throttle_sweep.commands import recheck as recheck_cmd
from throttle_sweep.commands.export import export_winner
from throttle_sweep.errors import ConfigError
from throttle_sweep.settings.sections import measured_sections, workload_from

WORK = ["workload.num_requests=24", "workload.output_len=32"]
MEASURED_ON = {"engine": "fake", "vllm_version": "0.30.0", "torch_version": "2.9.0", "driver_version": None,
               "device": "fake", "device_name": "fake"}


def fake_study(tmp_path, name="s", *, measured_on=None):
    """A finished study of the fake engine as a sweep leaves it: its folder, records and best/ export
    (max_num_seqs=8 confirmed at 0.3 of the baseline max_num_seqs=1)."""
    out = tmp_path / name
    out.mkdir()
    cfg = compose_cfg("backend=fake", *WORK)
    measured = measured_sections(cfg, workload_from(cfg))
    (out / "config.yaml").write_text(yaml.safe_dump({"mode": "sweep", "backend": "fake"}))
    winner = {"params": {"max_num_seqs": 8}, "ratio": 0.3, "ci": [0.25, 0.36], "trial": 3}
    record = {"schema_version": "1.1", "record_id": "r", "run_id": name, "flags": {"max_num_seqs": 8}, "position": 1,
              "status": "ok", "stage": "confirm", "trial": 3, "arm": "candidate",
              "environment": {**(measured_on or MEASURED_ON), "host": "h", "cpu_count": 2}}
    (out / "replicates.jsonl").write_text(json.dumps(record) + "\n")
    export_winner(SimpleNamespace(study_name=name, user_attrs={**measured, "winner": winner}), out)
    return out


def recheck(tmp_path, *overrides):
    text = io.StringIO()
    cfg = compose_cfg("mode=recheck", "fake.noise_sd=0.02", *overrides, tmp_path=tmp_path)
    code = recheck_cmd.run(cfg, Console(file=text, width=400, soft_wrap=True))
    return code, text.getvalue()


def test_a_saving_that_still_holds_exits_0_with_records_of_its_own_and_the_versions_side_by_side(tmp_path):
    out = fake_study(tmp_path)
    before = (out / "replicates.jsonl").read_text()
    code, said = recheck(tmp_path, "study.name=s")
    assert code == 0, said
    (folder,) = out.glob("recheck-*")
    records = [json.loads(line) for line in (folder / "replicates.jsonl").read_text().splitlines()]
    assert {r["arm"] for r in records} == {"baseline", "candidate"} and len(records) == 8
    assert {r["flags"]["max_num_seqs"] for r in records} == {1, 8}
    assert all(r["recheck"] == {"study": "s", "best": str(out / "best")} for r in records)
    assert (out / "replicates.jsonl").read_text() == before  # the study's records are not touched
    assert "vLLM 0.30.0 then, - now" in said and "device fake then, fake now" in said
    (verdict,) = [line for line in said.splitlines() if line.startswith("recheck:")]
    assert sum(line.startswith("report:") for line in said.splitlines()) == 1, said  # the page, once, at the end
    assert "HOLDS" in verdict and "ratio 0.300 [0.250, 0.360]" in verdict and "CHEAPER" in verdict


def test_the_baselines_flags_deployed_as_the_winner_exit_1_naming_the_regression(tmp_path):
    out = fake_study(tmp_path)
    worse = tmp_path / "deployed"
    shutil.copytree(out / "best", worse)
    deploy(worse, max_num_seqs=1)
    code, said = recheck(tmp_path, f"recheck.best={worse}", "run=worse")
    assert code == 1, said
    (verdict,) = [line for line in said.splitlines() if line.startswith("recheck:")]
    assert "NO LONGER HOLDS" in verdict and "max_num_seqs=1" in verdict and "ratio 0.300 [0.250, 0.360]" in verdict
    assert "not shown cheaper than the baseline any more: ratio " in verdict  # measured, not withheld
    summary = json.loads((tmp_path / "worse" / "summary.json").read_text())
    assert summary["verdict"] in ("NO DIFFERENCE", "INCONCLUSIVE") and 0.9 < summary["ratio"] < 1.1
    assert (tmp_path / "worse" / "replicates.jsonl").is_file()


@pytest.mark.parametrize(("overrides", "words"), [
    ([], "needs study.name=NAME or recheck.best=PATH"),
    (["study.name=missing"], "study.name='missing': no study folder"),
    (["study.name=s", "recheck.best=elsewhere"], "one of study.name or recheck.best"),
    (["recheck.best=nowhere"], "recheck.best='nowhere': no such folder"),
    (["study.name=s", "candidate.max_num_seqs=3"], "candidate.max_num_seqs=3 has no place on its command line"),
])
def test_a_recheck_of_nothing_says_what_is_missing(tmp_path, overrides, words):
    fake_study(tmp_path)
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(".", r"\.")):
        recheck(tmp_path, *overrides)


@pytest.mark.parametrize(("remove", "words"), [
    ("best", "holds no best/ export"),
    ("best/vllm_config.yaml", "no vllm_config.yaml"),
    ("best/best.json", "no best.json"),
])
def test_a_study_without_a_whole_export_is_refused_naming_the_file(tmp_path, remove, words):
    out = fake_study(tmp_path)
    target = out / remove
    shutil.rmtree(target) if target.is_dir() else target.unlink()
    with pytest.raises(ConfigError, match=words):
        recheck(tmp_path, "study.name=s")
    assert not list(out.glob("recheck-*"))


def test_an_unreadable_export_is_refused_naming_the_file(tmp_path):
    out = fake_study(tmp_path)
    (out / "best" / "best.json").write_text("{not json")
    with pytest.raises(ConfigError, match="best.json"):
        recheck(tmp_path, "study.name=s")


def test_a_command_line_that_changes_the_experiment_is_a_setup_difference_named_by_key(tmp_path):
    fake_study(tmp_path)
    with pytest.raises(ConfigError, match=r"setup differs.*workload\.num_requests \(command line\): 24 then, 8 now"):
        recheck(tmp_path, "study.name=s", "workload.num_requests=8")


def test_a_deployed_flag_not_under_test_that_differs_is_a_setup_difference(tmp_path):
    out = fake_study(tmp_path)
    deploy(out / "best", max_model_len=512)
    with pytest.raises(ConfigError, match=r"setup differs.*max_model_len \(vllm_config.yaml, not under test\): 1024 then, 512 now"):
        recheck(tmp_path, "study.name=s")


def test_another_device_kind_is_a_setup_difference_but_other_versions_are_not(tmp_path):
    fake_study(tmp_path, "gpu", measured_on={**MEASURED_ON, "device": "cuda", "device_name": "NVIDIA H100"})
    with pytest.raises(ConfigError, match=r"setup differs.*device \(this machine\): 'cuda' then, 'fake' now"):
        recheck(tmp_path, "study.name=gpu")


def test_the_driver_version_is_read_through_nvml_and_is_none_without_a_driver():
    from throttle_sweep.engines.gpu_found import nvml_reading

    module = SimpleNamespace(nvmlInit=lambda: None, nvmlShutdown=lambda: None,
                             nvmlSystemGetDriverVersion=lambda: b"570.86.15")
    assert nvml_reading(lambda m: m.nvmlSystemGetDriverVersion(), nvml=lambda: module) == "570.86.15"

    def no_library():
        raise ImportError("no NVML")

    assert nvml_reading(lambda m: m.nvmlSystemGetDriverVersion(), nvml=no_library) is None


def test_an_interrupted_recheck_exits_130_keeping_its_replicates_and_runs_again_under_its_name(tmp_path,
                                                                                              monkeypatch):
    from throttle_sweep.cluster.slot import WarmSlot
    from throttle_sweep.store.records import read_records

    out = fake_study(tmp_path)
    real_measure, calls = WarmSlot.measure, []

    def measure(self, *args):
        calls.append(args)
        if len(calls) == 4:
            raise KeyboardInterrupt  # Ctrl-C during the 4th replicate
        return real_measure(self, *args)

    monkeypatch.setattr(WarmSlot, "measure", measure)
    assert recheck(tmp_path, "study.name=s", "run=again")[0] == 130
    before = read_records(out / "again" / "replicates.jsonl")
    assert len(before) == 3
    monkeypatch.setattr(WarmSlot, "measure", real_measure)
    assert recheck(tmp_path, "study.name=s", "run=again")[0] == 0
    assert read_records(out / "again" / "replicates.jsonl")[:3] == before  # nothing lost


def test_an_older_export_is_read_with_the_study_beside_it_and_refused_when_that_is_not_its_study(tmp_path):
    import optuna

    out = fake_study(tmp_path)
    summary = json.loads((out / "best" / "best.json").read_text())
    for key in ("backend", "engine", "cost", "measured_with"):  # as an export before mode=recheck wrote it
        summary.pop(key)
    (out / "best" / "best.json").write_text(json.dumps(summary))
    with pytest.raises(ConfigError, match="no study.db is beside it"):
        recheck(tmp_path, "study.name=s")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optuna.create_study(study_name="other", storage=f"sqlite:///{out / 'study.db'}")
    with pytest.raises(ConfigError, match="names study 's', which .* does not hold"):
        recheck(tmp_path, "study.name=s")
