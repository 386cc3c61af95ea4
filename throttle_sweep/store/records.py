"""Replicate records: one JSON line per measured run, appended and fsynced as soon as it completes.

The format is versioned (`schema_version`, "MAJOR.MINOR"): readers accept any minor version of the
major versions they know and refuse the rest with a clear error, so old files never load silently wrong.
A line is complete only with its newline: bytes after the last newline are a write that a crash cut short
(it never returned, so nothing refers to it). Readers skip such a tail; the run's single writer opens the
file through `RecordLog`, which cuts the tail out into a side file before appending anything after it.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from throttle_sweep.errors import RecordError

SCHEMA_VERSION = "1.1"  # 1.1: steady, cost_basis, latency tpot/itl (pooled), lateness_s, warmup
KNOWN_MAJORS = {1}
REQUIRED = ("schema_version", "record_id", "run_id", "arm", "flags", "position", "status")


def is_ok(record: Mapping[str, Any]) -> bool:
    """The one status check: a replicate that ran to its end (status "ok"; every record has a status, REQUIRED,
    and analyze's rows are given one), not failed, void or cut short."""
    return record["status"] == "ok"


def append_record(path: Path, record: Mapping[str, Any]) -> None:
    """Append one record durably: a crash after this returns cannot lose it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(record, sort_keys=True, default=_jsonable) + "\n"
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(line)
        handle.flush()
        os.fsync(handle.fileno())


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


class RecordLog:
    """The records file of one run, opened by its single writer: the records already there, and `append`.

    Opening repairs a torn tail (see the module docstring) by moving it to `<file>.torn-<time>` and telling
    `say`, so the next append starts on a line of its own instead of joining the torn one."""

    def __init__(self, path: Path, *, say: Callable[[str], None]) -> None:
        self.path = path
        kept = cut_torn_tail(path)
        if kept is not None:
            say(f"{path}: its last line was torn (a write cut short by a crash, never referred to); moved it "
                f"to {kept} and measuring goes on after the last complete record")
        self.records: list[dict[str, Any]] = read_records(path) if path.exists() else []

    def append(self, record: dict[str, Any]) -> None:
        append_record(self.path, record)
        self.records.append(record)


def cut_torn_tail(path: Path) -> Path | None:
    """Truncate `path` after its last newline; the bytes cut go to a side file, whose path is returned."""
    if not path.is_file():
        return None
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end == len(data):
        return None
    kept = path.with_name(f"{path.name}.torn-{dt.datetime.now():%Y%m%d-%H%M%S-%f}")
    kept.write_bytes(data[end:])
    with open(path, "r+b") as handle:
        handle.truncate(end)
        handle.flush()
        os.fsync(handle.fileno())
    return kept


def read_records(path: Path) -> list[dict[str, Any]]:
    return list(iter_records(path))


def iter_records(path: Path) -> Iterator[dict[str, Any]]:
    """Valid records of a file. A torn tail (no newline: a crash mid-write) is skipped; any bad complete
    line raises."""
    if not path.is_file():
        raise RecordError(f"{path}: no such records file")
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")[:-1]  # the piece after the last newline is torn (or empty)
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise RecordError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
        check_record(record, where=f"{path}:{lineno}")
        yield record


def check_record(record: Mapping[str, Any], *, where: str) -> None:
    version = str(record.get("schema_version", ""))
    major = version.split(".")[0]
    if not major.isdigit() or int(major) not in KNOWN_MAJORS:
        raise RecordError(
            f"{where}: schema_version {version!r} is not readable by this throttle_sweep "
            f"(reads major versions {sorted(KNOWN_MAJORS)}); upgrade throttle_sweep to read it")
    missing = [key for key in REQUIRED if key not in record]
    if missing:
        raise RecordError(f"{where}: record lacks required field(s) {', '.join(missing)}")
