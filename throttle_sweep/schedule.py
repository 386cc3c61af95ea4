"""Run orders for baseline (B) and candidate (C) replicates on one slot.

Interleaving is what lets the analysis separate the flag from machine drift: in `aba-bab` (B C B, then
C B C, ...) and `abba` (B C C B, C B B C, ...) both arms see early and late runs alike.
"""

from __future__ import annotations

import random

from throttle_sweep.errors import ConfigError

BASELINE, CANDIDATE = "baseline", "candidate"
SCHEDULES = ("aba-bab", "abba", "random")


def make_schedule(kind: str, replicates: int, *, seed: int = 0) -> list[str]:
    """Arm labels in run order, `replicates` of each arm."""
    if kind not in SCHEDULES:
        raise ConfigError(f"compare.schedule must be one of {', '.join(SCHEDULES)}, but got {kind!r}")
    if not isinstance(replicates, int) or replicates < 2:
        raise ConfigError(f"compare.replicates must be at least 2 per arm, but got {replicates!r}")
    b, c = BASELINE, CANDIDATE
    if kind == "aba-bab":
        blocks = [[b, c, b], [c, b, c]]  # chained, this alternates B C B C B C ...
    elif kind == "abba":
        blocks = [[b, c, c, b], [c, b, b, c]]
    else:
        rng = random.Random(seed)
        blocks = [rng.sample([b, c], 2) for _ in range(replicates)]
    order: list[str] = []
    counts = {b: 0, c: 0}
    i = 0
    while counts[b] < replicates or counts[c] < replicates:
        for arm in blocks[i % len(blocks)]:
            if counts[arm] < replicates:
                order.append(arm)
                counts[arm] += 1
        i += 1
    return order


def confounding(arms: list[str], positions: list[float]) -> float:
    """|correlation| of arm with run position: near 1 means the order cannot tell the flag from drift."""
    n = len(arms)
    x = [1.0 if a == CANDIDATE else 0.0 for a in arms]
    mx, mp = sum(x) / n, sum(positions) / n
    sxy = sum((xi - mx) * (pi - mp) for xi, pi in zip(x, positions, strict=False))
    sxx = sum((xi - mx) ** 2 for xi in x)
    spp = sum((pi - mp) ** 2 for pi in positions)
    return abs(sxy) / (sxx * spp) ** 0.5 if sxx > 0 and spp > 0 else 1.0
