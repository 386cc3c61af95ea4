"""Timed traces: a file of real arrivals read, checked line by line, cut to a window, and turned into requests
that keep their lengths, their shared prefixes and their arrival times (workload.trace).

Two formats. Mooncake's JSONL (`timestamp` in ms since the first request, `input_length`, `output_length`,
`hash_ids`), as its FAST'25 traces, AIPerf and `vllm bench serve --dataset-name timed_trace` read it: each hash
id stands for one block of `block_size` prompt tokens (512 in Mooncake's traces), and every request listing an
id starts that block with the same token ids, drawn from the id alone, so vLLM's prefix cache sees the sharing
production saw. A prompt's last block may be partial (its id's first tokens); tokens its ids do not cover are
its own. And a plain trace, CSV (with a header) or JSONL, of `arrival_s`, `prompt_tokens`, `output_tokens`:
nothing shared. Arrivals are offsets from the window's first request, divided by the speed-up.
"""

from __future__ import annotations

import csv
import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from throttle_sweep.errors import ConfigError

if TYPE_CHECKING:
    from throttle_sweep.measurement.workload import WorkloadSpec

MOONCAKE = ("timestamp", "input_length", "output_length")  # and `hash_ids`, optional
PLAIN = ("arrival_s", "prompt_tokens", "output_tokens")


@dataclass(frozen=True)
class TraceLine:
    line: int  # where it is in the file (1-based)
    at_s: float  # arrival on the trace's own clock
    prompt_len: int
    output_len: int
    hash_ids: tuple[int, ...] = ()


def check_options(spec: WorkloadSpec, source: str = "workload") -> None:
    """The trace keys' own values, before the file is read."""
    speed, start, span = spec.trace_speed, spec.trace_start_s, spec.trace_span_s
    if not _number(speed) or not 0 < speed < math.inf:
        raise ConfigError(f"{source}.trace_speed must be a positive number (2 replays twice as fast), but got "
                          f"{speed!r}")
    if not _number(start) or not 0 <= start < math.inf:
        raise ConfigError(f"{source}.trace_start_s must be a number of seconds >= 0 on the trace's clock, but got "
                          f"{start!r}")
    if span is not None and (not _number(span) or not 0 < span < math.inf):
        raise ConfigError(f"{source}.trace_span_s must be a positive number of seconds (or null: to the end), but "
                          f"got {span!r}")
    for key in ("trace_max_requests", "trace_block_size"):
        value = getattr(spec, key)
        if (value is not None or key == "trace_block_size") and (not _integer(value) or value < 1):
            raise ConfigError(f"{source}.{key} must be a positive integer, but got {value!r}")
    if spec.loop != "open":
        raise ConfigError(f"{source}.loop={spec.loop!r}: a trace replays its arrival times, an open loop; set "
                          f"{source}.loop=open (workload=trace sets it)")
    if spec.jsonl is not None or spec.sharegpt is not None:
        raise ConfigError(f"{source}: give {source}.trace, or {source}.jsonl / {source}.sharegpt, not both")


def check_trace(spec: WorkloadSpec, *, max_model_len: int | None, source: str = "workload") -> None:
    """Every line the run replays fits the engine (its line named if not); raises ConfigError."""
    check_options(spec, source)
    for t in replayed(spec):
        total = spec.shared_prefix_len + t.prompt_len + t.output_len
        if max_model_len is not None and total > max_model_len:
            prefix = f"{spec.shared_prefix_len} shared prefix + " if spec.shared_prefix_len else ""
            raise ConfigError(f"{spec.trace}:{t.line}: {prefix}{t.prompt_len} prompt + {t.output_len} output = "
                              f"{total} tokens, beyond max_model_len={max_model_len}; raise engine.max_model_len, or "
                              f"choose a window without it ({source}.trace_start_s, {source}.trace_span_s)")


def counted(spec: WorkloadSpec, *, named: bool, overrides: list[str]) -> WorkloadSpec:
    """The workload with `num_requests` set to the requests the trace replays, so every record says how many
    ran. `named`: the run chose workload=trace. The count is the trace's: num_requests given on the command
    line would be ignored, so it is refused."""
    if spec.trace is None:
        if named:
            raise ConfigError("workload=trace needs workload.trace=PATH: a Mooncake JSONL trace, or a CSV/JSONL of "
                              "arrival_s, prompt_tokens, output_tokens (examples/mooncake-synthetic.jsonl)")
        return spec
    given = [o for o in overrides if o.lstrip("+").startswith("workload.num_requests=")]
    if given:
        raise ConfigError(f"{given[0]}: a trace replays the requests of its window; cap them with "
                          "workload.trace_max_requests=N instead")
    check_options(spec)
    return replace(spec, num_requests=len(replayed(spec)))


def replayed(spec: WorkloadSpec) -> list[TraceLine]:
    """The lines the run replays: those arriving within the window, at most trace_max_requests of them."""
    lines = read_trace(spec.trace, spec.trace_block_size)
    start, span = spec.trace_start_s, spec.trace_span_s
    chosen = [t for t in lines if t.at_s >= start and (span is None or t.at_s < start + span)]
    if not chosen:
        raise ConfigError(f"workload.trace_start_s={start:g} and workload.trace_span_s="
                          f"{'null' if span is None else f'{span:g}'} select no request of {spec.trace}: its "
                          f"arrivals run from {lines[0].at_s:g} s to {lines[-1].at_s:g} s on its own clock")
    return chosen[: spec.trace_max_requests]


def trace_rows(spec: WorkloadSpec) -> tuple[list[tuple[tuple[int, ...], None, int]], list[float]]:
    """(prompt ids, None, output length) of every replayed request, and its arrival offset in seconds."""
    lines = replayed(spec)
    blocks: dict[int, list[int]] = {}
    rows = []
    for t in lines:
        ids: list[int] = []
        for h in t.hash_ids:
            if h not in blocks:  # the same tokens for the same id, in every request and every replicate
                blocks[h] = _tokens(spec, ("block", h), spec.trace_block_size)
            ids.extend(blocks[h][: t.prompt_len - len(ids)])
        ids.extend(_tokens(spec, ("own", t.line), t.prompt_len - len(ids)))
        rows.append((tuple(ids), None, t.output_len))
    return rows, [(t.at_s - lines[0].at_s) / spec.trace_speed for t in lines]


def _tokens(spec: WorkloadSpec, key: tuple[str, int], n: int) -> list[int]:
    seed = (spec.seed, 1 if key[0] == "block" else 2, key[1])
    return np.random.default_rng(seed).integers(10, spec.vocab_limit, n).tolist() if n > 0 else []


def read_trace(path: str, block_size: int) -> tuple[TraceLine, ...]:
    """Every line of the trace, checked: well formed, in order of arrival, hash ids that fit the prompt."""
    p = Path(path)
    try:
        stat = p.stat()
    except OSError as exc:
        raise ConfigError(f"workload.trace: cannot read {path!r} ({exc.strerror})") from None
    return _read(str(p), stat.st_mtime_ns, stat.st_size, block_size)


@functools.lru_cache(maxsize=4)  # read once per process and file version, not once per replicate
def _read(path: str, _mtime_ns: int, _size: int, block_size: int) -> tuple[TraceLine, ...]:
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"workload.trace: cannot read {path!r} ({exc})") from None
    records = _csv(path, text) if path.endswith(".csv") else _jsonl(path, text)
    lines: list[TraceLine] = []
    for lineno, rec, keys in records:
        t = _line(f"{path}:{lineno}", lineno, rec, keys, block_size)
        if lines and t.at_s < lines[-1].at_s:
            raw, unit = (rec[keys[0]], " ms") if keys == MOONCAKE else (rec[keys[0]], " s")
            was = lines[-1].at_s * (1000 if keys == MOONCAKE else 1)
            raise ConfigError(f"{path}:{lineno}: {keys[0]} {raw:g}{unit} is before line {lines[-1].line}'s "
                              f"{was:g}{unit}: a trace's requests must be in order of arrival (sort it by "
                              f"{keys[0]})")
        lines.append(t)
    if not lines:
        raise ConfigError(f"{path}: no requests in the trace")
    return tuple(lines)


def _jsonl(path: str, text: str) -> Iterator[tuple[int, dict[str, Any], tuple[str, ...]]]:
    import json

    keys: tuple[str, ...] | None = None
    first = 0
    for lineno, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{lineno}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(rec, dict):
            raise ConfigError(f"{path}:{lineno}: a trace line is a JSON object, but got {type(rec).__name__}")
        kind = MOONCAKE if MOONCAKE[0] in rec else PLAIN if PLAIN[0] in rec else None
        if keys is None:
            if kind is None:
                raise ConfigError(f"{path}:{lineno}: neither a Mooncake line ({', '.join(MOONCAKE)}, hash_ids) nor "
                                  f"a plain one ({', '.join(PLAIN)}); its keys: {', '.join(sorted(rec))}")
            keys, first = kind, lineno
        elif kind != keys:
            name = "Mooncake" if keys == MOONCAKE else "plain"
            raise ConfigError(f"{path}:{lineno}: expected a {name} line like line {first} ({', '.join(keys)}), "
                              f"but its keys are {', '.join(sorted(rec))}")
        yield lineno, rec, keys


def _csv(path: str, text: str) -> Iterator[tuple[int, dict[str, Any], tuple[str, ...]]]:
    reader = csv.DictReader(text.splitlines())
    missing = [k for k in PLAIN if k not in (reader.fieldnames or [])]
    if missing:
        raise ConfigError(f"{path}:1: a CSV trace's header names {', '.join(PLAIN)}; missing: {', '.join(missing)}")
    for rec in reader:
        lineno = reader.line_num
        values: dict[str, Any] = {}
        for key, convert in zip(PLAIN, (float, int, int), strict=True):
            try:
                values[key] = convert((rec[key] or "").strip())
            except ValueError:
                what = "a number of seconds" if convert is float else "a positive integer"
                raise ConfigError(f"{path}:{lineno}: {key} must be {what}, but got {rec[key]!r}") from None
        yield lineno, values, PLAIN


def _line(where: str, lineno: int, rec: dict[str, Any], keys: tuple[str, ...], block_size: int) -> TraceLine:
    for key in keys:
        if key not in rec:
            raise ConfigError(f"{where}: missing {key!r} (a line gives {', '.join(keys)})")
    time_key, prompt_key, output_key = keys
    at = rec[time_key]
    if not _number(at) or not 0 <= at < math.inf:
        raise ConfigError(f"{where}: {time_key} must be a number >= 0, but got {at!r}")
    for key in (prompt_key, output_key):
        if not _integer(rec[key]) or rec[key] < 1:
            raise ConfigError(f"{where}: {key} must be a positive integer, but got {rec[key]!r}")
    ids = rec.get("hash_ids", []) if keys == MOONCAKE else []
    if not isinstance(ids, list) or not all(_integer(h) and h >= 0 for h in ids):
        raise ConfigError(f"{where}: hash_ids must be a list of integers >= 0, but got {ids!r}")
    holds = math.ceil(rec[prompt_key] / block_size)
    if len(ids) > holds:
        raise ConfigError(f"{where}: {len(ids)} hash_ids of {block_size} tokens each, but its {rec[prompt_key]} "
                          f"prompt tokens hold {holds} block{'s' if holds != 1 else ''}; is "
                          f"workload.trace_block_size={block_size} the trace's block size?"
                          + (" (Mooncake's is 512)" if block_size != 512 else ""))
    return TraceLine(lineno, at / 1000 if keys == MOONCAKE else float(at), rec[prompt_key], rec[output_key],
                     tuple(ids))


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
