"""backend=server in every mode: compare on warm servers, an endpoint compare between servers
someone runs, and a sweep on a Ray slot, each through vLLM's API server with the tiny model. (Beside
test_vllm_server.py so that the two halves run on two test workers.)"""

from __future__ import annotations

import json

import optuna
import pytest
from rich.console import Console

from tests.helpers import SERVER_EDGE as EDGE
from tests.helpers import SERVER_SMALL as SMALL
from tests.helpers import compose_cfg, servers_running
from throttle_sweep.commands import compare as compare_cmd
from throttle_sweep.commands import sweep as sweep_cmd
from throttle_sweep.engines.vllm_server import VllmServerEngine
from throttle_sweep.stats.verdict import CHEAPER
from throttle_sweep.store.records import read_records

# every verdict here goes through vLLM's API server, whose per-token work is not batched: beside another engine on
# 2 cores a 16-request replicate's saving at 8 in flight vanished (1.108 [0.748, 1.639]; 0.2-0.3 alone)
pytestmark = [pytest.mark.integration, pytest.mark.quiet]


def test_a_compare_on_warm_servers(tmp_path):
    """compare: eight in flight against one, each arm on its own warm server (one per arm, kept across the
    arm's replicates), and none left running after. (A sweep on warm servers: the Ray slot's test below.)"""
    cfg = compose_cfg(*SMALL, "mode=compare", "run=c", "compare.restart=never", "compare.replicates=4",
                      "baseline.max_num_seqs=1", "candidate.max_num_seqs=8", tmp_path=tmp_path)
    assert compare_cmd.run(cfg, Console(quiet=True)) == 0
    summary = json.loads((tmp_path / "c" / "summary.json").read_text())
    assert summary["verdict"] == CHEAPER and summary["ci"][1] < 1, summary
    records = read_records(tmp_path / "c" / "replicates.jsonl")
    lifetimes = {arm: {r["engine_lifetime"]["id"] for r in records if r["arm"] == arm}
                 for arm in ("baseline", "candidate")}
    assert all(len(ids) == 1 for ids in lifetimes.values()) and len(set.union(*lifetimes.values())) == 2
    assert len({r["server_log"] for r in records}) == 2
    assert not servers_running()


def test_an_endpoint_compare_between_two_servers_someone_runs(tmp_path):
    """backend=endpoint: two vLLM servers already up (started here as a user would), compared by URL."""
    engine = VllmServerEngine(log_dir=tmp_path / "logs", start_timeout_s=300)
    one = engine.start({**EDGE, "max_num_seqs": 1})
    try:
        eight = engine.start({**EDGE, "max_num_seqs": 8})
        try:
            cfg = compose_cfg(*SMALL[1:], "backend=endpoint", "mode=compare", "run=e",
                              f"endpoint.baseline_url={one.base_url}", f"endpoint.candidate_url={eight.base_url}",
                              tmp_path=tmp_path)
            assert compare_cmd.run(cfg, Console(quiet=True)) == 0
        finally:
            eight.close()
    finally:
        one.close()
    summary = json.loads((tmp_path / "e" / "summary.json").read_text())
    assert summary["verdict"] == CHEAPER and summary["ci"][1] < 1, summary
    records = read_records(tmp_path / "e" / "replicates.jsonl")
    assert {r["flags"]["url"] for r in records if r["arm"] == "candidate"} == {eight.base_url}
    assert all(r["environment"]["engine"] == "endpoint" and r["output_tokens"] == 16 * 32 for r in records)


def test_a_sweep_on_a_ray_slot_serves_through_the_api_server(tmp_path):
    """The same switch on Ray: the slot's actor starts the engine process, which starts the server; the
    slot keeps each arm's server warm across its replicates, and the sweep confirms and exports a winner."""
    cfg = compose_cfg(*SMALL, "+space=batching", "study.name=rs", "study.n_trials=1", "study.sampler=grid",
                      "space.max_num_seqs.low=8", "space.max_num_seqs.high=8", "space.max_num_seqs.log=false",
                      "~space.max_num_batched_tokens", "study.boundary=none", "compare.restart=never",
                      "compare.replicates=2", "study.confirm_top=1", "study.confirm_replicates=4",
                      "ray.enabled=true", "ray.cpu_slots=1", "plots=false", tmp_path=tmp_path)
    assert sweep_cmd.run(cfg, Console(quiet=True)) == 0
    records = read_records(tmp_path / "rs" / "replicates.jsonl")
    assert records and all(r["status"] == "ok" and r["environment"]["engine"] == "vllm-server" for r in records)
    assert {r["slot"] for r in records} == {"ray-0"} and len({r["server_log"] for r in records}) == 2
    study = optuna.load_study(study_name="rs", storage=f"sqlite:///{tmp_path / 'rs' / 'study.db'}")
    assert study.user_attrs["winner"] is not None, (tmp_path / "rs" / "report.md").read_text()
    assert study.user_attrs["winner"]["ci"][1] < 1 and (tmp_path / "rs" / "best" / "vllm_config.yaml").exists()
    assert not servers_running()
