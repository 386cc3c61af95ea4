"""Sequential comparisons: look after every balanced block, stop as soon as more runs cannot change what the
comparison is for. Pure functions, no I/O.

A comparison is planned to its maximum (compare.replicates per arm) and looked at on the way. Each of the L
looks tests at alpha / L, so the chance of a false verdict at any look is at most alpha (Bonferroni over
looks: the simplest valid alpha spending, whatever the stopping rule; calibration tests simulate it with
drift). A search comparison screens: it is looked at after every B C C B block. Its first look (2 runs per
arm, 1 residual df) cannot see curvature in the drift, which a single block confounds with the arm; that is
tolerable for a screen, because confirmation decides. A confirmation is looked at only after complete B C C B
C B B C pairs, which are balanced against linear drift, curvature and an odd/even rhythm. A search comparison
stops when its verdict against the baseline is decided and its rank against the best feasible candidate so far
is too (clearly cheaper or clearly pricier, or out of reach of the planned runs: the best ranked go to
confirmation), or
when it can no longer win (PRICIER, NO DIFFERENCE, or clearly pricier than the best). Against the search's
reference (a feasible candidate, not the baseline) only the rank matters: PRICIER or clearly pricier ends it,
and an open verdict stops once its rank is out of reach (from the second look on: one residual df says too
little of the noise). A confirmation stops when its (also family-adjusted) verdict is decided, unless it must
still be told apart from other confirmed savings."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from scipy import special

from throttle_sweep.stats.schedule import BASELINE, CANDIDATE
from throttle_sweep.stats.verdict import CHEAPER, INCONCLUSIVE, NO_DIFFERENCE, PRICIER, Thresholds, clearly_lower


class Ranked(Protocol):
    ratio: float
    se_log: float
    df: int


def look_ends(order: Sequence[str], warmup: bool, every: int = 2) -> list[int]:
    """How many positions of `order` are done at each look: whenever both arms have the same number of
    measured runs, a multiple of `every` (2: each B C C B block; 4: each B C C B C B B C pair, which is also
    balanced against curvature and an odd/even rhythm), and at the end."""
    ends, counts = [], {BASELINE: 0, CANDIDATE: 0}
    for position, arm in enumerate(order):
        if warmup and position == 0:
            continue
        counts[arm] += 1
        n = counts[BASELINE]
        if n == counts[CANDIDATE] and n >= every and n % every == 0:
            ends.append(position + 1)
    if not ends or ends[-1] != len(order):
        ends.append(len(order))
    return ends


def per_look(thresholds: Thresholds, looks: int, family: int = 1) -> Thresholds:
    """The thresholds each look tests at: alpha spent evenly over the looks (and a confirmed family)."""
    return Thresholds(thresholds.alpha / (max(1, looks) * max(1, family)), thresholds.min_effect,
                      thresholds.equivalence_margin)


def search_stop(verdict: str, estimate: Ranked | None, best: Ranked | None, alpha: float,
                shrink: float = 1.0, *, needs_saving: bool = True, rivals: int = 1) -> str | None:
    """Why a search comparison can stop at this look, or None to go on. `shrink`: how much the candidate's
    standard error would shrink by the planned end (sqrt(runs now / runs planned)); if even then the rank
    against the best so far could not be decided, more runs are futile and confirmation decides it (a
    futility stop makes no claim, so it spends no alpha; it can cost the selection, which ranks the candidate on
the runs it has). `needs_saving=False`: the comparison's
    other arm is a feasible candidate (the search's reference), not the baseline, so a saving against it is
    not what makes a candidate eligible; only its rank is, and an undecided verdict may stop for futility too.
    `rivals`: how many feasible candidates the best so far is the lowest of. Selected as the lowest, an
    estimate sits below its true cost, so a drop against it is tested at alpha / rivals (a union bound over
    them: the chance of dropping a candidate as cheap as all of them stays at most alpha/2). The search's
    reference (ratio 1, no standard error) is known exactly: a drop against it is the candidate's own test."""
    if estimate is None:
        return "no estimate can be made"
    if verdict == PRICIER or (verdict == NO_DIFFERENCE and needs_saving):
        return f"{verdict}: it cannot win"
    if verdict == NO_DIFFERENCE:  # against the reference: equal within the margin; confirmation ranks it
        return "NO DIFFERENCE from the reference: confirmation ranks it"
    if best is not None and clearly_lower(best, estimate, selected(alpha, best, rivals)):  # type: ignore[arg-type]
        return "clearly pricier than the best feasible candidate so far"
    if not needs_saving and best is not None and verdict != CHEAPER:
        if estimate.df < 2:  # one residual df (the first B C C B block) says too little of the noise to give up on
            return None
        reach = special.ndtri(1 - alpha / 2) * math.hypot(estimate.se_log * shrink, best.se_log)
        if abs(math.log(estimate.ratio) - math.log(best.ratio)) < reach:
            return "its rank against the best so far cannot be decided within the plan: confirmation decides"
        return None
    if verdict == CHEAPER:
        if best is None:
            return "CHEAPER, and the first feasible saving"
        if clearly_lower(estimate, best, alpha):  # type: ignore[arg-type]
            return "CHEAPER, and clearly cheaper than the best feasible candidate so far"
        reach = special.ndtri(1 - alpha / 2) * math.hypot(estimate.se_log * shrink, best.se_log)
        if abs(math.log(estimate.ratio) - math.log(best.ratio)) < reach:
            return "CHEAPER; its rank against the best so far cannot be decided within the plan: confirmation decides"
    return None


def selected(alpha: float, best: Ranked, rivals: int) -> float:
    """The level of a drop against `best`, the lowest of `rivals` (search_stop): alpha / rivals for an estimate,
    alpha for one known exactly (the reference)."""
    return alpha / max(1, rivals) if best.se_log > 0 else alpha


def confirm_stop(verdict: str, *, ranked: bool) -> str | None:
    """Why a confirmation can stop at this look: decided, and not a saving that must still be ranked against
    others confirmed with it (`ranked`)."""
    if verdict == INCONCLUSIVE:
        return None
    if verdict == CHEAPER and ranked:
        return None
    return f"{verdict} decided"


@dataclass(frozen=True)
class Stored:
    """A finished trial's estimate, as kept in its attributes."""

    ratio: float
    se_log: float
    df: int


def to_rank(attrs: Mapping[str, Any]) -> Stored | None:
    if attrs.get("ratio") is None or attrs.get("se_log") is None:
        return None
    return Stored(attrs["ratio"], attrs["se_log"], attrs.get("df") or 1)
