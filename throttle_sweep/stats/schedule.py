"""Run orders for baseline (B) and candidate (C) replicates on one slot.

Interleaving is what lets the analysis separate the flag from machine drift: in `abba` (B C C B, C B B C,
...) and `aba-bab` (B C B, then C B C, ...) both arms see early and late runs alike. abba is the default:
in simulation (linear drift, a slow first run, curvature, an alternating rhythm) its complete blocks kept
the A/A false-verdict rates at alpha/2 on both sides, where aba-bab confounds the arm with an odd/even
rhythm (with no equivalence margin, 37% false CHEAPER under a +-1.1% alternation).
"""

from __future__ import annotations

import random

from throttle_sweep.errors import ConfigError

BASELINE, CANDIDATE = "baseline", "candidate"
SCHEDULES = ("aba-bab", "abba", "random")


def make_schedule(kind: str, replicates: int, *, seed: int = 0, lead: str = BASELINE) -> list[str]:
    """Arm labels in run order, `replicates` of each arm, `lead` first.

    abba runs complete B C C B blocks only (an even number per arm; a multiple of 4 also balances the
    run's odd and even positions, which an alternating machine rhythm would otherwise confound with the arm).
    Which arm leads should alternate across comparisons: a slow or fast first run then favours neither."""
    if kind not in SCHEDULES:
        raise ConfigError(f"compare.schedule must be one of {', '.join(SCHEDULES)}, but got {kind!r}")
    if not isinstance(replicates, int) or replicates < 2:
        raise ConfigError(f"compare.replicates must be at least 2 per arm, but got {replicates!r}")
    if kind == "abba" and replicates % 2:
        raise ConfigError(f"compare.schedule=abba runs complete B C C B blocks: compare.replicates (and "
                          f"study.confirm_replicates) must be even, but got {replicates}")
    if lead not in (BASELINE, CANDIDATE):
        raise ConfigError(f"the leading arm must be {BASELINE!r} or {CANDIDATE!r}, but got {lead!r}")
    b, c = (BASELINE, CANDIDATE) if lead == BASELINE else (CANDIDATE, BASELINE)
    if kind == "aba-bab":
        blocks = [[b, c, b], [c, b, c]]  # chained, this alternates B C B C B C ...
    elif kind == "abba":
        blocks = [[b, c, c, b], [c, b, b, c]]
    else:
        rng = random.Random(seed)
        blocks = [rng.sample([b, c], 2) for _ in range(replicates)]
        blocks[0] = [b, c]  # the lead runs first here too
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


def joint_arm(i: int) -> str:
    """The label of the i-th candidate (from 0) in a joint schedule: 'candidate', 'candidate-2', ..."""
    return CANDIDATE if i == 0 else f"{CANDIDATE}-{i + 1}"


def joint_schedule(candidates: int, replicates: int, *, lead: int = 0) -> list[str]:
    """One baseline and several candidates in one run order, `replicates` runs of each arm, in mirrored
    blocks that come in fold-over pairs: the arms in turn and back (B C1 C2 C2 C1 B), then the same turn
    backwards and forwards (C2 C1 B B C1 C2); the next pair's turn starts one arm later (`lead`: where the
    first starts). In a mirrored block every arm's mean position is the block's middle and its two runs fall
    on an odd and an even position, so every pair of arms, the baseline with each candidate and the
    candidates with each other, is balanced against linear drift and an odd/even rhythm, as B C C B C B B C
    is (which this is, for one candidate). No order of 3 x 4 runs also balances curvature for every pair (an
    exhaustive search found none); of those balanced for the first two, the fold-over pair comes closest (the
    baseline against C2 exactly, against C1 within 4 of 49 in the sum of squared distances from the middle),
    and it puts each candidate before and after the others alike. The baseline is run `replicates` times for
    all of them together, not once per candidate: that is the point (its runs are a sweep's slowest)."""
    if not isinstance(candidates, int) or candidates < 1:
        raise ConfigError(f"a joint schedule needs at least one candidate, but got {candidates!r}")
    if not isinstance(replicates, int) or replicates < 2 or replicates % 2:
        raise ConfigError(f"a joint schedule runs mirrored blocks, two runs of each arm: study.confirm_replicates "
                          f"must be even and at least 2, but got {replicates!r}")
    return mirrored_blocks([BASELINE, *(joint_arm(i) for i in range(candidates))], replicates, lead)


def tiebreak_schedule(candidates: int, replicates: int, *, lead: int = 0) -> list[str]:
    """The candidates a confirmation could not tell apart, run again against each other alone: the joint
    schedule's mirrored blocks without the baseline (C1 C2 C3 C3 C2 C1, then C3 C2 C1 C1 C2 C3 ...), so every
    pair is balanced against linear drift and an odd/even rhythm, and no run is spent on the baseline, the
    slowest arm and not in question here."""
    if not isinstance(candidates, int) or candidates < 2:
        raise ConfigError(f"a tie-break needs at least two candidates, but got {candidates!r}")
    if not isinstance(replicates, int) or replicates < 2 or replicates % 2:
        raise ConfigError(f"a tie-break runs mirrored blocks, two runs of each candidate: "
                          f"study.tiebreak_replicates must be even and at least 2 (or 0: none), but got {replicates!r}")
    return mirrored_blocks([joint_arm(i) for i in range(candidates)], replicates, lead)


def mirrored_blocks(arms: list[str], replicates: int, lead: int) -> list[str]:
    order: list[str] = []
    for block in range(replicates // 2):
        turn = (block // 2 + lead) % len(arms)
        half = arms[turn:] + arms[:turn]
        order += half + half[::-1] if block % 2 == 0 else half[::-1] + half
    return order


def with_warmup(order: list[str]) -> list[str]:
    """One unmeasured run first, with the leading arm's flags: whatever makes a process's first run slow
    (caches, allocator, clocks) lands on it instead of on one arm. Its record says `warmup: true`."""
    return [order[0], *order]


def confounding(arms: list[str], positions: list[float]) -> float:
    """|correlation| of arm with run position: near 1 means the order cannot tell the flag from drift."""
    n = len(arms)
    x = [1.0 if a == CANDIDATE else 0.0 for a in arms]
    mx, mp = sum(x) / n, sum(positions) / n
    sxy = sum((xi - mx) * (pi - mp) for xi, pi in zip(x, positions, strict=False))
    sxx = sum((xi - mx) ** 2 for xi in x)
    spp = sum((pi - mp) ** 2 for pi in positions)
    return abs(sxy) / (sxx * spp) ** 0.5 if sxx > 0 and spp > 0 else 1.0
