"""backend=endpoint against stub servers (no vLLM): bad input is refused before any work with the key named,
a compare alternates between two servers, and the API key reaches the server but never a file."""

from __future__ import annotations

import json
import re
import socket
import time

import pytest
from rich.console import Console

from tests.helpers import compose_cfg
from tests.stub_openai import Behaviour, StubServer
from throttle_sweep.commands import compare as compare_cmd
from throttle_sweep.commands import measure as measure_cmd
from throttle_sweep.commands import sweep as sweep_cmd
from throttle_sweep.errors import ConfigError
from throttle_sweep.store.records import read_records

WORK = ["backend=endpoint", "workload.num_requests=8", "workload.output_len=8", "workload.prompt_len=8",
        "workload.warmup_requests=0", "plots=false"]


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_an_unreachable_endpoint_is_named_before_anything_runs(tmp_path):
    with StubServer() as up:
        cfg = compose_cfg(*WORK, "mode=compare", f"endpoint.baseline_url={up.url}",
                          f"endpoint.candidate_url={closed_port()}", tmp_path=tmp_path)
        began = time.monotonic()
        with pytest.raises(ConfigError, match=r"endpoint.candidate_url=http://127.0.0.1:\d+ cannot be reached"):
            compare_cmd.run(cfg, Console(quiet=True))
    assert time.monotonic() - began < 15 and not list(tmp_path.iterdir())  # no results folder: nothing started
    assert not up.requests


@pytest.mark.parametrize(("overrides", "says"), [
    (["mode=compare", "endpoint.url={url}", "candidate.max_num_seqs=4"], "cannot set their flags (candidate.max_num_seqs=4)"),
    (["mode=sweep", "+space=batching", "endpoint.url={url}"], "not mode=sweep"),
    (["mode=measure"], "needs endpoint.url=URL"),
    (["mode=measure", "endpoint.url=127.0.0.1:8000"], "endpoint.url must be an http(s) URL"),
    (["mode=measure", "endpoint.url=http://me:hunter2@127.0.0.1:8000"], "endpoint.url carries credentials"),
    (["mode=measure", "endpoint.url={url}", "endpoint.request_timeout_s=0"], "endpoint.request_timeout_s must be"),
])
def test_what_an_endpoint_cannot_do_is_refused_with_the_key_named(tmp_path, overrides, says):
    with StubServer() as stub:
        cfg = compose_cfg(*WORK, *(o.format(url=stub.url) for o in overrides), tmp_path=tmp_path)
        command = {"compare": compare_cmd, "sweep": sweep_cmd, "measure": measure_cmd}[cfg.mode]
        with pytest.raises(ConfigError, match=re.escape(says)):
            command.run(cfg, Console(quiet=True))
    assert not stub.requests


def test_a_server_that_is_not_vllm_is_refused(tmp_path):
    with StubServer(Behaviour(vllm_metrics=False)) as stub:
        cfg = compose_cfg(*WORK, "mode=measure", f"endpoint.url={stub.url}", tmp_path=tmp_path)
        with pytest.raises(ConfigError, match="no vllm:num_preemptions_total"):
            measure_cmd.run(cfg, Console(quiet=True))


def test_a_compare_alternates_between_two_servers_and_keeps_the_key_out_of_every_file(tmp_path, monkeypatch):
    monkeypatch.setenv("STUB_KEY", "sk-very-secret")
    with StubServer(Behaviour(chunk_delay_s=0.02)) as b, StubServer(Behaviour(chunk_delay_s=0.005)) as c:
        cfg = compose_cfg(*WORK, "mode=compare", "run=ep", f"endpoint.baseline_url={b.url}",
                          f"endpoint.candidate_url={c.url}", "endpoint.api_key_env=STUB_KEY",
                          "workload.warmup_requests=2", tmp_path=tmp_path)
        assert compare_cmd.run(cfg, Console(quiet=True)) == 0
    records = read_records(tmp_path / "ep" / "replicates.jsonl")
    measured = [r for r in records if r["status"] == "ok"]
    assert [r["flags"]["url"] for r in measured] == [b.url if r["arm"] == "baseline" else c.url for r in measured]
    assert {r["arm"] for r in measured} == {"baseline", "candidate"} and len(measured) == 8
    assert all(r["output_tokens"] == 64 and r["flags"]["model"] == "stub-model" for r in measured)
    assert all(r["prefix_cache_reset"] is False for r in measured)  # not our server: its cache is left alone
    assert b.resets == c.resets == 0 and not b.posts and not c.posts
    assert all(r["kv_cache"] == {"blocks": 100, "block_size": 16} for r in measured)  # from vllm:cache_config_info
    assert set(b.auth) == set(c.auth) == {"Bearer sk-very-secret"}
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert "sk-very-secret" not in path.read_text(errors="replace"), path
    summary = json.loads((tmp_path / "ep" / "summary.json").read_text())
    assert summary["ratio"] < 0.6  # the candidate's stub streams four times as fast


def test_an_api_key_a_header_cannot_carry_is_refused_naming_the_variable_only(tmp_path, monkeypatch):
    monkeypatch.setenv("STUB_KEY", "sk-secret-from-a-crlf-file\r\nX: 1")
    with StubServer() as stub:
        cfg = compose_cfg(*WORK, "mode=measure", f"endpoint.url={stub.url}", "endpoint.api_key_env=STUB_KEY",
                          tmp_path=tmp_path)
        with pytest.raises(ConfigError, match=r"\$STUB_KEY") as caught:
            measure_cmd.run(cfg, Console(quiet=True))
    assert "sk-secret" not in str(caught.value)
