"""backend=server: vLLM's own OpenAI-compatible API server (`vllm serve`; on this CPU build its API server module) with
the tiny model, driven over HTTP. What the in-process engine shows must hold here too (fixed work, the
preemption counter), every server must be gone with its port free after its lifetime, and a server that dies
mid-replicate fails that replicate instead of hanging the run."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import optuna
import psutil
import pytest
from rich.console import Console

from tests.helpers import compose_cfg
from throttle_sweep.commands import compare as compare_cmd
from throttle_sweep.commands import measure as measure_cmd
from throttle_sweep.commands import sweep as sweep_cmd
from throttle_sweep.cost import Price
from throttle_sweep.engines import VllmInprocEngine
from throttle_sweep.engines.vllm_server import VllmServerEngine, port_is_free
from throttle_sweep.measure import measure_on
from throttle_sweep.records import read_records
from throttle_sweep.stats import CHEAPER
from throttle_sweep.workload import WorkloadSpec

pytestmark = pytest.mark.integration
EDGE = {"kv_cache_memory_bytes": 2 << 20, "max_model_len": 256, "enforce_eager": True, "seed": 0}
SMALL = ["backend=server", "workload.num_requests=16", "workload.output_len=32", "workload.prompt_len=32",
         "workload.warmup_requests=2"]


def servers_running() -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"])
            if "vllm.entrypoints.openai.api_server" in " ".join(p.info["cmdline"] or [])]


def test_a_warm_server_counts_each_replicates_own_preemptions_and_is_gone_after(tmp_path):
    """12 requests of 32+128 tokens with 2 MiB of KV cache: at max_num_seqs=12 the server preempts on every
    replicate of one warm server (its prefix cache reset between), each replicate counting its own; every
    request produces its exact length. How many times is not exact over HTTP, unlike in-process: the requests
    reach the server one by one, and where each lands among the engine's steps moves the schedule (CI saw 5
    then 6 on one server). The sweep's boundary recheck is what catches that (search/boundary.py)."""
    engine = VllmServerEngine(log_dir=tmp_path / "logs", start_timeout_s=300)
    spec = WorkloadSpec(num_requests=12, prompt_len=32, output_len=128, concurrency=12, warmup_requests=0)
    session = engine.start({**EDGE, "max_num_seqs": 12})
    port, pid = session.port, session.process.pid
    try:
        records = []
        for index in range(2):
            session.begin_replicate(index)
            records.append(measure_on(session, {"max_num_seqs": 12}, spec, Price(1.39, 1), {}))
    finally:
        session.close()
    assert [r["status"] for r in records] == ["ok", "ok"], [r.get("reason") for r in records]
    assert all(r["preemptions"] > 0 for r in records)
    assert all(r["output_tokens"] == 12 * 128 and r["requests_wrong_length"] == 0 for r in records)
    assert session.prefix_cache_reset is True
    alone = VllmInprocEngine().start({**EDGE, "max_num_seqs": 12})  # the same work on the in-process engine
    try:
        inproc = measure_on(alone, {"max_num_seqs": 12}, spec, Price(1.39, 1), {})
    finally:
        alone.close()
    assert records[0]["kv_cache"] == inproc["kv_cache"] and records[0]["kv_cache"]["blocks"]
    # the in-process engine preempts on the same work; a count that carried the last replicate's over (a
    # cumulative counter read as a delta, or the first read too early) would double the second's
    assert inproc["preemptions"] > 0
    assert all(inproc["preemptions"] / 2 <= r["preemptions"] <= inproc["preemptions"] * 1.5 for r in records), (
        [r["preemptions"] for r in records], inproc["preemptions"])
    assert all(r["peak_kv_cache_usage"] > 0.5 for r in records)  # sampled from /metrics while it ran
    assert not psutil.pid_exists(pid) and pid not in servers_running() and port_is_free(port)


def test_measure_on_the_server_writes_a_record_and_keeps_the_servers_log(tmp_path):
    cfg = compose_cfg(*SMALL, "mode=measure", "run=m", "engine.max_num_seqs=4", tmp_path=tmp_path)
    assert measure_cmd.run(cfg, Console(quiet=True)) == 0
    (record,) = read_records(tmp_path / "m" / "replicates.jsonl")
    assert record["status"] == "ok" and record["environment"]["engine"] == "vllm-server"
    assert record["output_tokens"] == 16 * 32 and record["preemptions"] == 0
    (log,) = (tmp_path / "server-logs").iterdir()
    assert "vllm.entrypoints.openai.api_server" in log.read_text().splitlines()[0]
    assert record["server_log"] == str(log)
    # the flag left to vLLM, as the server itself resolved it (its /server_info), is what the in-process
    # engine resolves for `vllm serve` and measures with: both backends run, record and export the same flags
    from throttle_sweep.engines.vllm_inproc import served_batch_defaults

    inproc = served_batch_defaults(VllmInprocEngine().engine_flags(record["flags"]))
    assert record["served_defaults"] == inproc == {"max_num_batched_tokens": inproc["max_num_batched_tokens"]}
    assert record["engine_flags"]["max_num_batched_tokens"] == inproc["max_num_batched_tokens"]
    assert not servers_running()


def test_a_server_killed_mid_replicate_fails_that_replicate_quoting_its_log(tmp_path):
    engine = VllmServerEngine(log_dir=tmp_path / "logs", start_timeout_s=300, stop_grace_s=5)
    spec = WorkloadSpec(num_requests=64, prompt_len=32, output_len=128, concurrency=4, warmup_requests=0)
    session = engine.start({**EDGE, "max_num_seqs": 4})
    killer = threading.Timer(1.0, os.killpg, args=(session.process.pid, signal.SIGKILL))
    killer.start()
    began = time.monotonic()
    try:
        record = measure_on(session, {"max_num_seqs": 4}, spec, Price(1.39, 1), {})
    finally:
        killer.join()
        session.close()
    assert record["status"] == "failed" and record["failed_at"] == "run"
    assert "server log" in record["reason"] and str(session.log_path) in record["reason"]
    assert time.monotonic() - began < 60  # reported, not hung on the dead server's streams
    assert port_is_free(session.port) and not servers_running()


def test_compare_and_a_small_sweep_on_warm_servers(tmp_path):
    """compare: eight in flight against one, each arm on its own warm server (one per arm, kept across the
    arm's replicates); then a two-point sweep the same way, which confirms and exports a winner."""
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

    cfg = compose_cfg(*SMALL, "+space=batching", "study.name=s", "study.n_trials=2", "study.sampler=grid",
                      "space.max_num_seqs.low=4", "space.max_num_seqs.high=8", "space.max_num_seqs.log=false",
                      "+space.max_num_seqs.step=4", "~space.max_num_batched_tokens", "study.boundary=none",
                      "compare.restart=never", "compare.replicates=2", "study.confirm_top=1",
                      "study.confirm_replicates=4", "plots=false", tmp_path=tmp_path)
    assert sweep_cmd.run(cfg, Console(quiet=True)) == 0
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 's' / 'study.db'}")
    assert {t.params["max_num_seqs"] for t in study.trials} == {4, 8}
    assert study.user_attrs["winner"]["ci"][1] < 1 and (tmp_path / "s" / "best" / "vllm_config.yaml").exists()
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
    """The same switch on Ray: the slot's actor starts the engine process, which starts the server."""
    cfg = compose_cfg(*SMALL, "+space=batching", "study.name=rs", "study.n_trials=1", "study.sampler=grid",
                      "space.max_num_seqs.low=8", "space.max_num_seqs.high=8", "space.max_num_seqs.log=false",
                      "~space.max_num_batched_tokens", "study.boundary=none", "compare.restart=never",
                      "compare.replicates=2", "study.confirm_top=1", "study.confirm_replicates=2",
                      "ray.enabled=true", "ray.cpu_slots=1", "plots=false", tmp_path=tmp_path)
    assert sweep_cmd.run(cfg, Console(quiet=True)) == 0
    records = read_records(tmp_path / "rs" / "replicates.jsonl")
    assert records and all(r["status"] == "ok" and r["environment"]["engine"] == "vllm-server" for r in records)
    assert {r["slot"] for r in records} == {"ray-0"} and len({r["server_log"] for r in records}) == 2
    assert not servers_running()


def test_a_port_taken_before_the_server_binds_it_is_retried_on_another(tmp_path, monkeypatch):
    import socket

    from throttle_sweep.engines import vllm_server

    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    ports = iter([taken])
    monkeypatch.setattr(vllm_server, "free_port", lambda: next(ports, None) or free_port_of_os())
    try:
        session = VllmServerEngine(log_dir=tmp_path / "logs", start_timeout_s=300).start({**EDGE, "max_num_seqs": 2})
    finally:
        squatter.close()
    session.close()
    assert session.port != taken
    first = [p for p in (tmp_path / "logs").iterdir() if p.name.endswith(f"-{taken}.log")]
    assert first and "address already in use" in first[0].read_text().lower()


def free_port_of_os() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
