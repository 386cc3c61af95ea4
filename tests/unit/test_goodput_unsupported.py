"""What the goodput sweep does not do yet is said, never silently skipped (#47): mode=export and mode=analyze
of its folder say what the folder holds and what to do, with a non-zero exit. (The study settings it honours:
tests/unit/test_goodput_study.py.)"""

from __future__ import annotations

import shutil

import pytest
from rich.console import Console

from tests.helpers import compose_cfg
from throttle_sweep.commands import analyze as analyze_cmd
from throttle_sweep.commands import export as export_cmd
from throttle_sweep.commands import sweep as sweep_cmd
from throttle_sweep.errors import ConfigError

# a goodput sweep of one trial on the fake engine: a few seconds
TINY = ("backend=fake", "+space=batching", "study.objective=goodput", "workload=open_loop", "workload.num_requests=40",
        "workload.output_len=16", "capacity.run_s=2", "capacity.knee_rates=3", "capacity.knee_replicates=4",
        "slo.p95_ttft_s=0.2", "slo.p95_tpot_s=0.05", "space.max_num_seqs.high=16",
        "space.max_num_batched_tokens.choices=[2048]", "study.n_trials=1", "study.confirm_top=1", "plots=false",
        "study.name=g")


def run(command, tmp_path, *args) -> tuple[int, str]:
    console = Console(record=True, width=250)
    code = command.run(compose_cfg(*args, tmp_path=tmp_path), console)
    return code, console.export_text()


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """A goodput sweep's folder, with its records, summary and best/ export (no study.db: its study is in memory)."""
    folder = tmp_path_factory.mktemp("swept")
    code, said = run(sweep_cmd, folder, *TINY)
    assert code == 0 and (folder / "g" / "best" / "vllm_config.yaml").is_file(), said
    return folder


def test_export_of_a_goodput_sweep_names_its_best_folder_instead_of_no_study(swept, tmp_path):
    shutil.copytree(swept / "g", tmp_path / "g")
    with pytest.raises(ConfigError) as refused:
        run(export_cmd, tmp_path, "mode=export", "study.name=g")
    said = str(refused.value)
    assert "goodput sweep" in said and "no study at" not in said
    assert str(tmp_path / "g" / "best") in said and "vllm_config.yaml" in said
    shutil.rmtree(tmp_path / "g" / "best")  # a sweep that has confirmed no winner (yet): no export to name
    with pytest.raises(ConfigError, match=r"goodput sweep.*no best/ folder.*run the sweep's command again"):
        run(export_cmd, tmp_path, "mode=export", "study.name=g")


def test_analyze_of_goodput_records_says_they_are_not_recomputed_and_fails(swept, tmp_path):
    code, said = run(analyze_cmd, tmp_path, "mode=analyze", f"input={swept / 'g' / 'replicates.jsonl'}")
    assert code != 0, said
    assert "goodput sweep" in said and "mode=analyze does not recompute" in said
    assert str(swept / "g" / "summary.json") in said
