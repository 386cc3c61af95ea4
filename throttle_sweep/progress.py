"""Live progress for long measurements: what runs now, n of m, elapsed and ETA."""

from __future__ import annotations

import time

from rich.console import Console


class Progress:
    """Prints one line per step; ETA from the mean duration of the steps so far."""

    def __init__(self, console: Console, total: int, *, what: str = "replicate") -> None:
        self.console, self.total, self.what = console, total, what
        self.began = time.monotonic()
        self.first: float | None = None  # the ETA counts from the first step (probes before it are not steps)
        self.count = 0

    def step(self, description: str) -> None:
        now = time.monotonic()
        elapsed = now - self.began
        self.first = self.first if self.first is not None else now
        pace = (now - self.first) / self.count if self.count else None
        eta = f"{pace * (self.total - self.count):.0f}s" if pace else "?"
        self.count += 1
        self.console.print(f"[dim]{self.what} {self.count}/{self.total}  elapsed {elapsed:.0f}s  ETA {eta}[/]  "
                           f"{description}", highlight=False)

    def skip(self, n: int = 1) -> None:
        """Steps already done before this run (resumed): they count, but did not take this run's time."""
        self.total -= n
