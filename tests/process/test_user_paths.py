"""The README's user paths as a user runs them: the real command line, in its own process, on the fake
engine. Each test is one way a command could give a wrong answer without saying so."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import yaml

from tests.helpers import default_sigint

ROOT = Path(__file__).resolve().parents[2]
# the demo's study on the fake engine, kept short: its folder, engine and workload are the demo's own
DEMO = ["backend=fake", "+experiment=demo", "study.n_trials=2", "slots=1"]


def cli(cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "throttle_sweep", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def ok(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def refused(done: subprocess.CompletedProcess) -> str:
    """A refusal is the tool's own one-line error (exit 2), never a traceback."""
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    return " ".join((done.stdout + done.stderr).split())


def files(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(folder.iterdir())}


def test_export_serves_what_the_study_measured_whatever_the_command_line_composes(tmp_path):
    first = cli(tmp_path, *DEMO)
    ok(first)
    assert "A new study created" not in first.stderr  # Optuna's log lines are not the tool's output
    best = tmp_path / "results" / "demo" / "best"
    before = files(best)
    served = yaml.safe_load(before["vllm_config.yaml"])
    assert served["kv-cache-memory-bytes"] == 2097152 and served["max-model-len"] == 256  # the demo's engine

    ok(cli(tmp_path, "mode=export", "study.name=demo"))  # as the README writes it: no +experiment, no backend
    assert files(best) == before  # the same winner, the same engine: nothing rewritten
    assert not list(best.parent.glob("best.superseded-*"))
    ok(cli(tmp_path, "mode=export", "study.name=demo", "+experiment=demo"))  # sets what the study measured
    assert files(best) == before

    said = refused(cli(tmp_path, "mode=export", "study.name=demo", "engine.max_model_len=1024",
                       "workload.num_requests=64"))
    assert "engine.max_model_len=1024 where it measured 256" in said
    assert "workload.num_requests=64 where it measured 16" in said
    assert files(best) == before

    # overrides.yaml re-measures the study's engine and workload, with the winner's flags
    overrides = [line for line in before["overrides.yaml"].splitlines() if not line.startswith("#")]
    ok(cli(tmp_path, "mode=measure", "run=again", *overrides))
    (record,) = [json.loads(line) for line in (tmp_path / "results" / "again" / "replicates.jsonl").open()]
    study = optuna.load_study(study_name="demo", storage=f"sqlite:///{best.parent / 'study.db'}")
    winner = study.user_attrs["winner"]["params"]
    assert record["engine_flags"] == json.loads(before["best.json"])["engine_flags"]
    assert {k: record["flags"][k] for k in winner} == winner
    assert record["workload"] == study.user_attrs["workload"]


def test_a_run_folder_holds_one_configuration(tmp_path):
    first = ["mode=measure", "run=m1", "backend=fake", "workload.num_requests=8"]
    ok(cli(tmp_path, *first))
    ok(cli(tmp_path, *first))  # the same configuration again: one more replicate of it
    said = refused(cli(tmp_path, "mode=measure", "run=m1", "backend=vllm", "workload.num_requests=8",
                       "engine.max_num_seqs=4"))
    assert "backend: 'fake' then, 'vllm' now" in said and "engine.max_num_seqs: null (vLLM's default) then, 4 now" in said
    said = refused(cli(tmp_path, "mode=compare", "run=m1", "backend=fake", "workload.num_requests=8"))
    assert "mode: 'measure' then, 'compare' now" in said
    records = (tmp_path / "results" / "m1" / "replicates.jsonl").read_text().splitlines()
    assert len(records) == 2 and all(json.loads(r)["flags"].get("max_num_seqs") is None for r in records)
    assert yaml.safe_load((tmp_path / "results" / "m1" / "config.yaml").read_text())["backend"] == "fake"


def test_a_study_that_measured_nothing_is_not_pinned_to_its_first_configuration(tmp_path):
    space = ["backend=fake", "+space=batching", "study.name=raybad", "study.n_trials=1",
             "space.max_num_seqs.high=4", "~space.max_num_batched_tokens", "study.confirm_top=0"]
    said = refused(cli(tmp_path, *space, "ray.enabled=true", "ray.address=127.0.0.1:1"))
    assert "no Ray cluster answered" in said
    ok(cli(tmp_path, *space, "slots=1", "workload.num_requests=8"))  # another workload: nothing was measured before
    study = optuna.load_study(study_name="raybad", storage=f"sqlite:///{tmp_path / 'results' / 'raybad' / 'study.db'}")
    assert study.user_attrs["workload"]["num_requests"] == 8
    said = refused(cli(tmp_path, *space, "slots=1", "workload.num_requests=12"))  # now it has measured: pinned
    assert "was measured with another configuration" in said and "workload.num_requests=12 where it measured 8" in said


def user_conf(tmp_path: Path, text: str) -> list[str]:
    (tmp_path / "conf" / "space").mkdir(parents=True)
    (tmp_path / "conf" / "space" / "mine.yaml").write_text(text)
    return [f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "+space=mine", "backend=fake"]


def test_a_yaml_syntax_error_in_a_space_file_names_the_file_line_and_column(tmp_path):
    said = refused(cli(tmp_path, *user_conf(tmp_path, "# mine\nmax_num_seqs: {type: int, low: 1: high: 8}\n")))
    assert f"{tmp_path / 'conf' / 'space' / 'mine.yaml'}:2:" in said and "invalid YAML" in said
    assert len(said) < 400


def test_a_misspelt_key_in_a_space_file_is_named(tmp_path):
    said = refused(cli(tmp_path, *user_conf(tmp_path, "max_num_seqs: {tpye: int, low: 1, high: 8}\n")))
    assert "max_num_seqs has no 'type'" in said and "'tpye' -> 'type'" in said


def test_a_misspelt_flag_or_key_without_a_plus_gets_the_nearest_valid_names(tmp_path):
    said = refused(cli(tmp_path, "backend=fake", "engine.max_num_seq=8"))
    assert "unknown engine flag 'max_num_seq'; nearest valid names: max_num_seqs" in said and "+" not in said
    said = refused(cli(tmp_path, "backend=fake", "workload.num_request=8"))
    assert "unknown config key 'workload.num_request'" in said and "workload.num_requests" in said
    said = refused(cli(tmp_path, "backend=fake", "+workload.num_request=8"))
    assert "'workload.num_request' (nearest valid: workload.num_requests)" in said


def test_help_describes_the_modes_and_examples_not_a_config_dump(tmp_path):
    text = ok(cli(tmp_path, "--help"))
    for mode in ("measure", "compare", "sweep", "analyze", "export", "recheck", "capacity", "plan"):
        assert f"mode={mode}" in text
    assert "+space=batching" in text and "space: batching" in text
    assert "num_requests: 64" not in text and len(text.splitlines()) < 60


def test_a_dataset_shorter_than_num_requests_is_refused_not_run_short(tmp_path):
    talk = {"conversations": [{"from": "human", "value": "h" * 400}, {"from": "gpt", "value": "g" * 400}]}
    (tmp_path / "share.json").write_text(json.dumps([talk] * 3))
    said = refused(cli(tmp_path, "backend=fake", "workload.sharegpt=share.json", "workload.num_requests=10"))
    assert "has 3 usable conversations, but workload.num_requests=10" in said
    assert not (tmp_path / "results").exists() or not list((tmp_path / "results").rglob("replicates.jsonl"))


def test_analyze_outputs_of_two_files_in_one_folder_do_not_overwrite_each_other(tmp_path):
    for name, saving in (("a", 0.5), ("b", 0.9)):
        rows = ["arm,order,usd_per_mtok"] + [f"{arm},{i},{(saving if arm == 'candidate' else 1.0) * (1 + 0.01 * i)}"
                                             for i, arm in enumerate("BCCBCBBC".replace("B", "baseline ").replace(
                                                 "C", "candidate ").split())]
        (tmp_path / f"{name}.csv").write_text("\n".join(rows) + "\n")
        ok(cli(tmp_path, "mode=analyze", f"input={name}.csv"))
    ratios = {name: json.loads((tmp_path / "analysis" / name / "summary.json").read_text())["ratio"]
              for name in ("a", "b")}
    assert abs(ratios["a"] - 0.5) < 0.01 and abs(ratios["b"] - 0.9) < 0.01


def test_analyze_lists_a_sweeps_probes_and_comparisons_and_recomputes_the_one_named(tmp_path):
    ok(cli(tmp_path, *DEMO, "plots=false"))
    records = tmp_path / "results" / "demo" / "replicates.jsonl"
    stages = {json.loads(line)["stage"] for line in records.open()}
    assert {"probe", "confirm"} <= stages
    shown = ok(cli(tmp_path, "mode=analyze", f"input={records}", "plots=false"))
    assert "probes, single runs that find the preemption boundary, not comparisons" in shown
    assert "max_num_seqs=8 #1 " in shown
    assert "comparison " in shown and "verdict: CHEAPER" in shown and "error" not in shown
    confirm = next(json.loads(line) for line in records.open() if json.loads(line)["stage"] == "confirm")
    shown = ok(cli(tmp_path, "mode=analyze", f"input={records}", f"comparison={confirm['key']}", "plots=false"))
    assert shown.count("verdict: ") == 1 and f"comparison {confirm['comparison']}" in shown
    said = refused(cli(tmp_path, "mode=analyze", f"input={records}", "comparison=trial-99"))
    assert "holds no such comparison" in said and confirm["key"] in said


def test_analyze_of_a_measure_file_lists_its_runs_without_a_traceback(tmp_path):
    ok(cli(tmp_path, "mode=measure", "run=m", "backend=fake", "workload.num_requests=8"))
    ok(cli(tmp_path, "mode=measure", "run=m", "backend=fake", "workload.num_requests=8"))
    done = cli(tmp_path, "mode=analyze", "input=results/m/replicates.jsonl")
    shown = ok(done)
    assert "Traceback" not in done.stderr and "2 single run(s) of mode=measure" in shown and "verdict" not in shown
    assert not (tmp_path / "results" / "m" / "analysis").exists()


def test_ctrl_c_in_compare_is_one_line_and_analyze_marks_the_abandoned_part_partial(tmp_path):
    args = ["mode=compare", "run=c", "backend=fake", "workload.num_requests=8", "plots=false"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "throttle_sweep", *args, "fake.realtime=true", "fake.start_s=0.3"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_sigint)
    records = tmp_path / "results" / "c" / "replicates.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not records.exists() or len(records.read_text().splitlines()) < 3):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    assert "Traceback" not in err + out and "KeyboardInterrupt" not in err + out
    assert "interrupted" in out and "Run the same command again" in out
    shown = ok(cli(tmp_path, "mode=analyze", f"input={records}"))
    assert "abandoned" in shown and "verdict" not in shown
    ok(cli(tmp_path, *args))  # resumed: measured whole, afresh
    shown = ok(cli(tmp_path, "mode=analyze", f"input={records}"))
    assert shown.count("verdict: ") == 1 and "abandoned" in shown


def test_a_hub_model_that_cannot_be_reached_is_refused_before_any_engine_starts(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:1")  # a hub that refuses at once (loopback only)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    began = time.monotonic()
    said = refused(cli(tmp_path, "engine.model=Qwen/Qwen2.5-0.5B-Instruct", "workload.num_requests=4"))
    assert "engine.model='Qwen/Qwen2.5-0.5B-Instruct' is not in this machine's Hugging Face cache" in said
    assert "the hub cannot be reached" in said and "measuring" not in said
    assert time.monotonic() - began < 25  # vLLM itself retried for about 30 s once its engine had started


def test_a_named_model_with_the_tiny_models_kv_cache_size_gets_a_note_before_measuring(tmp_path):
    import shutil

    from throttle_sweep.models import TINY_QWEN2

    shutil.copytree(TINY_QWEN2, tmp_path / "my-model")
    shown = ok(cli(tmp_path, "backend=fake", "engine.model=my-model", "workload.num_requests=8"))
    assert "engine.kv_cache_memory_bytes=2359296 (2.25 MiB) is sized for the embedded tiny model" in shown
    assert shown.index("kv_cache_memory_bytes=2359296") < shown.index("measuring")


def test_a_sweep_refused_before_its_slots_start_leaves_the_studys_configuration_as_it_was(tmp_path):
    space = ["backend=fake", "+space=batching", "study.name=s", "study.n_trials=1", "space.max_num_seqs.high=4",
             "~space.max_num_batched_tokens", "study.confirm_top=0"]
    ok(cli(tmp_path, *space, "slots=1"))
    saved = (tmp_path / "results" / "s" / "config.yaml").read_text()
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 'results' / 's' / 'study.db'}")
    attrs = dict(study.user_attrs)
    said = refused(cli(tmp_path, *space, "ray.enabled=true", "ray.address=127.0.0.1:1"))
    assert "no Ray cluster answered" in said
    assert (tmp_path / "results" / "s" / "config.yaml").read_text() == saved
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 'results' / 's' / 'study.db'}")
    assert study.user_attrs == attrs


def test_a_resume_with_another_engine_flag_or_price_is_refused_and_a_run_that_only_failed_pins_nothing(tmp_path):
    space = ["backend=fake", "+space=prefix", "study.name=px", "study.n_trials=1", "slots=1", "study.confirm_top=0"]
    ok(cli(tmp_path, *space))
    said = refused(cli(tmp_path, *space, "study.n_trials=2", "engine.max_num_seqs=2"))
    assert "engine.max_num_seqs=2 where it measured null (vLLM's default)" in said
    said = refused(cli(tmp_path, *space, "study.n_trials=2", "cost.usd_per_gpu_hour=9"))
    assert "cost.usd_per_gpu_hour=9.0 where it measured 1.39" in said
    failing = ["mode=measure", "run=fm", "backend=fake", "+fake.fail_start_when={max_num_seqs:0}"]
    assert cli(tmp_path, *failing, "engine.max_num_seqs=4").returncode == 1  # FAILED (start): nothing measured
    ok(cli(tmp_path, "mode=measure", "run=fm", "backend=fake", "engine.max_num_seqs=2", "workload.num_requests=8"))


def test_analyze_marks_a_sweeps_comparison_cut_short_partial_and_one_stopped_at_a_look_whole(tmp_path):
    ok(cli(tmp_path, *DEMO, "plots=false"))
    records = (tmp_path / "results" / "demo" / "replicates.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in records]
    search = [i for i, r in enumerate(rows) if r["stage"] == "search"]
    first = rows[search[0]]
    assert first["looks"] and first["runs_planned"] == 8
    cut = search[0] + 3  # three runs of the first search comparison, then the run stopped
    (tmp_path / "cut.jsonl").write_text("\n".join(records[:cut]) + "\n")
    shown = ok(cli(tmp_path, "mode=analyze", "input=cut.jsonl", "plots=false"))
    assert f"comparison {first['comparison']}" in shown and "abandoned: 3 of 8 runs" in shown
    assert "verdict" not in shown
    whole = ok(cli(tmp_path, "mode=analyze", f"input={tmp_path / 'results' / 'demo' / 'replicates.jsonl'}"))
    assert "abandoned" not in whole  # the demo's searches stop, decided, at a look: whole comparisons


def test_a_config_group_given_a_value_and_a_bad_key_in_a_chosen_file_are_one_line_errors(tmp_path):
    said = refused(cli(tmp_path, "backend=fake", "cost=2.5"))
    assert "'cost=2.5': cost is a config group (options: default)" in said
    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    (tmp_path / "conf" / "experiment" / "mine.yaml").write_text("# @package _global_\nworkload:\n  num_request: 8\n")
    said = refused(cli(tmp_path, f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "+experiment=mine", "backend=fake"))
    assert "unknown config key 'workload.num_request' (set in a config file the command line chose" in said
    assert "workload.num_requests" in said


def test_a_recheck_of_a_study_that_is_not_there_exits_2_naming_it(tmp_path):
    said = refused(cli(tmp_path, "mode=recheck", "study.name=gone"))
    assert "study.name='gone': no study folder results/gone" in said
