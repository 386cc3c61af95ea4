"""mode=export on a study made before the study recorded its engine: the sweep's own config.yaml says it."""

from __future__ import annotations

from types import SimpleNamespace

import yaml

from throttle_sweep.commands.export import export_keeping_the_old


def test_an_older_study_exports_the_engine_its_config_yaml_recorded_and_keeps_a_differing_export(tmp_path):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({
        "mode": "sweep", "backend": "fake", "cost": {"usd_per_gpu_hour": 2.0, "gpus": 1},
        "engine": {"kv_cache_memory_bytes": 2097152, "max_model_len": 256, "max_num_seqs": None}}))
    study = SimpleNamespace(study_name="old", user_attrs={
        "baseline": {"kv_cache_memory_bytes": 2097152, "max_model_len": 256, "max_num_seqs": 1},
        "workload": {"num_requests": 16},
        "winner": {"params": {"max_num_seqs": 7}, "ratio": 0.2, "ci": [0.1, 0.3], "trial": 3}})
    (tmp_path / "best").mkdir()
    (tmp_path / "best" / "vllm_config.yaml").write_text("max-model-len: 1024\n")  # what the old export wrote
    said = []
    paths = export_keeping_the_old(study, tmp_path, said.append)
    served = yaml.safe_load(paths["yaml"].read_text())
    assert served == {"kv-cache-memory-bytes": 2097152, "max-model-len": 256, "max-num-seqs": 7}
    (kept,) = tmp_path.glob("best.superseded-*")
    assert (kept / "vllm_config.yaml").read_text() == "max-model-len: 1024\n" and "moved to" in said[0]
    assert "++engine.max_num_seqs=7" in paths["hydra"].read_text() and "backend=fake" in paths["hydra"].read_text()
    export_keeping_the_old(study, tmp_path, said.append)  # the same export again: nothing moved
    assert len(list(tmp_path.glob("best.superseded-*"))) == 1 and len(said) == 1


def test_the_export_serves_the_defaults_the_winner_was_measured_with(tmp_path):
    """An in-process engine resolves the batch flags left to vLLM's default as `vllm serve` does (records'
    served_defaults); the export writes them out, so a server elsewhere serves what was measured."""
    import json

    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"mode": "sweep", "backend": "fake", "engine": {}}))
    study = SimpleNamespace(study_name="s", user_attrs={
        "baseline": {"max_num_seqs": 1}, "workload": {"num_requests": 16},
        "winner": {"params": {"max_num_seqs": 7}, "ratio": 0.2, "ci": [0.1, 0.3], "trial": 3}})
    run = {"schema_version": "1.1", "record_id": "r", "run_id": "s", "flags": {"max_num_seqs": 7}, "position": 1,
           "status": "ok", "stage": "confirm", "trial": 3, "arm": "candidate",
           "served_defaults": {"max_num_batched_tokens": 2048}}
    (tmp_path / "replicates.jsonl").write_text(json.dumps(run) + "\n")
    paths = export_keeping_the_old(study, tmp_path, print)
    assert yaml.safe_load(paths["yaml"].read_text()) == {"max-num-seqs": 7, "max-num-batched-tokens": 2048}


def test_overrides_compose_back_to_exactly_the_recorded_values():
    """Strings that look like numbers or bools stay strings; an engine without a package default's key
    (deleted with ~) is composed without it, not with the default back."""
    from tests.helpers import compose_cfg
    from throttle_sweep.settings.sections import plain
    from throttle_sweep.store.provenance import overrides_for

    engine = {"model": "org/m-1.0", "revision": "12e45678", "tokenizer_mode": "True", "seed": 0,
              "max_model_len": 256, "kv_cache_memory_bytes": None, "hf_overrides": {"a": 1.5}}
    workload = {"num_requests": 16, "jsonl": None, "chars_per_token": 4.0}
    cfg = compose_cfg(*overrides_for({"backend": "fake", "engine": engine, "workload": workload}))
    assert plain(cfg.engine) == engine and "enforce_eager" not in plain(cfg.engine)
    assert {k: plain(cfg.workload)[k] for k in workload} == workload and cfg.backend == "fake"


def test_the_command_line_sets_only_what_its_overrides_and_chosen_files_set():
    from throttle_sweep.store.provenance import set_on_command_line

    sections, keys = set_on_command_line(["+experiment=demo", "mode=export", "study.name=demo"])
    assert not sections and "engine.max_model_len" in keys and "workload.num_requests" in keys
    assert "backend" not in keys and "engine.model" not in keys  # the demo does not set them
    sections, keys = set_on_command_line(["engine=gpu", "++engine.max_num_seqs=4", "~engine.seed", "backend=fake"])
    assert sections == {"workload"}  # engine=gpu's own defaults choose workload=gpu
    assert {"engine.model", "baseline.max_num_seqs", "engine.max_num_seqs", "engine.seed", "backend"} <= keys
