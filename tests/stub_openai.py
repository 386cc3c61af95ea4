"""A minimal OpenAI-compatible streaming server for tests and the client benchmark: it answers at once (no
model), streams `tokens_per_chunk` token ids per chunk with vLLM's running usage, and can misbehave on
purpose (a usage that disagrees with the ids sent, a stream cut short, an HTTP error)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Behaviour:
    tokens_per_chunk: int = 1
    usage_extra: int = 0  # added to the usage's completion_tokens: a server that miscounts
    cut_after: int | None = None  # end the stream after this many tokens, without finishing
    status: int = 200
    preemptions: int = 0
    reset_status: int = 200  # /reset_prefix_cache (404 = a server without dev mode)
    vllm_metrics: bool = True  # False: a server that is not vLLM (no preemption counter)
    reset_body: bytes = b""  # vLLM answers {"success": false} while blocks are still held
    garbage: bytes | None = None  # sent as the first chunk's data instead of a JSON object
    null_usage: bool = False  # "completion_tokens": null in every chunk (count the ids instead)
    chunk_delay_s: float = 0.0


class StubServer:
    def __init__(self, behaviour: Behaviour | None = None) -> None:
        self.behaviour = behaviour or Behaviour()
        self.requests: list[dict] = []
        self.resets = 0
        self.metrics_reads = 0  # GET /metrics: each one costs a real server time on its event loop
        self.auth: list[str | None] = []  # the Authorization header of every completion request
        self.posts: list[str] = []  # every POST path other than completions (sleep, wake_up, reset)
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # the body ends when the connection closes: no chunked encoding

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                if self.path == "/health":
                    self._send(200, b"")
                elif self.path == "/v1/models":
                    models = [{"id": "stub-model", "root": "stub-model"}]  # vLLM's benchmark client reads root
                    self._send(200, json.dumps({"object": "list", "data": models}).encode(), "application/json")
                elif self.path == "/metrics" and not stub.behaviour.vllm_metrics:
                    self._send(200, b"http_requests_total 3.0\n")
                elif self.path == "/metrics":
                    stub.metrics_reads += 1
                    text = (f'vllm:num_preemptions_total{{engine="0"}} {stub.behaviour.preemptions}.0\n'
                            'vllm:kv_cache_usage_perc{engine="0"} 0.25\n'
                            '# HELP vllm:prefix_cache_hits_total hits\nvllm:prefix_cache_hits_total 3.0\n'
                            "vllm:prefix_cache_queries_total 12.0\n"
                            'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="101"} 1.0\n')
                    self._send(200, text.encode())
                else:
                    self._send(404, b"")

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                if self.path != "/v1/completions":
                    stub.posts.append(self.path)
                if self.path == "/reset_prefix_cache":
                    stub.resets += 1
                    self._send(stub.behaviour.reset_status, stub.behaviour.reset_body)
                    return
                if self.path.startswith(("/sleep", "/wake_up")):
                    self._send(200, b"")
                    return
                stub.requests.append(body)
                stub.auth.append(self.headers.get("Authorization"))
                b = stub.behaviour
                if b.status != 200:
                    self._send(b.status, b'{"error": "stub says no"}')
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                want, sent = body.get("max_tokens", 16), 0
                # a text prompt counts a token a word (as benchmarks/vs_vllm_bench.py's word-level tokenizer)
                prompt = len(body["prompt"]) if isinstance(body["prompt"], list) else len(str(body["prompt"]).split())
                if b.garbage is not None:
                    self.wfile.write(b"data: " + b.garbage + b"\n\n")
                    self.wfile.flush()
                while sent < want:
                    if b.cut_after is not None and sent >= b.cut_after:
                        return
                    n = min(b.tokens_per_chunk, want - sent)
                    sent += n
                    choice = {"index": 0, "text": "", "token_ids": list(range(n)),
                              "finish_reason": "length" if sent == want else None}
                    usage = {"prompt_tokens": prompt, "completion_tokens": None if b.null_usage else
                             sent + (b.usage_extra if sent == want else 0)}
                    self.wfile.write(f"data: {json.dumps({'choices': [choice], 'usage': usage})}\n\n".encode())
                    self.wfile.flush()
                    if b.chunk_delay_s:
                        time.sleep(b.chunk_delay_s)
                final = {"choices": [], "usage": {"prompt_tokens": prompt,
                                                  "completion_tokens": None if b.null_usage else sent + b.usage_extra}}
                self.wfile.write(f"data: {json.dumps(final)}\n\ndata: [DONE]\n\n".encode())  # as vLLM ends

            def _send(self, code: int, data: bytes, content_type: str | None = None) -> None:
                self.send_response(code)
                if content_type:
                    self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> StubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class StubProcess:
    """The stub in a process of its own (`main` below: streams at once, one token per chunk): the benchmarks'
    server, so that it does not share the client's interpreter."""

    def __init__(self, folder: Path) -> None:
        began, port_file = time.perf_counter(), folder / "stub-url"
        self.process = subprocess.Popen([sys.executable, "-m", "tests.stub_openai", str(port_file)], cwd=ROOT)
        while not port_file.exists() or not port_file.read_text():
            time.sleep(0.05)
        self.base_url, self.start_seconds = port_file.read_text(), time.perf_counter() - began

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


def main() -> None:
    """`python -m tests.stub_openai PORT_FILE [TOKENS_PER_CHUNK]`: serve until killed; the URL goes to PORT_FILE."""
    server = StubServer(Behaviour(tokens_per_chunk=int(sys.argv[2]) if len(sys.argv) > 2 else 1))
    with open(sys.argv[1], "w") as f:
        f.write(server.url)
    server.httpd.serve_forever()


if __name__ == "__main__":
    main()
