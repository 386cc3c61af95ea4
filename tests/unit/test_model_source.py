"""The hub's answers about a model, named before any engine starts: a loopback stub hub answers as the
Hugging Face hub does (its X-Error-Code header), so no request leaves this machine."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from throttle_sweep.engines import model_source
from throttle_sweep.errors import ConfigError


class Hub(BaseHTTPRequestHandler):
    answers = {"org/missing": (401, "RepoNotFound"), "org/gated": (403, "GatedRepo"), "org/ok": (200, None)}

    def do_HEAD(self):  # noqa: N802 - http.server's name
        repo = "/".join(self.path.strip("/").split("/")[:2])
        status, code = self.answers.get(repo, (404, "EntryNotFound"))
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        if status == 200:
            self.send_header("ETag", '"abc"')
            self.send_header("X-Repo-Commit", "0" * 40)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture()
def hub(monkeypatch, tmp_path):
    import huggingface_hub.constants as constants

    server = HTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_port}"
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    model_source._problem.cache_clear()
    yield
    server.shutdown()
    model_source._problem.cache_clear()


@pytest.mark.parametrize("model, said", [
    ("org/missing", "no such model on the hub, or a private one"),
    ("org/gated", "a gated model this machine's token may not read yet"),
])
def test_the_hubs_answer_is_named(hub, model, said):
    with pytest.raises(ConfigError, match=f"engine.model='{model}': {said}"):
        model_source.check_model_reachable(model, source="engine")


def test_a_model_the_hub_serves_passes(hub):
    model_source.check_model_reachable("org/ok", source="engine")
