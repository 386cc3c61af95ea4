"""The server engine with real server processes (Python stand-ins for vLLM's API server, no vLLM): a session
puts its server to sleep and wakes it, then ends its process group; a server that fails after it was healthy
is stopped."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.stub_openai import StubServer
from throttle_sweep.engines.vllm_server import ServerSession, VllmServerEngine
from throttle_sweep.errors import EngineRunError


def test_a_server_session_sleeps_and_wakes_through_vllms_dev_endpoints(tmp_path):
    """A GPU slot keeping two warm servers puts the idle one to sleep (level 1) and wakes it for its turn."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    with StubServer() as stub:
        port = int(stub.url.rsplit(":", 1)[1])
        session = ServerSession(process, port, tmp_path / "log", "m", request_timeout_s=10, stop_grace_s=2)
        session.sleep()
        session.wake()
    session.close()  # the stub is gone, so its port is free; the stand-in server's group is ended
    assert stub.posts == ["/sleep?level=1", "/wake_up"] and process.poll() is not None


HEALTHY_WITHOUT_METRICS = """
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 500)
        self.send_header("Content-Length", "0")
        self.end_headers()
HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""

def test_a_server_that_fails_after_it_is_healthy_is_not_left_running(tmp_path, monkeypatch):
    """Healthy, then its /metrics fails: the start fails, and the server (a stand-in here) is stopped."""
    from throttle_sweep.engines import vllm_server

    started = []

    def launch(argv, log_path):
        port = argv[argv.index("--port") + 1]
        started.append(subprocess.Popen([sys.executable, "-c", HEALTHY_WITHOUT_METRICS, port],
                                        start_new_session=True))
        return started[-1]

    monkeypatch.setattr(vllm_server, "launch", launch)
    with pytest.raises(EngineRunError, match="metrics"):
        VllmServerEngine(log_dir=tmp_path, start_timeout_s=30, stop_grace_s=2).start({"max_num_seqs": 2})
    assert len(started) == 1 and started[0].poll() is not None
