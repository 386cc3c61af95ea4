"""Live progress for long measurements: what runs now, n of m, elapsed and ETA. On a terminal, a live display
(an overall bar with the ETA, a line per slot, the best feasible point so far) with the messages printed
above it; elsewhere (CI, logs, a pipe) plain lines, one per step."""

from __future__ import annotations

import time

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text


class Progress:
    """Prints one line per run started. The total follows what will run: the runs of comparisons under way
    (`plan`: added as each starts, the unused given back as it stops early) plus an estimate of the runs not
    started yet (`expect`); the ETA is the wall time per run finished (`finished`) times the runs left."""

    def __init__(self, console: Console, total: int, *, what: str = "replicate") -> None:
        self.console, self.what = console, what
        self.began = time.monotonic()
        self.planned, self.expected = total, 0  # runs of comparisons started, runs estimated not started yet
        self.count = 0  # runs started
        self.done = 0  # runs finished
        self.first_done = 0.0  # when the first run finished: the pace counts from there

    @property
    def total(self) -> int:
        return max(self.planned + self.expected, self.count)

    def plan(self, runs: int) -> None:
        """Runs a comparison will make (at its start), or gives back (negative: it stopped early)."""
        self.planned += runs

    def expect(self, runs: int) -> None:
        """The runs of comparisons not started yet, as now estimated (their stage may end sooner)."""
        self.expected = max(0, runs)

    def finished(self) -> None:
        self.done += 1
        if self.done == 1:
            self.first_done = time.monotonic()

    def eta(self) -> str:
        """From the runs finished after the first (which carries the engine process's start and, in a sweep,
        the baseline's slow probe): no guess before two of them."""
        if self.done < 3:
            return "?"
        pace = (time.monotonic() - self.first_done) / (self.done - 1)
        return f"{pace * max(0, self.total - self.done):.0f}s"

    def _advance(self) -> tuple[float, str]:
        now = time.monotonic()
        self.count += 1
        return now - self.began, self.eta()

    def counter(self) -> str:
        return f"{self.what} {self.count}/{'~' if self.expected else ''}{self.total}"

    def step(self, description: str, slot: str | None = None) -> None:
        elapsed, eta = self._advance()
        self.console.print(f"[dim]{self.counter()}  elapsed {elapsed:.0f}s  ETA {eta}[/]  {description}",
                           highlight=False)

    def note(self, message: str) -> None:
        """Anything else worth saying (probe results, trial verdicts)."""
        self.console.print(message, highlight=False)

    def best(self, point: str) -> None:
        """The best feasible point so far (the trial's note says it already)."""

    def stop(self) -> None:
        pass


class LiveProgress(Progress):
    """The terminal's live display; messages scroll above it."""

    def __init__(self, console: Console, total: int, *, what: str = "replicate", best: bool = True) -> None:
        super().__init__(console, total, what=what)
        self.slots: dict[str, str] = {}
        self.shown_best = "none yet" if best else None  # a sweep's notion; a comparison has no best point
        self.live = Live(self._render(), console=console, refresh_per_second=4, transient=False)
        self.live.start()

    def step(self, description: str, slot: str | None = None) -> None:
        self._advance()
        self.slots[slot or "0"] = description.replace(f" on slot {slot}", "") if slot else description
        self.live.update(self._render())

    def note(self, message: str) -> None:
        self.console.print(message, highlight=False)
        self.live.update(self._render())

    def best(self, point: str) -> None:
        if self.shown_best is not None:
            self.shown_best = point
            self.live.update(self._render())

    def _render(self) -> Group:
        elapsed = time.monotonic() - self.began
        head = Table.grid(padding=(0, 1))
        head.add_row(ProgressBar(total=max(self.total, 1), completed=min(self.done, self.total), width=40),
                     Text(f"{self.counter()}  elapsed {elapsed:.0f}s  ETA {self.eta()}"))
        lines = [head, *(Text(f"  slot {slot}: {doing}", style="dim") for slot, doing in sorted(self.slots.items()))]
        if self.shown_best is not None:
            lines.append(Text(f"  best feasible so far: {self.shown_best}", style="bold"))
        return Group(*lines)

    def stop(self) -> None:
        if self.live.is_started:
            self.live.update(self._render())
            self.live.stop()


def progress_for(console: Console, total: int, *, what: str = "replicate", best: bool = True) -> Progress:
    """The live display on a terminal (with the best point so far, for a sweep), plain lines anywhere else."""
    if console.is_terminal:
        return LiveProgress(console, total, what=what, best=best)
    return Progress(console, total, what=what)
