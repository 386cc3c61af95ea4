"""Matplotlib for the sweeps' pictures, set up in one place: the file backend (no display needed, imported
only when a picture is drawn), a figure written and closed, a run's p95 that may be missing, and the
colour that follows one configuration through every picture of a sweep."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

DPI = 110


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: Path) -> None:
    fig.savefig(path, dpi=DPI)
    pyplot().close(fig)


def plain_log(axis: Any) -> None:
    """A log axis labelled 0.2, 5, 10 (not 2 x 10^-1): the powers of ten, and the 2s and 5s between them
    (every minor tick labelled crowds an axis spanning decades)."""
    from matplotlib.ticker import FuncFormatter

    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:.0e}"[0] in "25" else ""))


def colour(i: int) -> str:
    return f"C{i % 10}"


def p95(record: Mapping[str, Any], metric: str) -> float | None:
    """A run's p95 of `metric` (seconds); None where it has no samples (a stream whose tokens came in one or
    two chunks has no gaps between them: no TPOT, no ITL)."""
    return ((record.get("latency_s") or {}).get(metric) or {}).get("p95")
