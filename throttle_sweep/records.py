"""Replicate records: one JSON line per measured run, appended and fsynced as soon as it completes.

The format is versioned (`schema_version`, "MAJOR.MINOR"): readers accept any minor version of the
major versions they know and refuse the rest with a clear error, so old files never load silently wrong.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from throttle_sweep.errors import RecordError

SCHEMA_VERSION = "1.0"
KNOWN_MAJORS = {1}
REQUIRED = ("schema_version", "record_id", "run_id", "arm", "flags", "position", "status")


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


def read_records(path: Path) -> list[dict[str, Any]]:
    return list(iter_records(path))


def iter_records(path: Path) -> Iterator[dict[str, Any]]:
    """Valid records of a file. A torn last line (a crash mid-write) is skipped; any other bad line raises."""
    if not path.is_file():
        raise RecordError(f"{path}: no such records file")
    lines = path.read_text(encoding="utf-8").splitlines()
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if lineno == len(lines) and not line.endswith("}"):
                continue  # the write that was cut short never returned: nothing measured is lost
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
