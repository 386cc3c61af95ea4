"""One writer per results folder: a run holds an exclusive lock on its folder for as long as it runs.

Only the driver that holds the lock may append records, tell the study, or clean up what an earlier,
killed run of the same folder left behind (its private Ray). A second driver on the same folder is refused
before it starts anything. The lock is an flock on `<folder>/.lock`: the kernel drops it when the holder
exits, however it exits (SIGKILL included), so a stale lock never blocks a resume.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from throttle_sweep.errors import ConfigError, ThrottleSweepError

LOCK_FILE = ".lock"


class RunLockedError(ThrottleSweepError):
    """Another driver is running on the same results folder."""


@contextmanager
def hold(folder: Path, *, what: str) -> Iterator[None]:
    """Hold the folder's lock for the body; raise RunLockedError naming the holder if another has it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle = open(folder / LOCK_FILE, "a+", encoding="utf-8")  # noqa: SIM115 - held open for the whole run
    except OSError as exc:  # before anything is measured: say where, and what to change
        raise ConfigError(f"cannot write the results folder {folder} ({exc.strerror or exc}); results go under "
                          "results_dir: set it to a folder you can write to (results_dir=PATH)") from None
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = _describe(handle.read())
            raise RunLockedError(
                f"{what} ({folder}) is in use by another throttle_sweep run ({holder}); only one run may write "
                "a results folder at a time: wait for it to finish (or stop it), or choose another name"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "since": dt.datetime.now().isoformat(timespec="seconds")}))
        handle.flush()
        yield
    finally:
        handle.close()  # closing drops the flock


def _describe(text: str) -> str:
    try:
        info = json.loads(text)
        return f"pid {info['pid']} on {info['host']}, since {info['since']}"
    except (ValueError, KeyError, TypeError):
        return "holder unknown"
