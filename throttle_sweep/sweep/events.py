"""What the sweep tells whoever shows its progress, as typed events: the live display and the plain log
both consume them, and neither reads meaning out of the wording."""

from __future__ import annotations

from typing import Protocol


class SweepProgress(Protocol):
    def note(self, message: str) -> None: ...  # a probe's result, a verdict, a decision: a line for the user
    def step(self, description: str, slot: str | None = None) -> None: ...  # a run starts (on this slot)
    def finished(self) -> None: ...  # a run's record is written
    def plan(self, runs: int) -> None: ...  # a comparison starts with this many runs to go (negative: gives back)
    def expect(self, runs: int) -> None: ...  # runs of comparisons not started yet, as now estimated
    def best(self, point: str) -> None: ...  # the best feasible point so far, in words


class Unseen:
    """Progress nobody watches."""

    def note(self, message: str) -> None:
        pass

    def step(self, description: str, slot: str | None = None) -> None:
        pass

    def finished(self) -> None:
        pass

    def plan(self, runs: int) -> None:
        pass

    def expect(self, runs: int) -> None:
        pass

    def best(self, point: str) -> None:
        pass
