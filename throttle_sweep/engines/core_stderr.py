"""What an engine core that vLLM starts in a process of its own says on stderr while it starts, so a failed
start keeps the core's own cause.

With the multiprocess engine core (how a GPU runs vLLM) the process that starts it hears only "Engine core
initialization failed"; the core's traceback goes to the stderr it inherited. While a start runs, this
process's stderr (file descriptor 2, which the core inherits) is a pipe: a thread passes everything on to the
stderr it replaced and keeps the last lines. An engine core that started keeps writing to the pipe, and the
thread keeps passing it on, until every process that holds it has ended."""

from __future__ import annotations

import collections
import contextlib
import os
import re
import sys
import threading
import time
from collections.abc import Iterable, Iterator

CORE_FAILED = "Engine core initialization failed"  # vLLM's words for a multiprocess core that did not start
KEPT_LINES = 200
DRAIN_S = 2.0  # after a start: at most this long for what the core wrote to be read from the pipe
QUIET_S = 0.2  # the pipe silent this long: what the core wrote before it ended has been read
# an exception's last traceback line ("ValueError: ...", "torch.OutOfMemoryError: ..."), after vLLM's log prefix
# ("(EngineCore pid=1) ERROR 12-07 18:45:50 [core.py:1510] ")
EXCEPTION = re.compile(r"^(?:\([\w ]+pid=\d+\) (?:\w+ [\d-]+ [\d:.]+ \[[^\]]*\] )?)?"
                       r"((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception)(?::\s.*)?)$")


def cause(lines: Iterable[str]) -> str | None:
    """The last exception line in `lines` that is not vLLM's summary of a core that failed to start."""
    found = None
    for line in lines:
        match = EXCEPTION.match(line.rstrip())
        if match and CORE_FAILED not in line:
            found = match.group(1)
    return found


class Listener:
    """The pipe's reading end: passes what it reads on to `to` (a file descriptor) and keeps the last lines."""

    def __init__(self, read_fd: int, to: int) -> None:
        self._read_fd, self._to = read_fd, to
        self._kept: collections.deque[str] = collections.deque(maxlen=KEPT_LINES)
        self._partial = b""
        self._lock = threading.Lock()
        self.heard_at = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="engine-core-stderr", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while chunk := os.read(self._read_fd, 65536):
                with contextlib.suppress(OSError):  # a stderr gone away: the lines are still kept
                    os.write(self._to, chunk)
                with self._lock:
                    *whole, self._partial = (self._partial + chunk).split(b"\n")
                    self._kept.extend(line.decode(errors="replace") for line in whole)
                    self.heard_at = time.monotonic()
        finally:
            os.close(self._read_fd)
            os.close(self._to)

    def lines(self) -> list[str]:
        with self._lock:
            return [*self._kept, *([self._partial.decode(errors="replace")] if self._partial else [])]

    def drain(self) -> None:
        """Wait for what was written before now to be read: the pipe closed everywhere, or quiet for QUIET_S
        from now, or DRAIN_S at most."""
        since = time.monotonic()
        while self._thread.is_alive() and time.monotonic() - since < DRAIN_S:
            if time.monotonic() - max(self.heard_at, since) >= QUIET_S:
                return
            self._thread.join(QUIET_S / 4)


@contextlib.contextmanager
def heard() -> Iterator[Listener]:
    """This process's stderr is a pipe while the block runs (processes started in it inherit that), then its
    own again; the listener has the last lines written to it (`drain` first for all of them)."""
    sys.stderr.flush()
    read_fd, write_fd = os.pipe()
    saved = os.dup(2)
    listener = Listener(read_fd, os.dup(saved))
    os.dup2(write_fd, 2)
    os.close(write_fd)
    try:
        yield listener
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # the pipe's last writers are now the processes started in the block
        os.close(saved)
