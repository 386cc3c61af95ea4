"""A streaming OpenAI-compatible stub fast enough not to be what limits a client: every response is a list of
pre-encoded frames (SSE chunks in HTTP/1.1 chunked encoding, cached per prompt and output length), and one
step loop hands each open stream its next frame per step, as a vLLM server emits one chunk per request per
engine step. So the Python per token is one `transport.write` per frame, and `chunks_per_write` puts several
steps' chunks in one frame where the stub itself would otherwise be the limit.

A stream whose client has not read what it was sent (more than WRITE_LIMIT bytes waiting) skips the step, so a
slow client slows its own streams and nothing piles up. `python -m tests.fast_stub PORT_FILE [TOKENS_PER_CHUNK
[CHUNKS_PER_WRITE]]` serves until killed (`FastStubProcess` below starts one); `raw_rate` is a client that
does nothing but count, to show the stub's own ceiling."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WRITE_LIMIT = 1 << 16
METRICS = (b'vllm:num_preemptions_total{engine="0"} 0.0\nvllm:kv_cache_usage_perc{engine="0"} 0.25\n'
           b'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="101"} 1.0\n')
MODELS = json.dumps({"object": "list", "data": [{"id": "stub-model", "root": "stub-model"}]}).encode()
STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def plain(body: bytes, status: str = "200 OK") -> bytes:
    return f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


def sse(event: dict) -> bytes:
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


def frames(prompt: int, want: int, per_chunk: int, per_write: int) -> list[bytes]:
    """One response's frames: chunks of `per_chunk` token ids with vLLM's running usage, `per_write` chunks a
    frame, the last frame ending the stream as vLLM does (a usage-only chunk, [DONE], the chunked end)."""
    chunks, sent = [], 0
    while sent < want:
        n = min(per_chunk, want - sent)
        sent += n
        choice = {"index": 0, "text": "", "token_ids": list(range(n)), "finish_reason": "length" if sent == want
                  else None}
        chunks.append(sse({"choices": [choice], "usage": {"prompt_tokens": prompt, "completion_tokens": sent}}))
    chunks[-1] += sse({"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": sent}})
    chunks[-1] += b"data: [DONE]\n\n"
    out = []
    for i in range(0, len(chunks), per_write):
        data = b"".join(chunks[i:i + per_write])
        out.append(b"%x\r\n%s\r\n" % (len(data), data))
    out[-1] += b"0\r\n\r\n"
    return out


class Server:
    def __init__(self, tokens_per_chunk: int = 1, chunks_per_write: int = 1) -> None:
        self.per_chunk, self.per_write = tokens_per_chunk, chunks_per_write
        self.cache: dict[tuple[int, int], list[bytes]] = {}
        self.streams: list[list] = []  # [transport, frames, next index]
        self.woken = asyncio.Event()

    def respond(self, transport: asyncio.Transport, method: bytes, path: bytes, body: bytes) -> None:
        if method == b"GET":
            transport.write(plain(METRICS if path == b"/metrics" else MODELS if path == b"/v1/models" else b""))
        elif path != b"/v1/completions":
            transport.write(plain(b""))  # reset_prefix_cache, sleep, wake_up
        else:
            request = json.loads(body)
            prompt = request["prompt"]
            key = (len(prompt) if isinstance(prompt, list) else len(str(prompt).split()), request["max_tokens"])
            if key not in self.cache:
                self.cache[key] = frames(*key, self.per_chunk, self.per_write)
            transport.write(STREAM_HEAD)
            self.streams.append([transport, self.cache[key], 0])
            self.woken.set()

    async def step(self) -> None:
        """Every open stream its next frame, once a step; streams whose client lags skip a step."""
        while True:
            if not self.streams:
                self.woken.clear()
                await self.woken.wait()
            kept = []
            for stream in self.streams:
                transport, out, i = stream
                if transport.is_closing():
                    continue
                if transport.get_write_buffer_size() < WRITE_LIMIT:
                    transport.write(out[i])
                    stream[2] = i = i + 1
                if i < len(out):
                    kept.append(stream)
            self.streams = kept
            await asyncio.sleep(0)


class Connection(asyncio.Protocol):
    def __init__(self, server: Server) -> None:
        self.server, self.buffer = server, b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            head = self.buffer[:end].split(b"\r\n")
            method, path, _ = head[0].split(b" ", 2)
            length = next((int(h.split(b":", 1)[1]) for h in head[1:] if h.lower().startswith(b"content-length:")), 0)
            if len(self.buffer) < end + 4 + length:
                return
            body, self.buffer = self.buffer[end + 4:end + 4 + length], self.buffer[end + 4 + length:]
            self.server.respond(self.transport, method, path, body)


async def serve(port_file: str, tokens_per_chunk: int, chunks_per_write: int) -> None:
    server = Server(tokens_per_chunk, chunks_per_write)
    listening = await asyncio.get_running_loop().create_server(lambda: Connection(server), "127.0.0.1", 0,
                                                               backlog=4096)
    Path(port_file).write_text(f"http://127.0.0.1:{listening.sockets[0].getsockname()[1]}")
    await server.step()


class FastStubProcess:
    """The fast stub in a process of its own; `base_url` once it listens."""

    def __init__(self, folder: Path, tokens_per_chunk: int = 1, chunks_per_write: int = 1) -> None:
        port_file = folder / f"fast-stub-{time.monotonic_ns()}"
        self.process = subprocess.Popen([sys.executable, "-m", "tests.fast_stub", str(port_file),
                                         str(tokens_per_chunk), str(chunks_per_write)], cwd=ROOT)
        while not port_file.exists() or not port_file.read_text():
            time.sleep(0.02)
        self.base_url = port_file.read_text()

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


async def raw_rate(url: str, requests: int, concurrency: int, output_len: int, prompt_len: int = 32) -> float:
    """Requests per second through a client that only sends and waits for each stream's end (closed loop,
    one keep-alive connection per slot): the stub's own ceiling."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"model": "stub-model", "prompt": list(range(prompt_len)), "max_tokens": output_len,
                       "stream": True}).encode()
    request = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    left = requests

    async def slot() -> None:
        nonlocal left
        reader, writer = await asyncio.open_connection(host, int(port))
        while left > 0:
            left -= 1
            writer.write(request)
            tail = b""
            while not tail.endswith(b"0\r\n\r\n"):
                tail = (tail + await reader.read(1 << 16))[-16:]
        writer.close()

    began = time.perf_counter()
    await asyncio.gather(*(slot() for _ in range(min(concurrency, requests))))
    return requests / (time.perf_counter() - began)


if __name__ == "__main__":
    sizes = [int(a) for a in sys.argv[2:4]]
    asyncio.run(serve(sys.argv[1], *sizes, *[1] * (2 - len(sizes))))
