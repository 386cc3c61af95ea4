"""Live progress for long measurements: what runs now, n of m, elapsed and ETA."""

from __future__ import annotations

import time

from rich.console import Console


class Progress:
    """Prints one line per step; ETA from the mean duration of the steps so far."""

    def __init__(self, console: Console, total: int, *, what: str = "replicate") -> None:
        self.console, self.total, self.what = console, total, what
        self.began = time.monotonic()
        self.count = 0

    def step(self, description: str) -> None:
        elapsed = time.monotonic() - self.began
        eta = f"{elapsed / self.count * (self.total - self.count):.0f}s" if self.count else "?"
        self.count += 1
        self.console.print(f"[dim]{self.what} {self.count}/{self.total}  elapsed {elapsed:.0f}s  ETA {eta}[/]  "
                           f"{description}", highlight=False)

    def skip(self, n: int = 1) -> None:
        """Steps already done before this run (resumed): they count, but did not take this run's time."""
        self.total -= n
