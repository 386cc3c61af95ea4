"""The engine interface, as the measurement code needs it.

An Engine turns a dict of flags into a running EngineSession; a session accepts requests and is
stepped by the workload driver, which owns the clock-keeping. Stepping (rather than one blocking
`generate`) is what lets one driver run closed loops, open loops and per-request timings on any engine.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Request:
    """One request of a fixed workload: the prompt and exactly how many tokens it must produce."""

    id: str
    output_len: int
    prompt_token_ids: tuple[int, ...] | None = None
    prompt_text: str | None = None
    arrival_s: float = 0.0  # offset from the start of the run (open loop only)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids) if self.prompt_token_ids is not None else 0


@dataclass(frozen=True)
class StepEvent:
    """Progress of one request in one engine step (cumulative output tokens so far)."""

    request_id: str
    output_tokens: int
    finished: bool
    prompt_tokens: int = 0
    at_s: float | None = None  # when it happened on the session's clock, if not the step's end (HTTP chunks)


class EngineSession(Protocol):
    start_seconds: float  # how long the engine took to start
    max_num_seqs: int | None  # how many sequences the engine runs at once, as it resolved its own default
    kv_blocks: int | None  # KV-cache blocks the engine allocated, and tokens per block (None: not reported)
    kv_block_size: int | None

    def begin_replicate(self, index: int) -> None: ...  # a warm engine starts the next replicate afresh
    def add(self, request: Request) -> None: ...
    def step(self) -> list[StepEvent]: ...
    def has_unfinished(self) -> bool: ...
    def kv_cache_usage(self) -> float: ...  # fraction of KV-cache blocks in use, 0..1
    def preemptions(self) -> int: ...  # cumulative count, from the engine's own metrics
    def now(self) -> float: ...  # seconds, monotonic (a virtual clock on the fake engine)
    def wait_until(self, t: float) -> None: ...
    def close(self) -> None: ...


class WallClock:
    """now() and wait_until() on the machine's monotonic clock: the real engines' (the fake keeps a virtual one)."""

    def now(self) -> float:
        return time.perf_counter()

    def wait_until(self, t: float) -> None:
        delay = t - time.perf_counter()
        if delay > 0:
            time.sleep(delay)


class Engine(Protocol):
    """Optional: `refusal(flags) -> str | None`, what the engine would refuse at start (its own reason, None
    when it would start), decided before any start and without one; an engine without it is asked nothing
    (engine_refusal)."""

    name: str

    def flag_schema(self) -> Mapping[str, Any]: ...
    def engine_flags(self, flags: Mapping[str, Any]) -> dict[str, Any]: ...  # flags as the engine gets them
    def start(self, flags: Mapping[str, Any]) -> EngineSession: ...  # raises EngineStartError
    def environment(self) -> dict[str, Any]: ...


def engine_refusal(engine: object, flags: Mapping[str, Any]) -> str | None:
    """The engine's reason for refusing these flags at start, before any start; None when it would start them
    or cannot tell beforehand (an engine without a `refusal` method)."""
    refusal = getattr(engine, "refusal", None)
    return refusal(flags) if refusal is not None else None
