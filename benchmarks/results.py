"""Where the benchmarks keep what they measured: one JSON line per run in results.jsonl, with its date, commit
and machine, so that a figure quoted in RESULTS.md can be traced to the run that produced it.

    python benchmarks/results.py [SCRIPT]     the latest recorded row of each script (or of SCRIPT)
    python benchmarks/SCRIPT.py --latest      the same, for one script
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().with_name("results.jsonl")
ROOT = RESULTS.parents[1]


def commit() -> str:
    """HEAD's short hash, with "-dirty" when the checkout has uncommitted changes (the run then measured them)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False).stdout.strip()
    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    return f"{os.cpu_count()} CPUs ({model}), {platform.system()} {platform.release()}, Python {platform.python_version()}"


def record(script: str, args: dict[str, Any], figures: dict[str, Any], target_met: bool | None) -> dict[str, Any]:
    """Append one run's row to results.jsonl and return it."""
    row = {"script": Path(script).stem, "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
           "commit": commit(), "machine": machine(), "args": args, "figures": figures, "target_met": target_met}
    with RESULTS.open("a") as f:
        f.write(json.dumps(row, sort_keys=False) + "\n")
    print(f"recorded in {RESULTS.relative_to(ROOT)} ({row['date']}, commit {row['commit']})")
    return row


def latest(script: str | None = None) -> dict[str, dict[str, Any]]:
    """The newest row of each script (or of `script` alone)."""
    rows: dict[str, dict[str, Any]] = {}
    if RESULTS.exists():
        for line in RESULTS.read_text().splitlines():
            row = json.loads(line)
            if script is None or row["script"] == Path(script).stem:
                rows[row["script"]] = row
    return rows


def print_latest_if_asked(script: str) -> None:
    """`SCRIPT.py --latest`: print its latest recorded row and exit, running nothing."""
    if "--latest" in sys.argv[1:]:
        rows = latest(script)
        print(json.dumps(rows[Path(script).stem], indent=2) if rows else f"no recorded run of {Path(script).name}")
        raise SystemExit(0)


if __name__ == "__main__":
    found = latest(sys.argv[1] if len(sys.argv) > 1 else None)
    for row in found.values():
        print(json.dumps(row, indent=2))
    if not found:
        print("no recorded run")
