"""Fixed work: a seeded request set, and the drivers that push it through an engine session.

Every request produces exactly its output length (the engine sets ignore_eos), so the completed output
tokens of a replicate never move and its cost per token moves only with time.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from throttle_sweep.engines.base import EngineSession, Request
from throttle_sweep.errors import ConfigError
from throttle_sweep.measurement.trace import check_trace, trace_rows


@dataclass(frozen=True)
class WorkloadSpec:
    num_requests: int = 64
    prompt_len: int = 64
    output_len: int = 128
    length_dist: Literal["fixed", "uniform"] = "fixed"
    length_spread: float = 0.5  # uniform: lengths drawn from [L*(1-spread), L*(1+spread)]
    loop: Literal["closed", "open"] = "closed"
    concurrency: int = 8  # closed loop: requests kept in flight
    rate: float | None = None  # open loop: Poisson arrivals per second
    jsonl: str | None = None  # prompts from a file: {"prompt_token_ids": [...] | "prompt": "...", "output_len": N}
    sharegpt: str | None = None  # ShareGPT-style conversations (JSON): their prompt and reply lengths
    chars_per_token: float = 4.0  # ShareGPT text without a tokenizer: its length in tokens, estimated
    tokenizer: str | None = None  # a tokenizer (name or folder) to count and encode ShareGPT text with
    shared_prefix_len: int = 0  # every prompt starts with the same this-many tokens (a system prompt, an agent)
    warmup_requests: int | None = None  # null: one full batch of the engine (concurrency, or max_num_seqs if fewer)
    warmup_output_len: int = 16  # warm-up requests are short: they warm every batch size, not the clock
    seed: int = 0
    vocab_limit: int = 1000  # synthetic token ids are drawn below this (valid for any real vocabulary)
    replicate_s: float | None = None  # sized by time: num_requests is the calibration run's (calibration.py)
    # open loop: the arrivals' own random stream (null: `seed`). Replicates of a capacity run at one rate take
    # different ones, so that their spread includes which schedule was drawn (capacity/rates.py)
    arrival_seed: int | None = None
    # a timed trace replayed (trace.py): its lengths, shared prefix blocks and arrival times, in an open loop
    trace: str | None = None  # Mooncake JSONL, or a CSV/JSONL of arrival_s, prompt_tokens, output_tokens
    trace_speed: float = 1.0  # time scale: 2 replays it twice as fast
    trace_start_s: float = 0.0  # the window, on the trace's own clock: from here ...
    trace_span_s: float | None = None  # ... this long (null: to the end)
    trace_max_requests: int | None = None  # at most this many of the window's requests (null: all)
    trace_block_size: int = 512  # prompt tokens a Mooncake hash id stands for (512 in Mooncake's traces)

    def warmup_count(self, batch: int | None = None) -> int:
        """`batch`: the most the engine runs at once (max_num_seqs): more warm-up requests than that would only
        queue, and warm no batch size the run will see."""
        if self.warmup_requests is not None:
            return self.warmup_requests
        return min(self.concurrency, batch) if batch else self.concurrency

    def check(self, *, max_model_len: int | None, source: str = "workload") -> None:
        """Raise ConfigError naming the key for any value that cannot describe a fixed workload."""
        positive = {"num_requests": self.num_requests, "prompt_len": self.prompt_len,
                    "output_len": self.output_len, "concurrency": self.concurrency}
        for key, value in positive.items():
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{source}.{key} must be a positive integer, but got {value!r}")
        if self.warmup_requests is not None and (not isinstance(self.warmup_requests, int)
                                                 or self.warmup_requests < 0):
            raise ConfigError(f"{source}.warmup_requests must be >= 0 (or null), but got {self.warmup_requests!r}")
        if not isinstance(self.warmup_output_len, int) or self.warmup_output_len <= 0:
            raise ConfigError(f"{source}.warmup_output_len must be a positive integer, but got "
                              f"{self.warmup_output_len!r}")
        self._check_shape(source)
        self._check_sources(source)
        self._check_timed(source)
        if self.trace is not None:  # each line's lengths, named by its line
            check_trace(self, max_model_len=max_model_len, source=source)
        elif max_model_len is not None:
            longest = max(r.prompt_len + r.output_len for r in make_requests(self))
            if longest > max_model_len:
                raise ConfigError(
                    f"{source}: prompt + output length reaches {longest} tokens, beyond max_model_len="
                    f"{max_model_len}; lower {source}.output_len / prompt_len or raise engine.max_model_len")

    def _check_shape(self, source: str) -> None:
        """How lengths vary and how requests arrive."""
        if self.length_dist not in ("fixed", "uniform"):
            raise ConfigError(f"{source}.length_dist must be 'fixed' or 'uniform', but got {self.length_dist!r}")
        if not 0 <= self.length_spread < 1:
            raise ConfigError(f"{source}.length_spread must be in [0, 1), but got {self.length_spread!r}")
        if self.loop not in ("closed", "open"):
            raise ConfigError(f"{source}.loop must be 'closed' or 'open', but got {self.loop!r}")
        if self.loop == "open" and self.trace is None and (self.rate is None or self.rate <= 0):
            raise ConfigError(f"{source}.rate must be > 0 requests/s for an open loop, but got {self.rate!r}")

    def _check_timed(self, source: str) -> None:
        """Work sized by time: a closed loop over synthetic requests, whose count is free to grow."""
        if self.replicate_s is None:
            return
        if isinstance(self.replicate_s, bool) or not isinstance(self.replicate_s, int | float) \
                or not 0 < self.replicate_s < math.inf:
            raise ConfigError(f"{source}.replicate_s must be a positive number of seconds (or null), but got "
                              f"{self.replicate_s!r}")
        if self.loop != "closed":
            raise ConfigError(f"{source}.replicate_s sizes closed-loop work; an open loop lasts num_requests / "
                              f"rate seconds: set {source}.num_requests instead, with {source}.replicate_s=null")
        if self.num_requests < self.concurrency:
            raise ConfigError(f"{source}.replicate_s needs {source}.num_requests >= {source}.concurrency "
                              f"({self.num_requests} < {self.concurrency}): the calibration run must keep as many in "
                              "flight as every replicate after it")
        if self.jsonl is not None or self.sharegpt is not None:
            raise ConfigError(f"{source}.replicate_s sizes synthetic requests; a file's requests are counted by "
                              f"{source}.num_requests: set that, with {source}.replicate_s=null")

    def _check_sources(self, source: str) -> None:
        """Where requests come from: a file, and how prompt text is made."""
        for key in ("jsonl", "sharegpt", "trace"):
            if getattr(self, key) is not None and not Path(getattr(self, key)).is_file():
                raise ConfigError(f"{source}.{key}: no such file {getattr(self, key)!r}")
        if self.jsonl is not None and self.sharegpt is not None:
            raise ConfigError(f"{source}: give {source}.jsonl or {source}.sharegpt, not both")
        if not isinstance(self.shared_prefix_len, int) or self.shared_prefix_len < 0:
            raise ConfigError(f"{source}.shared_prefix_len must be an integer >= 0, but got {self.shared_prefix_len!r}")
        if not self.chars_per_token > 0:
            raise ConfigError(f"{source}.chars_per_token must be > 0, but got {self.chars_per_token!r}")


def _length(rng: random.Random, length_dist: str, spread: float, mean: int) -> int:
    if length_dist == "fixed":
        return mean
    return max(1, round(rng.uniform(mean * (1 - spread), mean * (1 + spread))))


# synthetic prompts are one stream of draws per seed and shape: the first n requests of any count are the same,
# so the stream is kept and extended (a capacity search asks for every count from 100 to thousands, run after
# run, and drawing the ids took a sixth of a goodput sweep's time on the fake engine)
_STREAMS: dict[tuple, tuple[random.Random, list[tuple[tuple[int, ...], None, int]]]] = {}
_STREAMS_LOCK = threading.Lock()
_STREAMS_KEPT = 8


def synthetic_rows(seed: int, vocab_limit: int, prompt_len: int, out_len: int, length_dist: str, spread: float,
                   count: int) -> list[tuple[tuple[int, ...], None, int]]:
    """The first `count` (prompt ids, None, output length) of the stream: for each request its prompt's
    length, its ids, then its output's length, drawn in that order from random.Random(seed)."""
    key = (seed, vocab_limit, prompt_len, out_len, length_dist, spread)
    with _STREAMS_LOCK:
        rng, rows = _STREAMS.pop(key, None) or (random.Random(seed), [])
        while len(rows) < count:
            ids = tuple(rng.randrange(10, vocab_limit) for _ in range(_length(rng, length_dist, spread, prompt_len)))
            rows.append((ids, None, _length(rng, length_dist, spread, out_len)))
        _STREAMS[key] = (rng, rows)  # the most recent last
        while len(_STREAMS) > _STREAMS_KEPT:
            del _STREAMS[next(iter(_STREAMS))]
        return rows[:count]


def make_requests(spec: WorkloadSpec, *, warmup: bool = False, batch: int | None = None) -> list[Request]:
    """The measured request set (or the warm-up set, for an engine running `batch` at once), identical for
    every replicate with the same spec."""
    rng = random.Random(spec.seed + (7919 if warmup else 0))
    count = spec.warmup_count(batch) if warmup else spec.num_requests
    prefix = "warmup-" if warmup else "req-"
    arrivals = None  # a trace's own; else drawn below
    if spec.trace is not None and not warmup:
        rows, arrivals = trace_rows(spec)
    elif spec.jsonl is not None and not warmup:
        rows = _read_jsonl(Path(spec.jsonl), spec)
    elif spec.sharegpt is not None and not warmup:
        rows = [(ids or tuple(rng.randrange(10, spec.vocab_limit) for _ in range(n_in)), None, n_out)
                for n_in, n_out, ids in read_sharegpt(Path(spec.sharegpt), spec)]
    else:
        out_len = min(spec.output_len, spec.warmup_output_len) if warmup else spec.output_len
        rows = synthetic_rows(spec.seed + (7919 if warmup else 0), spec.vocab_limit, spec.prompt_len, out_len,
                              spec.length_dist, spec.length_spread, count)
    if spec.shared_prefix_len:  # one system prompt before every request's own (warm-up ones too)
        prefix_ids = tuple(random.Random(spec.seed + 104729).randrange(10, spec.vocab_limit)
                           for _ in range(spec.shared_prefix_len))
        if any(ids is None for ids, _, _ in rows):
            raise ConfigError("workload.shared_prefix_len needs token-id prompts; the jsonl file has text prompts")
        rows = [(prefix_ids + ids, text, n) for ids, text, n in rows]
    # arrivals from a stream of their own: the same unit draws at every rate and request count, scaled by the
    # rate (a run at twice the rate starts with the same schedule, halved), whatever the prompts drew
    gaps = random.Random(f"arrivals/{spec.seed if spec.arrival_seed is None else spec.arrival_seed}")
    arrival, requests = 0.0, []
    for i, (token_ids, text, output_len) in enumerate(rows):
        if arrivals is not None:
            arrival = arrivals[i]
        elif spec.loop == "open" and not warmup and i > 0:
            arrival += gaps.expovariate(1.0) / spec.rate
        requests.append(Request(f"{prefix}{i}", output_len, token_ids, text, arrival))
    return requests


# vLLM's own ShareGPT benchmark keeps conversations with at least 4 tokens each way, a prompt of at most
# 1024 tokens and at most 2048 tokens in all; so do we, so that the length distribution is the one people quote
SHAREGPT_MIN, SHAREGPT_MAX_PROMPT, SHAREGPT_MAX_TOTAL = 4, 1024, 2048


def read_sharegpt(path: Path, spec: WorkloadSpec) -> list[tuple[int, int, tuple[int, ...] | None]]:
    """(prompt tokens, output tokens, the prompt's token ids) of the first exchange of each conversation in a
    ShareGPT-style file ([{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", "value": ...},
    ...]}, ...]), filtered as vLLM's benchmark does, shuffled with the workload's seed, the first num_requests.
    With a tokenizer (`workload.tokenizer`, or the named model's) both sides are counted with it and the
    prompt is sent as its own tokens; without one, lengths are estimated from characters (`chars_per_token`)
    and the prompt becomes token ids of that length (None here): the engine sees the dataset's lengths."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON at line {exc.lineno} column {exc.colno} ({exc.msg}); "
                          "workload.sharegpt expects a JSON list of conversations") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot be read ({exc})") from None
    if not isinstance(data, list):
        raise ConfigError(f"{path}: a ShareGPT file is a JSON list of conversations, but this one holds a "
                          f"{type(data).__name__}")
    encode = tokenizer_for(spec.tokenizer)
    pairs = []
    for item in data:
        turns = (item.get("conversations") or item.get("conversation")) if isinstance(item, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue
        first, second = turns[0], turns[1]
        if not all(isinstance(t, dict) and isinstance(t.get("value"), str) for t in (first, second)):
            continue
        if first.get("from") not in ("human", "user") or second.get("from") not in ("gpt", "assistant", "chatgpt"):
            continue
        if encode is not None:
            ids: tuple[int, ...] | None = encode(first["value"])
            n_in, n_out = len(ids), len(encode(second["value"]))
        else:
            ids = None
            n_in, n_out = (max(1, round(len(t["value"]) / spec.chars_per_token)) for t in (first, second))
        if n_in < SHAREGPT_MIN or n_out < SHAREGPT_MIN or n_in > SHAREGPT_MAX_PROMPT \
                or n_in + n_out > SHAREGPT_MAX_TOTAL:
            continue
        pairs.append((n_in, n_out, ids))
    if not pairs:
        raise ConfigError(f"{path}: no usable conversations (each needs a human turn then a gpt turn, with "
                          f"{SHAREGPT_MIN}..{SHAREGPT_MAX_PROMPT} prompt tokens and at most {SHAREGPT_MAX_TOTAL} "
                          "in all)")
    enough(pairs, spec, key="sharegpt", what="usable conversations")
    random.Random(spec.seed).shuffle(pairs)
    return pairs[: spec.num_requests]


@functools.lru_cache(maxsize=4)  # loaded once per process, not once per replicate
def tokenizer_for(name: str | None):
    """Text -> token ids with the tokenizer `name` (a Hugging Face name, or a folder), or None for none."""
    if name is None:
        return None
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(name)
    except Exception as exc:  # noqa: BLE001 - any failure to load is the same bad input for the user
        raise ConfigError(f"workload.tokenizer={name!r} cannot be loaded ({type(exc).__name__}: "
                          f"{str(exc).strip().splitlines()[0] if str(exc).strip() else exc}); name a tokenizer "
                          "this machine has (a folder, or a cached Hugging Face name), or set "
                          "workload.tokenizer=null to estimate lengths from characters") from None
    return lambda text: tuple(tokenizer(text, add_special_tokens=False)["input_ids"])


def _read_jsonl(path: Path, spec: WorkloadSpec) -> list[tuple]:
    rows = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}: not valid JSON ({exc.msg})") from None
        ids, text = row.get("prompt_token_ids"), row.get("prompt")
        if (ids is None) == (text is None):
            raise ConfigError(f"{where}: give exactly one of 'prompt_token_ids' or 'prompt'")
        if ids is not None and not (ids and all(isinstance(t, int) and t >= 0 for t in ids)):
            raise ConfigError(f"{where}: 'prompt_token_ids' must be a non-empty list of token ids")
        output_len = row.get("output_len", spec.output_len)
        if not isinstance(output_len, int) or output_len <= 0:
            raise ConfigError(f"{where}: 'output_len' must be a positive integer, but got {output_len!r}")
        rows.append((tuple(ids) if ids is not None else None, text, output_len))
    if not rows:
        raise ConfigError(f"{path}: no requests in the file")
    enough(rows, spec, key="jsonl", what="requests")
    return rows[: spec.num_requests]


def enough(rows: list, spec: WorkloadSpec, *, key: str, what: str) -> None:
    """A file with fewer requests than workload.num_requests would run short while every record says
    num_requests: refused, with the count it has."""
    if len(rows) < spec.num_requests:
        raise ConfigError(f"workload.{key} {getattr(spec, key)!r} has {len(rows)} {what}, but workload.num_requests="
                          f"{spec.num_requests}; set workload.num_requests={len(rows)} (or less), or give a larger "
                          "file")


@dataclass
class RequestTiming:
    request_id: str
    prompt_tokens: int
    output_len: int  # what the request asked for: fixed work means it produces exactly this many
    output_tokens: int = 0
    scheduled_s: float = 0.0  # when it was due: its arrival (open loop), or its submission (closed loop)
    submitted_s: float = 0.0  # when the driver handed it to the engine (open loop: between steps, so late)
    first_token_s: float | None = None
    finished_s: float | None = None
    token_times: list[float] = field(default_factory=list)  # end of every step that gave it tokens


@dataclass(frozen=True)
class Step:
    ended_s: float
    in_flight: int  # requests in flight (submitted, not finished) when the step began
    tokens: int  # output tokens the step produced
    began_s: float | None = None


@dataclass
class DriveResult:
    timings: list[RequestTiming]
    started_s: float
    finished_s: float
    peak_kv_cache_usage: float
    steps: list[Step] = field(default_factory=list)
    full: int = 0  # closed loop: in flight = the whole concurrency (see `drive`'s batch_limit)
    schedule: str = ""  # fingerprint of what each step gave to whom (see `drive`)
    # the meter's readings (joules) at the start, at the end of the steady window and at the end; None: no meter
    energy_j: tuple[float | None, float | None, float | None] | None = None

    @property
    def wall_s(self) -> float:
        return self.finished_s - self.started_s


def drive(session: EngineSession, requests: Sequence[Request], *, loop: str, concurrency: int,
          batch_limit: int | None = None, meter: Callable[[], float | None] | None = None) -> DriveResult:
    """Push every request through the session: a closed loop keeps `concurrency` in flight; an open loop
    submits each at its arrival offset (it can only do so between steps, so it records when each was due:
    latency counts from then; a session waiting for a server's next chunk, `step_until`, stops waiting at the
    next arrival). Returns per-request and per-step timings on the session's clock.
    `batch_limit` is the most the engine runs at once (max_num_seqs): with that many in flight it is full.

    The result's `schedule` fingerprints, step by step, how many were in flight, which requests (by their
    place in `requests`) got how many tokens, and, where the session can tell (`computed_tokens`), how many
    tokens its scheduler has computed for each: where a session's steps are the engine's own (the in-process
    engine core), two runs with the same fingerprint are the same sequence of batches, prefill chunks
    included.

    `meter` (joules, energy.Meter) is read just before the start, between the last step that began with the
    engine full and the next (the end of the steady window measure.steady_window computes), and just after
    the last step: outside every timed step, so its reads cost the engine nothing it is timed for."""
    order = {r.id: i for i, r in enumerate(requests)}
    trace = hashlib.sha256()
    computed_tokens = getattr(session, "computed_tokens", dict)  # what the scheduler computed, if it can say
    step_until = getattr(session, "step_until", None)  # a session that waits for the server can stop waiting
    pending = sorted(requests, key=lambda r: r.arrival_s) if loop == "open" else list(requests)
    pending.reverse()  # pop() from the end = next request in order
    timings: dict[str, RequestTiming] = {}
    steps: list[Step] = []
    in_flight, peak_kv = 0, 0.0
    full = min(concurrency, len(requests), batch_limit or concurrency) if loop == "closed" else 0
    at_start = meter() if meter is not None else None
    at_window_end: float | None = None
    window_open = meter is not None and full > 0
    started = session.now()

    def submit(request: Request) -> None:
        nonlocal in_flight
        session.add(request)
        now = session.now()
        due = started + request.arrival_s if loop == "open" else now
        timings[request.id] = RequestTiming(request.id, request.prompt_len, request.output_len, scheduled_s=due,
                                            submitted_s=now)
        in_flight += 1

    while pending or in_flight:
        if loop == "closed":
            while pending and in_flight < concurrency:
                submit(pending.pop())
        else:
            while pending and started + pending[-1].arrival_s <= session.now():  # as wait_until reaches it
                submit(pending.pop())
            if not in_flight:
                session.wait_until(started + pending[-1].arrival_s)
                continue
        if window_open and in_flight < full:  # in a closed loop, never full again: the steady window is over
            at_window_end, window_open = meter(), False
        began_with, began = in_flight, session.now()
        if loop == "open" and pending and step_until is not None:  # a wall-clock wait: end it at the next arrival
            events = step_until(started + pending[-1].arrival_s)
            if not events:
                continue
        else:
            events = session.step()
        now = session.now()
        peak_kv = max(peak_kv, session.kv_cache_usage())
        produced = 0
        for event in events:
            timing = timings[event.request_id]
            at = now if event.at_s is None else event.at_s
            if event.output_tokens > timing.output_tokens:
                produced += event.output_tokens - timing.output_tokens
                timing.token_times.append(at)
            timing.output_tokens = event.output_tokens
            if event.prompt_tokens:
                timing.prompt_tokens = event.prompt_tokens
            if timing.first_token_s is None and event.output_tokens > 0:
                timing.first_token_s = at
            if event.finished:
                timing.finished_s = at
                in_flight -= 1
        steps.append(Step(now, began_with, produced, began))
        computed = computed_tokens()
        trace.update(repr((began_with, sorted((order[e.request_id], e.output_tokens) for e in events),
                           sorted((order[r], n) for r, n in computed.items() if r in order))).encode())
    finished = session.now()
    at_end = meter() if meter is not None else None
    energy = None if meter is None else (at_start, at_end if window_open else at_window_end, at_end)
    return DriveResult([timings[r.id] for r in requests], started, finished, peak_kv, steps, full,
                       trace.hexdigest()[:16], energy)
