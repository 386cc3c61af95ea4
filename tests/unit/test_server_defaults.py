"""backend=server learns the batch defaults it serves without the server's dev-mode `/server_info` (#45,
finding 6d): on a GPU that endpoint runs vLLM's environment collection (it initialises CUDA in the API server
and runs pip, conda and nvidia-smi) within the start's limit, which only a real GPU shows. Here the server is
the stub (which has no `/server_info`), and vLLM's own resolution of the defaults is mocked: the unit tier
never imports vLLM (tests/integration/test_vllm_serve_cli.py checks it against a real server)."""

from __future__ import annotations

from types import SimpleNamespace

from tests.stub_openai import StubServer
from throttle_sweep.engines import vllm_server

SERVED = {"max_num_seqs": 1024, "max_num_batched_tokens": 8192}  # vLLM's for `vllm serve` on an H100


def test_the_served_defaults_are_resolved_as_vllm_serve_does_without_asking_the_server(monkeypatch, tmp_path):
    asked: list[dict] = []

    def resolve(flags):
        asked.append(dict(flags))
        return dict(SERVED)

    with StubServer() as stub:
        port = int(stub.url.rsplit(":", 1)[1])
        alive = SimpleNamespace(poll=lambda: None, pid=-1, returncode=None)  # the stub stands for the server
        monkeypatch.setattr(vllm_server, "served_batch_defaults", resolve)
        monkeypatch.setattr(vllm_server, "cpu_build", lambda: True)  # no GPU memory wait
        monkeypatch.setattr(vllm_server, "free_port", lambda: port)
        monkeypatch.setattr(vllm_server, "launch", lambda argv, log_path: alive)
        monkeypatch.setattr(vllm_server, "stop_server", lambda process, port, grace_s: None)
        engine = vllm_server.VllmServerEngine(log_dir=tmp_path)
        session = engine.start({"model": "stub-model", "max_model_len": 1024})
        try:
            assert session.served_defaults == SERVED and session.max_num_seqs == 1024
            assert asked and asked[0]["model"] == "stub-model" and asked[0]["max_model_len"] == 1024
        finally:
            session.close()
