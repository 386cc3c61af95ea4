"""An engine session over HTTP: the fixed workload driven through an OpenAI-compatible server's streaming
`/v1/completions`, and vLLM's counters read from its Prometheus `/metrics`.

The workload drivers (measurement/workload.py) step a session; here a step waits for the next streamed chunks. The
requests themselves stream concurrently on an asyncio loop in a background thread (aiohttp; httpx for the
control calls), and every read is stamped on arrival, so TTFT and inter-token gaps are the client's view, as a
production client sees them (chunks that come in one read arrived together: one arrival). A chunk can carry
several tokens: tokens are counted from the server's running `usage` (vLLM's `continuous_usage_stats`), and
the total is checked against the token ids received.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import re
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import httpx

from throttle_sweep.engines.base import Request, StepEvent, WallClock
from throttle_sweep.errors import EngineRunError

WAIT_SLICE_S = 0.5  # how often a waiting step checks that the server is still there
# KV-cache usage is sampled from /metrics while requests are in flight: every KV_SAMPLE_S at first, then at a
# quarter of the time since the first request went out, at most every KV_SAMPLE_MAX_S. Each read costs vLLM's API
# server 4-8 ms on its event loop (benchmarks/vs_vllm_bench.py: at 40 req/s a reader every 0.2 s beside vLLM's
# own client doubled its p95 TTFT), so a 20 s run is read 22 times, not 100; a short run is still read every
# 0.2 s (read less often from its start, a 0.4 s run's peak was missed). The sampler starts afresh whenever
# requests are in flight again.
KV_SAMPLE_S, KV_SAMPLE_SHARE, KV_SAMPLE_MAX_S = 0.2, 0.25, 2.0
SETTLE_S = 0.05  # between two reads of a counter that must agree
LAG_TICK_S = 0.01  # while requests are in flight the loop is asked to wake this often; how late it wakes is its lag


def kv_gap(in_flight_s: float) -> float:
    """How long the KV sampler waits after a read, `in_flight_s` after it started (see KV_SAMPLE_S)."""
    return min(KV_SAMPLE_MAX_S, max(KV_SAMPLE_S, KV_SAMPLE_SHARE * in_flight_s))


def samples(text: str) -> Iterator[tuple[str, str, float]]:
    """(name, label text, value) of every sample in Prometheus text format; comments and bad lines skipped."""
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, _, labels = head.partition("{")
        try:
            number = float(value)
        except ValueError:
            continue
        yield name.strip(), labels.rpartition("}")[0], number


def parse_metrics(text: str) -> dict[str, float]:
    """{metric name: value summed over its label sets}: counters such as preemptions, over every engine."""
    out: dict[str, float] = {}
    for name, _, value in samples(text):
        out[name] = out.get(name, 0.0) + value
    return out


def gauge_max(text: str, name: str) -> float | None:
    """The largest value of gauge `name` over its label sets (one per engine of a data-parallel server: a
    fraction such as KV usage is not summed), or None if absent."""
    return max((value for found, _, value in samples(text) if found == name), default=None)


def metric_labels(text: str, name: str) -> dict[str, str]:
    """The labels of metric `name`'s first sample (vLLM's `vllm:cache_config_info` carries its KV cache
    configuration as labels): {} if absent."""
    labels = next((labels for found, labels, _ in samples(text) if found == name and labels), "")
    return dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', labels))


@dataclass(frozen=True)
class Chunk:
    """What the stream of one request said so far, stamped when it arrived."""

    request_id: str
    output_tokens: int
    finished: bool
    prompt_tokens: int
    at_s: float


class StreamFailed(Exception):
    def __init__(self, request_id: str, reason: str) -> None:
        super().__init__(f"request {request_id}: {reason}")


class Tally:
    """What one request's stream has said so far, fed the bytes of each read as they come: the server-sent
    events complete in a read are decoded with one `json.loads` (a read at a high rate carries many), and
    only what a count needs is looked at. Raises StreamFailed for a chunk that is not a JSON object or that
    carries an error."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.rest = b""  # an incomplete last line, kept for the next read
        self.received = 0  # token ids that arrived
        self.counted = 0  # output tokens: the server's running usage, or the ids where it gives none
        self.prompt_tokens = 0
        self.finished = False  # a choice said why it finished
        self.done = False  # [DONE] arrived

    def feed(self, data: bytes) -> bool:
        """Take one read's bytes; True if the output token count went up."""
        lines = (self.rest + data).split(b"\n")
        self.rest = lines.pop()
        payloads = []
        for line in lines:
            if line.startswith(b"data:"):
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    self.done = True
                    break
                payloads.append(payload)
        if not payloads:
            return False
        try:
            chunks = json.loads(b"[" + b",".join(payloads) + b"]")
        except ValueError:
            chunks = [self.decode(p) for p in payloads]  # names the chunk that is not JSON
        before = self.counted
        for chunk in chunks:
            self.take(chunk)
        return self.counted > before

    def decode(self, payload: bytes) -> Any:
        try:
            return json.loads(payload)
        except ValueError:
            raise StreamFailed(self.request_id, f"a chunk that is not JSON: {payload[:200]!r}") from None

    def take(self, chunk: Any) -> None:
        if not isinstance(chunk, dict):
            raise StreamFailed(self.request_id, f"a chunk that is not a JSON object: {json.dumps(chunk)[:200]}")
        if "error" in chunk:
            raise StreamFailed(self.request_id, f"the server answered with an error: {chunk['error']}")
        for choice in chunk.get("choices") or ():
            self.received += len(choice.get("token_ids") or ())
            self.finished = self.finished or bool(choice.get("finish_reason"))
        usage = chunk.get("usage") or {}
        self.prompt_tokens = usage.get("prompt_tokens") or self.prompt_tokens
        counted = usage.get("completion_tokens")
        if not isinstance(counted, int):  # no running usage: count the token ids themselves
            counted = self.received
        self.counted = max(self.counted, counted)


class HttpSession(WallClock):
    """EngineSession over an OpenAI-compatible server at `base_url` serving `model`."""

    def __init__(self, base_url: str, model: str, *, headers: Mapping[str, str] | None = None,
                 request_timeout_s: float = 600.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.start_seconds = 0.0
        self.max_num_seqs: int | None = None
        self.kv_blocks: int | None = None
        self.kv_block_size: int | None = None
        self._headers = dict(headers or {})
        self._timeout = httpx.Timeout(request_timeout_s, connect=10.0)
        self._control = httpx.Client(base_url=self.base_url, headers=self._headers, timeout=30.0)
        self._events: queue.Queue[Chunk | StreamFailed] = queue.Queue()
        self._open = 0  # requests added and not yet finished or failed
        self._kv_peak = 0.0
        self._kv_lock = threading.Lock()  # the loop thread samples, the driver's thread reads and resets
        self.prefix_cache_reset: bool | None = None  # did the last reset work (None: not tried)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="throttle-sweep-http", daemon=True)
        self._thread.start()
        self._client: httpx.AsyncClient = self._call(self._new_client())
        self._streams: aiohttp.ClientSession = self._call(self._new_streams(request_timeout_s))
        self._sampler: Any = None
        self._watcher: Any = None
        self._lags: list[float] = []  # how late the loop woke, each LAG_TICK_S (appended there, swapped here)
        self._load_since = (time.perf_counter(), time.process_time())

    # ---- the loop thread ------------------------------------------------------------------------------
    async def _new_client(self) -> httpx.AsyncClient:
        # no connection cap: the closed loop's concurrency is the cap, and a pool limit would hide queueing
        return httpx.AsyncClient(base_url=self.base_url, headers=self._headers, timeout=self._timeout,
                                 limits=httpx.Limits(max_connections=None, max_keepalive_connections=None))

    async def _new_streams(self, request_timeout_s: float) -> aiohttp.ClientSession:
        """The completions' streams: aiohttp, whose C parser reads a stream for less CPU than httpx (see
        benchmarks/client_ceiling.py); no connection cap either."""
        return aiohttp.ClientSession(headers=self._headers, connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=request_timeout_s, sock_connect=10.0))

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _stream(self, request: Request) -> None:
        body: dict[str, Any] = {
            "model": self.model, "max_tokens": request.output_len, "min_tokens": request.output_len,
            "ignore_eos": True, "temperature": 1.0, "stream": True, "return_token_ids": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "prompt": list(request.prompt_token_ids) if request.prompt_token_ids is not None else request.prompt_text,
        }
        tally, last = Tally(request.id), time.perf_counter()
        try:
            async with self._streams.post(f"{self.base_url}/v1/completions", json=body) as response:
                if response.status != 200:
                    text = (await response.read()).decode(errors="replace")
                    raise StreamFailed(request.id, f"HTTP {response.status}: {text[:300]}")
                async for data in response.content.iter_any():
                    now = time.perf_counter()
                    if tally.feed(data):  # more tokens: one event for all that this read brought
                        last = now
                        self._events.put(Chunk(request.id, tally.counted, False, tally.prompt_tokens, now))
                    if tally.done:
                        break
        except StreamFailed as exc:
            self._events.put(exc)
            return
        except Exception as exc:  # noqa: BLE001 - whatever broke the stream fails its request, never hangs the run
            self._events.put(StreamFailed(request.id, f"{type(exc).__name__}: {exc}"))
            return
        if not tally.finished:
            self._events.put(StreamFailed(request.id, f"the stream ended before the request finished "
                                                      f"({tally.counted} of {request.output_len} tokens)"))
        elif tally.received and tally.received != tally.counted:  # token ids sent must agree with the usage
            self._events.put(StreamFailed(request.id, f"the server's usage says {tally.counted} output tokens, but "
                                                      f"{tally.received} token ids arrived"))
        else:
            self._events.put(Chunk(request.id, tally.counted, True, tally.prompt_tokens, last))

    async def _sample_kv(self) -> None:
        began = time.monotonic()
        while True:
            try:
                response = await self._client.get("/metrics", timeout=5.0)
                usage = gauge_max(response.text, "vllm:kv_cache_usage_perc")
                if usage is not None:
                    with self._kv_lock:
                        self._kv_peak = max(self._kv_peak, usage)
            except httpx.HTTPError:
                pass  # a missed sample; a dead server shows in the streams themselves
            await asyncio.sleep(kv_gap(time.monotonic() - began))

    async def _watch_lag(self) -> None:
        while True:
            began = time.perf_counter()
            await asyncio.sleep(LAG_TICK_S)
            self._lags.append(max(0.0, time.perf_counter() - began - LAG_TICK_S))

    def client_load(self) -> dict[str, Any]:
        """How loaded this client was since the last call: the CPU share of this process (its threads share
        one interpreter lock, so 1.0 is the most its Python can use) and the streams' loop lag (p50/p99/max, s,
        sampled while requests were in flight). A client near either limit measured itself, not the server."""
        wall, cpu = time.perf_counter(), time.process_time()
        lags, self._lags = sorted(self._lags), []
        (was_wall, was_cpu), self._load_since = self._load_since, (wall, cpu)
        def at(q: float) -> float | None:
            return lags[min(len(lags) - 1, int(q * len(lags)))] if lags else None
        return {"cpu_share": (cpu - was_cpu) / (wall - was_wall) if wall > was_wall else 0.0,
                "loop_lag_s": {"p50": at(0.5), "p99": at(0.99), "max": at(1.0), "n": len(lags)}}

    # ---- EngineSession --------------------------------------------------------------------------------
    def begin_replicate(self, index: int) -> None:
        self.reset_prefix_cache()

    def add(self, request: Request) -> None:
        self._open += 1
        if self._sampler is None:
            self._sampler = asyncio.run_coroutine_threadsafe(self._sample_kv(), self._loop)
            self._watcher = asyncio.run_coroutine_threadsafe(self._watch_lag(), self._loop)
        asyncio.run_coroutine_threadsafe(self._stream(request), self._loop)

    def step(self) -> list[StepEvent]:
        """The chunks that arrived since the last step; waits for at least one."""
        return self.step_until(None)

    def step_until(self, deadline: float | None) -> list[StepEvent]:
        """As step, but waits no later than `deadline` (on now()'s clock; an open loop's next arrival, so that
        the driver sends it when it is due, not at the next chunk): then returns what arrived, maybe nothing."""
        items = []
        while not items:
            wait = WAIT_SLICE_S if deadline is None else min(WAIT_SLICE_S, deadline - self.now())
            if wait <= 0:
                return []
            try:
                items.append(self._events.get(timeout=wait))
            except queue.Empty:
                self.check_alive()
        while True:
            try:
                items.append(self._events.get_nowait())
            except queue.Empty:
                break
        events = []
        for item in items:
            if isinstance(item, StreamFailed):
                self._open -= 1
                raise EngineRunError(self.explain(str(item)))
            if item.finished:
                self._open -= 1
            events.append(StepEvent(item.request_id, item.output_tokens, item.finished, item.prompt_tokens,
                                    at_s=item.at_s))
        if not self._open and self._sampler is not None:
            self._sampler.cancel()
            self._watcher.cancel()
            self._sampler = self._watcher = None
        return events

    def has_unfinished(self) -> bool:
        return self._open > 0

    def kv_cache_usage(self) -> float:
        """The highest KV usage sampled since the last call (the driver keeps the peak of a run; a warm server's
        next replicate must not inherit this one's)."""
        with self._kv_lock:
            peak, self._kv_peak = self._kv_peak, 0.0
        return peak

    def metrics_text(self) -> str:
        try:
            response = self._control.get("/metrics")
            response.raise_for_status()
        except httpx.HTTPError as exc:
            why = f"cannot read {self.base_url}/metrics: {type(exc).__name__}: {exc}"
            raise EngineRunError(self.explain(why)) from None
        return response.text

    def metrics(self) -> dict[str, float]:
        return parse_metrics(self.metrics_text())

    def read_kv_capacity(self) -> None:
        """KV blocks (less vLLM's null block, as the in-process engine counts them) and tokens per block, from
        the server's `vllm:cache_config_info`; left None where it does not say."""
        labels = metric_labels(self.metrics_text(), "vllm:cache_config_info")
        with contextlib.suppress(KeyError, ValueError):
            self.kv_block_size = int(labels["block_size"])
        with contextlib.suppress(KeyError, ValueError):
            blocks = int(labels["num_gpu_blocks"])
            self.kv_blocks = blocks - 1 if blocks > 1 else None

    def preemptions(self) -> int:
        """vLLM's counter, once two reads agree: the server may record an iteration's stats just after the
        client has its last token (read outside the measured window, so the wait costs no measured time)."""
        count, deadline = self._counter("vllm:num_preemptions_total"), time.monotonic() + 2.0
        while time.monotonic() < deadline:
            time.sleep(SETTLE_S)
            again = self._counter("vllm:num_preemptions_total")
            if again == count:
                break
            count = again
        return count

    def _counter(self, name: str) -> int:
        return int(self.metrics().get(name, 0))

    def prefix_cache(self) -> tuple[int, int]:
        m = self.metrics()
        return int(m.get("vllm:prefix_cache_queries_total", 0)), int(m.get("vllm:prefix_cache_hits_total", 0))

    def reset_prefix_cache(self) -> None:
        """vLLM's dev-mode endpoint (VLLM_SERVER_DEV_MODE=1): a server without it keeps its cache, and says so.
        vLLM answers 200 with {"success": false} while blocks are still held: tried again for up to a second."""
        deadline = time.monotonic() + 1.0
        while True:
            try:
                response = self._control.post("/reset_prefix_cache")
            except httpx.HTTPError as exc:
                raise EngineRunError(self.explain(f"cannot reset the prefix cache: {type(exc).__name__}: {exc}")
                                     ) from None
            try:
                said = response.json()
            except ValueError:
                said = None
            self.prefix_cache_reset = response.status_code == 200 and not (
                isinstance(said, dict) and said.get("success") is False)
            if self.prefix_cache_reset or response.status_code != 200 or time.monotonic() > deadline:
                return
            time.sleep(SETTLE_S)

    def check_alive(self) -> None:
        """Raise EngineRunError if the server is gone (a server this session owns knows more: see subclasses)."""

    def explain(self, reason: str) -> str:
        return reason

    async def _wind_down(self) -> None:
        """Cancel the streams still open (a failed replicate leaves some), then close the connections."""
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._client.aclose()
        await self._streams.close()
        await asyncio.get_running_loop().shutdown_asyncgens()  # the streams' line iterators, finalised here

    def close(self) -> None:
        try:
            self._call(self._wind_down())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            if not self._thread.is_alive():
                self._loop.close()
            self._control.close()
