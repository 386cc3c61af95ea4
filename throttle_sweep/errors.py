"""Errors the user can act on. Each names the rule, the bad value and where it came from."""

from __future__ import annotations

from collections.abc import Iterable


class ThrottleSweepError(Exception):
    """Base for every error this tool raises on purpose."""


class ConfigError(ThrottleSweepError, ValueError):
    """Bad input found before any expensive work starts."""


class RecordError(ThrottleSweepError, ValueError):
    """A replicate record or analysis input that cannot be read or trusted."""


class EngineStartError(ThrottleSweepError, RuntimeError):
    """The engine refused to start with the given flags; the message is the engine's reason."""


MEMORY_SHORT = "less than gpu_memory_utilization"  # engines/gpu_memory.shortfall's words


def refused_for_memory(reason: str | None) -> bool:
    """A start refused because the GPU had less free memory than gpu_memory_utilization x total, which vLLM
    checks whatever sizes the KV cache: the memory others hold, not the flags, decides it. In vLLM's words
    where they reach us (the in-process core, a server's log); else in ours, from the GPU read again after a
    start the multiprocess core failed (its refusal stays in the core's own log)."""
    if not reason:
        return False
    return ("Free memory on device" in reason and "on startup is less than" in reason) or MEMORY_SHORT in reason


class EngineRunError(ThrottleSweepError, RuntimeError):
    """The engine died or failed while serving the workload."""


def nearest(name: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """The valid names closest to a misspelt one, for 'nearest valid names: ...' (at most n, maybe none)."""
    import difflib

    return difflib.get_close_matches(str(name), [str(c) for c in choices], n=n, cutoff=0.6)
