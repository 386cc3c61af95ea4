"""The HTTP session and the server engine's plumbing, against a stub streaming server (no vLLM): token
counting across multi-token chunks and reads, usage checks, failures that name the request, a run void
when the client was the bottleneck, the server's command line and environment. What needs a real server
process (its sleep and wake, its stop after a failed start) is in tests/process/test_server_process.py."""

from __future__ import annotations

import time

import pytest

from tests.stub_openai import Behaviour, StubServer
from throttle_sweep.engines.base import Request
from throttle_sweep.engines.openai_http import HttpSession, StreamFailed, Tally, kv_gap, parse_metrics
from throttle_sweep.engines.vllm_inproc import DEFAULTED, server_environment
from throttle_sweep.engines.vllm_server import VllmServerEngine, server_argv
from throttle_sweep.errors import EngineRunError
from throttle_sweep.measurement.cost import Price
from throttle_sweep.measurement.replicate import client_bound, measure_on, one_line
from throttle_sweep.measurement.workload import WorkloadSpec, drive
from throttle_sweep.stats.comparison import fault_of, settle


def requests(n: int, output_len: int) -> list[Request]:
    return [Request(f"r{i}", output_len, prompt_token_ids=(1, 2, 3, 4)) for i in range(n)]


def test_tokens_are_counted_not_chunks():
    """Three tokens per chunk: every request still produces exactly its output length, and its token times
    are the chunks' arrivals, in order (chunks apart in time: chunks that come in one read are one arrival)."""
    with StubServer(Behaviour(tokens_per_chunk=3, chunk_delay_s=0.02)) as stub:
        session = HttpSession(stub.url, "m")
        try:
            result = drive(session, requests(6, 10), loop="closed", concurrency=3)
            assert result.peak_kv_cache_usage == 0.25 and session.kv_cache_usage() == 0.0  # nothing carried over
            assert session.preemptions() == 0 and session.prefix_cache() == (12, 3)
            session.read_kv_capacity()
            assert (session.kv_block_size, session.kv_blocks) == (16, 100)  # less the null block
        finally:
            session.close()
    assert [t.output_tokens for t in result.timings] == [10] * 6
    # 3+3+3+1 tokens in 4 chunks: 4 arrivals, fewer where a loaded machine read two chunks at once
    assert all(1 <= len(t.token_times) <= 4 for t in result.timings)
    for t in result.timings:
        assert t.submitted_s <= t.first_token_s == t.token_times[0] <= t.token_times[-1] == t.finished_s
    assert sum(s.tokens for s in result.steps) == 60
    sent = stub.requests[0]
    assert sent["prompt"] == [1, 2, 3, 4] and sent["max_tokens"] == sent["min_tokens"] == 10 and sent["ignore_eos"]
    assert sent["stream_options"]["continuous_usage_stats"]


def sse(*events: str) -> bytes:
    return b"".join(b"data: " + e.encode() + b"\n\n" for e in events)


def test_a_read_of_several_chunks_is_one_arrival_and_a_chunk_split_over_reads_waits_for_its_end():
    tally = Tally("r0")
    one = '{"choices": [{"token_ids": [7], "finish_reason": null}], "usage": {"prompt_tokens": 4, "completion_tokens": %d}}'
    data = sse(one % 1, one % 2, one % 3)
    assert tally.feed(data[:-30]) and (tally.counted, tally.received) == (2, 2)  # the third is not complete yet
    assert not tally.feed(b"")
    assert tally.feed(data[-30:]) and (tally.counted, tally.received, tally.prompt_tokens) == (3, 3, 4)
    last = '{"choices": [{"token_ids": [7], "finish_reason": "length"}], "usage": {"completion_tokens": 4}}'
    assert tally.feed(sse(last, '{"choices": [], "usage": {"completion_tokens": 4}}', "[DONE]"))
    assert tally.finished and tally.done and tally.counted == tally.received == 4


@pytest.mark.parametrize(("data", "says"), [(sse('{"a": 1}', "[1, 2"), "not JSON: b'[1, 2'"),
                                             (sse('{"a": 1}', "[1, 2]"), "not a JSON object: [1, 2]"),
                                             (sse('{"error": "no"}'), "with an error: no")])
def test_a_chunk_that_is_not_an_object_or_an_error_fails_its_request(data, says):
    with pytest.raises(StreamFailed, match=says.replace("[", r"\[")):
        Tally("r0").feed(data)


def test_an_open_loop_sends_a_request_when_it_is_due_not_when_the_next_chunk_comes():
    """Chunks 150 ms apart: a request due between two chunks goes out when it is due (the wait for the next
    chunk ends at the next arrival), not at the next chunk, 60-90 ms later."""
    from dataclasses import replace

    with StubServer(Behaviour(chunk_delay_s=0.15)) as stub:
        session = HttpSession(stub.url, "m")
        try:
            timed = [replace(r, arrival_s=at) for r, at in zip(requests(3, 4), (0.0, 0.06, 0.21), strict=True)]
            result = drive(session, timed, loop="open", concurrency=3)
        finally:
            session.close()
    late = [t.submitted_s - t.scheduled_s for t in result.timings]
    assert max(late) < 0.03, late
    assert [t.output_tokens for t in result.timings] == [4] * 3


@pytest.mark.parametrize(("behaviour", "says"), [
    (Behaviour(usage_extra=2), "usage says 12 output tokens, but 10 token ids arrived"),
    (Behaviour(cut_after=4), "the stream ended before the request finished (4 of 10 tokens)"),
    (Behaviour(status=500), "HTTP 500: {\"error\": \"stub says no\"}"),
    (Behaviour(garbage=b"[1, 2]"), "a chunk that is not a JSON object: [1, 2]"),
    (Behaviour(garbage=b'{"choices": [{"token_ids": 5}]}'), "TypeError"),  # anything unexpected fails, never hangs
])
def test_a_server_that_misbehaves_fails_the_run_naming_the_request(behaviour, says):
    with StubServer(behaviour) as stub:
        session = HttpSession(stub.url, "m")
        try:
            with pytest.raises(EngineRunError) as caught:
                drive(session, requests(2, 10), loop="closed", concurrency=2)
        finally:
            session.close()
    assert "request r" in str(caught.value) and says in str(caught.value)


def test_a_server_without_running_usage_is_counted_by_its_token_ids():
    with StubServer(Behaviour(null_usage=True, tokens_per_chunk=2)) as stub:
        session = HttpSession(stub.url, "m")
        try:
            result = drive(session, requests(2, 5), loop="closed", concurrency=2)
        finally:
            session.close()
    assert [t.output_tokens for t in result.timings] == [5, 5]


def test_a_server_that_is_gone_fails_the_run_instead_of_hanging():
    stub = StubServer().__enter__()
    session = HttpSession(stub.url, "m")
    stub.__exit__()
    try:
        with pytest.raises(EngineRunError, match="request r0: .*Connect"):
            drive(session, requests(1, 4), loop="closed", concurrency=1)
    finally:
        session.close()


@pytest.mark.parametrize(("behaviour", "tries"), [
    (Behaviour(reset_status=404), 1),  # no dev mode: said at once
    (Behaviour(reset_body=b'{"success": false}'), 2),  # blocks still held: tried again for a second, then said
])
def test_prefix_cache_reset_says_whether_it_worked(behaviour, tries):
    with StubServer(behaviour) as stub:
        session = HttpSession(stub.url, "m")
        session.begin_replicate(0)
        session.close()
    assert stub.resets >= tries and session.prefix_cache_reset is False


def test_metrics_are_summed_over_label_sets():
    text = ('# HELP x\nvllm:num_preemptions_total{engine="0",model_name="a b"} 2.0\n'
            'vllm:num_preemptions_total{engine="1"} 3.0\nvllm:kv_cache_usage_perc 0.5\nbroken line\n')
    assert parse_metrics(text) == {"vllm:num_preemptions_total": 5.0, "vllm:kv_cache_usage_perc": 0.5}


def test_flags_become_the_servers_own_options():
    argv = server_argv({"model": "/m", "max_num_seqs": 8, "enforce_eager": True, "enable_prefix_caching": False,
                        "compilation_config": {"mode": 0}, "block_size": None}, 8123)
    i = argv.index("vllm.entrypoints.openai.api_server")
    assert argv[i + 1:] == ["--host", "127.0.0.1", "--port", "8123", "--model", "/m", "--max-num-seqs", "8",
                            "--enforce-eager", "--no-enable-prefix-caching", "--compilation-config", '{"mode": 0}']


def test_a_server_keeps_the_users_environment_but_not_the_in_process_defaults(monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "ERROR")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the user's
    monkeypatch.setenv(DEFAULTED, "VLLM_ENABLE_V1_MULTIPROCESSING,VLLM_LOGGING_LEVEL")
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    cpu, gpu = server_environment(True), server_environment(False)
    for env in (cpu, gpu):
        assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in env and "VLLM_LOGGING_LEVEL" not in env
        assert env["OMP_NUM_THREADS"] == "2" and DEFAULTED not in env
    assert cpu["VLLM_CPU_OMP_THREADS_BIND"] == "nobind" and "VLLM_CPU_OMP_THREADS_BIND" not in gpu


def test_the_server_is_launched_as_vllm_serve_where_vllms_own_package_is_installed(monkeypatch):
    """`vllm serve MODEL`, as users run it (its own defaulting: data-parallel load balancing, API server
    count), through vLLM's CLI module; vLLM's CPU build cannot run its CLI (it reads the version of a package
    named vllm), so there the API server module `vllm serve` runs for one server is started instead."""
    import throttle_sweep.engines.vllm_server as vllm_server

    flags = {"model": "/m", "max_num_seqs": 8}
    monkeypatch.setattr(vllm_server, "cli_runs", lambda: True)
    argv = server_argv(flags, 8123)
    i = argv.index("vllm.entrypoints.cli.main")
    assert argv[i + 1:] == ["serve", "/m", "--host", "127.0.0.1", "--port", "8123", "--max-num-seqs", "8"]
    monkeypatch.setattr(vllm_server, "cli_runs", lambda: False)
    assert "vllm.entrypoints.openai.api_server" in server_argv(flags, 8123)


def test_vllms_cli_runs_only_where_a_package_named_vllm_is_installed(monkeypatch):
    from importlib import metadata

    import throttle_sweep.engines.vllm_server as vllm_server

    versions = {"vllm-cpu": "0.32.0"}

    def version(name):
        if name not in versions:
            raise metadata.PackageNotFoundError(name)
        return versions[name]
    monkeypatch.setattr(metadata, "version", version)
    assert vllm_server.cli_runs() is False
    versions = {"vllm": "0.33.0"}
    assert vllm_server.cli_runs() is True


def test_a_server_on_a_gpu_waits_for_the_memory_its_gpus_will_need_before_it_is_launched(monkeypatch, tmp_path):
    import throttle_sweep.engines.gpu_memory as gpu_memory
    import throttle_sweep.engines.vllm_server as vllm_server

    readings = iter([[(10 << 30, 80 << 30)] * 2, [(79 << 30, 80 << 30)] * 2])
    asked = []
    monkeypatch.setattr(gpu_memory, "device_memory", lambda n: asked.append(n) or next(readings))
    monkeypatch.setattr(gpu_memory, "POLL_S", 0.0)
    monkeypatch.setattr(vllm_server, "cpu_build", lambda: False)
    monkeypatch.setattr(vllm_server, "served_batch_defaults", lambda flags: {})  # vLLM's EngineArgs would read /m

    class Launched(Exception):
        pass

    def launch(argv, log_path):
        raise Launched
    monkeypatch.setattr(vllm_server, "launch", launch)
    with pytest.raises(Launched):
        VllmServerEngine(log_dir=tmp_path).start({"model": "/m", "tensor_parallel_size": 2})
    assert asked == [2, 2]  # polled until both GPUs had room, then launched


def test_a_server_that_exits_on_vllms_memory_refusal_says_so_whatever_the_traceback_after_it(tmp_path):
    """The refusal is raised in the engine core; the API server then logs a long traceback of its own, which
    pushes the refusal out of the log's last lines."""
    from throttle_sweep.engines.vllm_server import exit_reason
    from throttle_sweep.errors import refused_for_memory

    log = tmp_path / "server.log"
    refusal = ("ValueError: Free memory on device cuda:0 (10.0/79.2 GiB) on startup is less than desired GPU memory "
               "utilization (0.9, 71.3 GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
               "processes.")
    log.write_text("\n".join(["$ vllm serve m", refusal] + [f"  File x.py, line {i}" for i in range(60)]
                             + ["RuntimeError: Engine core initialization failed. See root cause above."]))
    assert refused_for_memory(exit_reason(log, 1))
    log.write_text("RuntimeError: Engine core initialization failed.\n")
    assert not refused_for_memory(exit_reason(log, 1))


def test_kv_usage_is_read_every_fifth_of_a_second_at_first_then_less_often_as_a_run_goes_on():
    """Each /metrics read costs vLLM's API server 4-8 ms: a long run is read about 22 times in 20 s, not 100,
    while a 0.4 s run still gets a read every 0.2 s (its KV peak is inside it)."""
    def reads(seconds):
        t, n = 0.0, 1
        while (t := t + kv_gap(t)) < seconds:
            n += 1
        return n

    assert kv_gap(0.0) == kv_gap(0.8) == 0.2 and kv_gap(4.0) == 1.0 and kv_gap(60.0) == 2.0
    assert reads(0.41) == 3 and reads(2.0) <= 10 and reads(20.0) <= 25 and reads(600.0) <= 320


def measured(stub_url: str, **spec: int) -> dict:
    session = HttpSession(stub_url, "m")
    try:
        return measure_on(session, {}, WorkloadSpec(prompt_len=4, warmup_requests=0, **spec), Price(),
                          {"arm": "candidate"})
    finally:
        session.close()


def test_a_run_whose_client_is_the_bottleneck_is_void_and_says_why(monkeypatch):
    """A client that spends 5 ms of CPU on every read (a deliberately slowed client): its process is busy and its
    loop late, so the run measured the client, not the server: void, with the reason, in the record."""
    feed = Tally.feed

    def slow(self: Tally, data: bytes) -> bool:
        until = time.thread_time() + 0.005
        while time.thread_time() < until:
            pass
        return feed(self, data)

    with StubServer(Behaviour(chunk_delay_s=0.002)) as stub:
        fine = measured(stub.url, num_requests=8, output_len=20, concurrency=4)
        monkeypatch.setattr(Tally, "feed", slow)
        slowed = measured(stub.url, num_requests=16, output_len=40, concurrency=8)
    assert fine["status"] == "ok" and not client_bound(fine["client"]) and fine["client"]["loop_lag_s"]["n"] > 0
    assert slowed["status"] == "void" and slowed["void"] == slowed["reason"] == client_bound(slowed["client"])
    assert "the client was the bottleneck" in slowed["void"] and one_line(slowed, Price()).startswith("VOID: ")


@pytest.mark.parametrize(("load", "void"), [({"cpu_share": 0.5, "loop_lag_s": {"p99": 0.01}}, False),
                                            ({"cpu_share": 0.95, "loop_lag_s": {"p99": 0.01}}, True),
                                            ({"cpu_share": 0.4, "loop_lag_s": {"p99": 0.2}}, True),
                                            # late while mostly idle: other processes had the cores (a loaded
                                            # machine, as the suite's integration tier beside its other tiers)
                                            ({"cpu_share": 0.1, "loop_lag_s": {"p99": 0.153}}, False),
                                            ({"cpu_share": 0.3, "loop_lag_s": {"p99": None}}, False), (None, False)])
def test_a_client_near_a_core_or_busy_with_a_late_loop_is_the_bottleneck(load, void):
    assert bool(client_bound(load)) is void


def test_a_void_replicate_stops_its_comparison_blaming_the_client_and_it_is_measured_again():
    records = {0: {"arm": "baseline", "status": "ok", "position": 0},
               1: {"arm": "candidate", "status": "void", "void": "the client was the bottleneck", "position": 1}}
    fault = fault_of(records)
    assert fault is not None and fault.blame == "client" and settle(records, 4) == "redo"
