"""A day of demand for mode=plan: buckets of requests/s, read from a CSV of `start_s,requests_per_s` rows, or
from a timed trace (measurement/trace.py reads it) whose arrivals are counted in buckets of `plan.bucket_s`.
Every row is checked where it is read, and a bad one is named by its line: a plan is only as good as its demand."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from throttle_sweep.errors import ConfigError
from throttle_sweep.measurement.trace import PLAIN, read_trace

COLUMNS = ("start_s", "requests_per_s")
TRACE_BUCKET_S = 3600.0  # a trace's buckets when plan.bucket_s is not given: an hour
KEY = "plan.demand"


@dataclass(frozen=True)
class Bucket:
    start_s: float
    duration_s: float
    rps: float  # requests/s over the bucket

    @property
    def hours(self) -> float:
        return self.duration_s / 3600.0


def read_demand(path: str, bucket_s: float | None = None) -> list[Bucket]:
    """The demand curve in `path`: a demand CSV (its header names start_s, requests_per_s), or a trace (a CSV
    naming arrival_s, or Mooncake/plain JSONL) bucketed. A CSV row lasts until the next row starts; the last
    one `bucket_s`, or as long as the row before it (one row alone: an hour)."""
    p = Path(path)
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{KEY}: cannot read {path!r} ({getattr(exc, 'strerror', None) or exc})") from None
    if not p.name.endswith(".csv"):
        return bucketed(path, bucket_s)
    rows = data_lines(text)
    if not rows:
        raise ConfigError(f"{KEY}: {path} is empty: a demand CSV has a header {','.join(COLUMNS)}, then a row per "
                          "bucket")
    lineno, header = rows[0]
    names = [h.strip() for h in header]
    if PLAIN[0] in names and COLUMNS[0] not in names:
        return bucketed(path, bucket_s)
    missing = [c for c in COLUMNS if c not in names]
    if missing:
        raise ConfigError(f"{path}:{lineno}: a demand CSV's header names {', '.join(COLUMNS)} (or a trace's: "
                          f"{', '.join(PLAIN)}); missing: {', '.join(missing)}; its header: {','.join(names)}")
    points = [row_of(path, n, dict(zip(names, values, strict=False)), names) for n, values in rows[1:]]
    if not points:
        raise ConfigError(f"{path}: a header and no rows: a demand CSV has a row per bucket after its header")
    for (n0, s0, _), (n1, s1, _) in zip(points, points[1:], strict=False):
        if not s1 > s0:
            raise ConfigError(f"{path}:{n1}: start_s {s1:g} is not after line {n0}'s {s0:g}: buckets start in "
                              "increasing order")
    last = bucket_s if bucket_s is not None else (points[-1][1] - points[-2][1] if len(points) > 1
                                                   else TRACE_BUCKET_S)
    ends = [s for _, s, _ in points[1:]] + [points[-1][1] + last]
    return [Bucket(s, end - s, rps) for (_, s, rps), end in zip(points, ends, strict=True)]


def data_lines(text: str) -> list[tuple[int, list[str]]]:
    """(line number, fields) of the lines that are not blank or comments (`#`): a curve may say what it is."""
    lines = [(n, raw) for n, raw in enumerate(text.splitlines(), 1) if raw.strip() and not raw.lstrip().startswith("#")]
    return [(n, next(csv.reader([raw]))) for n, raw in lines]


def row_of(path: str, lineno: int, row: dict[str, str], names: list[str]) -> tuple[int, float, float]:
    """(line, start_s, requests_per_s) of one row, checked."""
    values = []
    for key in COLUMNS:
        raw = row.get(key)
        if raw is None:
            raise ConfigError(f"{path}:{lineno}: {len(row)} field(s) where the header has {len(names)}: no {key}")
        try:
            value = float(raw.strip())
        except ValueError:
            raise ConfigError(f"{path}:{lineno}: {key} must be a number, but got {raw.strip()!r}") from None
        if not math.isfinite(value) or value < 0:
            what = "a number of seconds >= 0" if key == "start_s" else "a rate >= 0 (requests/s)"
            raise ConfigError(f"{path}:{lineno}: {key} must be {what}, but got {raw.strip()}")
        values.append(value)
    return lineno, values[0], values[1]


def bucketed(path: str, bucket_s: float | None) -> list[Bucket]:
    """A trace's arrivals counted in buckets of `bucket_s` from its clock's zero, each bucket's rate its count
    over its width (the last bucket whole: its rate reads low when the trace ends inside it)."""
    width = bucket_s or TRACE_BUCKET_S
    arrivals = [t.at_s for t in read_trace(path, block_size=1)]  # 1: any sane hash_ids fit; only times are read
    counts = [0] * (int(arrivals[-1] // width) + 1)
    for at in arrivals:
        counts[int(at // width)] += 1
    return [Bucket(i * width, width, n / width) for i, n in enumerate(counts)]


def check_bucket_s(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise ConfigError(f"plan.bucket_s must be a positive number of seconds (or null), but got {value!r}")
    return float(value)
