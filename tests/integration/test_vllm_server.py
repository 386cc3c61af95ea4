"""backend=server: vLLM's own OpenAI-compatible API server (`vllm serve`; on this CPU build its API server module) with
the tiny model, driven over HTTP. What the in-process engine shows must hold here too (fixed work, the
preemption counter), every server must be gone with its port free after its lifetime, and a server that dies
mid-replicate fails that replicate instead of hanging the run."""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest
from rich.console import Console

from tests.helpers import SERVER_EDGE as EDGE
from tests.helpers import SERVER_SMALL as SMALL
from tests.helpers import compose_cfg, servers_running
from throttle_sweep.commands import measure as measure_cmd
from throttle_sweep.engines import VllmInprocEngine
from throttle_sweep.engines.vllm_server import VllmServerEngine, port_is_free
from throttle_sweep.measurement.cost import Price
from throttle_sweep.measurement.replicate import measure_on
from throttle_sweep.measurement.workload import WorkloadSpec
from throttle_sweep.store.records import read_records

pytestmark = pytest.mark.integration




def test_a_warm_server_counts_each_replicates_own_preemptions_and_is_gone_after(tmp_path):
    """36 requests of 32+128 tokens, 12 in flight, with 2 MiB of KV cache (three waves: a run long enough for
    several 0.2 s reads of its KV usage while the cache is full). At max_num_seqs=12 the server preempts on every
    replicate of one warm server (its prefix cache reset between), each replicate counting its own: the counts
    add up to the server's own counter. Every request produces its exact length. How many times is not exact
    over HTTP, unlike in-process: the requests reach the server one by one, and where each lands among the
    engine's steps moves the schedule (CI saw 1 then 5 against 5 in-process; 12 then 14 against 8). The
    sweep's boundary recheck is what catches that (sweep/boundary.py)."""
    engine = VllmServerEngine(log_dir=tmp_path / "logs", start_timeout_s=300)
    spec = WorkloadSpec(num_requests=36, prompt_len=32, output_len=128, concurrency=12, warmup_requests=0)
    session = engine.start({**EDGE, "max_num_seqs": 12})
    port, pid = session.port, session.process.pid
    try:
        records = []
        for index in range(2):
            session.begin_replicate(index)
            records.append(measure_on(session, {"max_num_seqs": 12}, spec, Price(1.39, 1), {}))
        server_total = session.preemptions()
    finally:
        session.close()
    assert [r["status"] for r in records] == ["ok", "ok"], [r.get("reason") for r in records]
    assert all(r["preemptions"] > 0 for r in records), [r["preemptions"] for r in records]
    assert all(r["output_tokens"] == 36 * 128 and r["requests_wrong_length"] == 0 for r in records)
    assert session.prefix_cache_reset is True
    alone = VllmInprocEngine().start({**EDGE, "max_num_seqs": 12})  # the same work on the in-process engine
    try:
        inproc = measure_on(alone, {"max_num_seqs": 12}, spec, Price(1.39, 1), {})
    finally:
        alone.close()
    assert records[0]["kv_cache"] == inproc["kv_cache"] and records[0]["kv_cache"]["blocks"]
    # each replicate's count is its own: a cumulative counter read as a delta, or a first read too early,
    # would not add up to the server's counter; the in-process engine preempts on the same work
    assert sum(r["preemptions"] for r in records) == server_total, ([r["preemptions"] for r in records], server_total)
    assert inproc["preemptions"] > 0
    # sampled from /metrics while it ran
    assert all(r["peak_kv_cache_usage"] > 0.5 for r in records), [
        (r["peak_kv_cache_usage"], r["wall_s"]) for r in records]
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
    # the flag left to vLLM, as vLLM resolves it for the server, is what the in-process
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
