"""How the driver treats Ctrl-C and SIGTERM around work that must not be cut in half.

Python runs a signal's handler in the main thread at the next bytecode, so a Ctrl-C can land between any two
lines; these context managers decide what happens to it there. Each acts in the main thread only (signal
handlers can only be set there); elsewhere (a library user's thread, a test's) the body runs as it is."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

STOPPING = (signal.SIGINT, signal.SIGTERM)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def shielded() -> Iterator[None]:
    """Ctrl-C and SIGTERM are ignored for the body: clean-up that must finish once the run is stopping."""
    if not _main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in STOPPING}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def deferred() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait until the body is done, then act as they would have (each signal caught runs
    the handler that was in place, once): for a few milliseconds of work that must finish whole, such as
    writing every record of a batch, without swallowing the user's Ctrl-C. A second Ctrl-C does not cut the
    body short either: stopping in the middle of a write could leave a record on disk that the run then
    believes unwritten, and writes twice (SIGKILL still ends it; a torn line is repaired on the next run).
    A signal ignored, or whose handler Python does not know (set from C), is left alone."""
    if not _main_thread():
        yield
        return
    caught: list[int] = []
    previous: dict[int, Any] = {}

    def hold(signum: int, frame: FrameType | None) -> None:
        caught.append(signum)

    try:
        for sig in STOPPING:
            handler = signal.getsignal(sig)
            if handler is None or handler == signal.SIG_IGN:  # set from C, or ignored: left as it is
                continue
            previous[sig] = handler
            signal.signal(sig, hold)
        yield
    finally:
        _restore(list(previous.items()))
    for signum in dict.fromkeys(caught):
        handler = previous[signum]
        if callable(handler):
            handler(signum, None)  # Python's own for Ctrl-C raises KeyboardInterrupt here
        elif handler == signal.SIG_DFL:
            signal.raise_signal(signum)  # the default action (SIGTERM: the process ends)


def _restore(handlers: list[tuple[int, Any]]) -> None:
    """Put the handlers back, every one of them even if one that is back already raises (a Ctrl-C landing
    between two of them)."""
    if not handlers:
        return
    (sig, handler), rest = handlers[0], handlers[1:]
    try:
        signal.signal(sig, handler)
    finally:
        _restore(rest)


@contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """SIGTERM (a scheduler, `kill`, `ray job stop`) stops the sweep the way Ctrl-C does: cleanly."""
    if not _main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
