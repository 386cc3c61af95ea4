"""Where preemption starts along one ordered knob, found with single runs (probes): pure logic, no I/O.

With closed-loop fixed work a configuration's preemption count is deterministic (seen on vLLM: identical
across runs and equal to a bare `LLM.generate`), so feasibility needs no replicates. The search probes both
ends of the knob's range, then splits the interval between the last clean and the first preempting value
(k-section: one point per free slot per round, plain bisection with one slot) until they are neighbours at
the space's full resolution, then probes those two once more. A repeat that disagrees with the first count
makes feasibility noisy (on a GPU the engine core schedules asynchronously, so batch composition may depend
on timing): the last clean value must then run clean in every one of NOISY_REPEATS probes, and a value that
preempted in any probe counts as preempting, as a trial's replicates are judged (the worst count). A clean
value beyond a preempting one means the surface is not what this search assumes: the result says so and
the sweep falls back to judging feasibility from replicates. (Bisection only sees the values it
probes: a clean island inside a preempting stretch it skipped goes unnoticed. For max_num_seqs, KV size and
memory utilisation under fixed work the surface is monotone.)

A search for another setting of the other knobs starts at the two values either side of the first setting's
boundary instead of the ends: where the boundary has not moved (a knob that does not bind), those two probes
confirm it, with no recheck (determinism belongs to the engine and the work, and was checked once); where it
has moved, only the end it moved towards is probed, then bisection goes on as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna.distributions as od

FLOAT_POINTS = 33  # a continuous float knob (no step) is searched on this many evenly spaced values
NOISY_REPEATS = 3  # probes the last clean value must run clean in, once repeats have disagreed


def ordered(dist: od.BaseDistribution) -> bool:
    """A knob with an order: int or float ranges, or choices that are all numbers (not booleans)."""
    if isinstance(dist, od.IntDistribution | od.FloatDistribution):
        return True
    choices = getattr(dist, "choices", ())
    return bool(choices) and all(isinstance(c, int | float) and not isinstance(c, bool) for c in choices)


def knob_values(dist: od.BaseDistribution) -> list[Any]:
    """Every value of an ordered knob at the space's full resolution, ascending: each integer of an int range
    (a log scale changes how a sampler draws, not which values exist), each step of a stepped float."""
    if isinstance(dist, od.IntDistribution):
        return list(range(dist.low, dist.high + 1, dist.step))
    if isinstance(dist, od.FloatDistribution):
        if dist.step:
            n = round((dist.high - dist.low) / dist.step)
            return [round(dist.low + i * dist.step, 12) for i in range(n + 1)]
        span = dist.high - dist.low
        return [dist.low + span * i / (FLOAT_POINTS - 1) for i in range(FLOAT_POINTS)]
    return sorted(dist.choices)


def choose_knob(distributions: Mapping[str, od.BaseDistribution], wanted: str | None) -> str | None:
    """The knob to probe along: `wanted` if given ('auto': max_num_seqs if searched, else the first ordered
    knob), None when probing is off ('none') or nothing is ordered."""
    if wanted in (None, "none"):
        return None
    if wanted != "auto":
        return wanted
    if "max_num_seqs" in distributions:
        return "max_num_seqs"
    return next((k for k, d in distributions.items() if ordered(d)), None)


@dataclass
class Boundary:
    """What the probes of one knob found, for one setting of the other knobs."""

    knob: str
    others: dict[str, Any]
    values: list[Any]
    counts: dict[int, list[int | None]]  # value index -> preemption count of each probe (None: the run failed)
    max_preemptions: int = 0
    expected: str | None = None  # 'up' | 'down': the direction another setting's boundary showed, for when the
                                 # probes alone cannot tell (all alike, as a search started near it may find)
    expect_noise: bool = False  # another setting's repeats disagreed: replicate the clean side from the start
    proven: bool = False  # the engine's KV capacity holds every value's batch at full length: clean, unprobed

    def dirty(self, i: int) -> bool:
        return any(c is None or c > self.max_preemptions for c in self.counts.get(i, ()))

    @property
    def probed(self) -> list[int]:
        """Probed indices (a range proven clean by its KV capacity stands for its top value, unprobed)."""
        return sorted(self.counts) or ([len(self.values) - 1] if self.proven else [])

    @property
    def consistent(self) -> bool:
        """Every repeated probe gave the same count as the first."""
        return all(len(set(c)) == 1 for c in self.counts.values())

    @property
    def noisy(self) -> bool:
        """Feasibility is judged from replicated probes: repeats disagreed here, or in another setting."""
        return self.expect_noise or not self.consistent

    @property
    def direction(self) -> str | None:
        """'up' (preempts at high values: max_num_seqs), 'down' (at low values: KV size), or None (no change
        seen and none expected)."""
        lo, hi = self.probed[0], self.probed[-1]
        if self.dirty(lo) == self.dirty(hi):
            return self.expected
        return "up" if self.dirty(hi) else "down"

    def _oriented(self) -> list[int]:
        """Probed indices in the order in which preemption gets worse."""
        return self.probed[::-1] if self.direction == "down" else self.probed

    def edge(self) -> tuple[int | None, int | None]:
        """(last clean, first preempting) probed index along the direction of worse preemption."""
        path = self._oriented()
        first_dirty = next((i for i in path if self.dirty(i)), None)
        if first_dirty is None:
            return path[-1], None
        before = path[: path.index(first_dirty)]
        return (before[-1] if before else None), first_dirty

    @property
    def monotone(self) -> bool:
        """No clean value lies beyond a preempting one."""
        path = self._oriented()
        seen_dirty = False
        for i in path:
            seen_dirty |= self.dirty(i)
            if seen_dirty and not self.dirty(i):
                return False
        return True

    @property
    def settled(self) -> bool:
        """Trustworthy: monotone, and consistent or (noisy) with its last clean value clean in NOISY_REPEATS
        probes. If not, feasibility must come from each trial's replicates."""
        return self.monotone and (not self.noisy or self.replicated())

    def replicated(self) -> bool:
        clean, _ = self.edge()
        return clean is None or len(self.counts.get(clean, ())) >= NOISY_REPEATS

    def feasible(self, value: Any) -> bool | None:
        """True/False where the probes decide it, None where they cannot (not settled, or between probes)."""
        if not self.settled or value not in self.values:
            return None
        i = self.values.index(value)
        clean, dirty = self.edge()
        sign = -1 if self.direction == "down" else 1
        if clean is not None and sign * i <= sign * clean:
            return True
        if dirty is not None and sign * i >= sign * dirty:
            return False
        return None

    def exact(self) -> bool:
        """The last clean and the first preempting value are neighbours at full resolution."""
        clean, dirty = self.edge()
        return clean is not None and dirty is not None and abs(clean - dirty) == 1

    def summary(self) -> dict[str, Any]:
        clean, dirty = self.edge()
        return {"knob": self.knob, "others": self.others, "direction": self.direction,
                "last_clean": self.values[clean] if clean is not None else None,
                "first_preempting": self.values[dirty] if dirty is not None else None,
                "exact": self.exact(), "settled": self.settled, "monotone": self.monotone,
                "consistent": self.consistent, "noisy": self.noisy, "proven": self.proven,
                "low": self.values[0], "high": self.values[-1],
                "probes": {str(self.values[i]): c for i, c in sorted(self.counts.items())}}


@dataclass
class BoundarySearch:
    """Decides which values to probe next; `add` feeds back each probe's preemption count."""

    boundary: Boundary
    recheck: bool = True  # probe the two values either side of the boundary once more
    parallel: int = 1  # probes per bisection round: the slots that can run them at once
    start: tuple[int, ...] = ()  # the indices probed first; () = both ends
    gallop: bool = False  # all clean from a start below the boundary: step up by doubling distances, not to the end
    _asked: set[tuple[int, int]] = field(default_factory=set)  # (index, repeat) handed out, not yet answered

    @classmethod
    def over(cls, knob: str, dist: od.BaseDistribution, others: Mapping[str, Any], *, max_preemptions: int = 0,
             recheck: bool | None = None, parallel: int = 1, near: tuple[Any, ...] | None = None,
             direction: str | None = None, noisy: bool = False, gallop: bool = False) -> BoundarySearch:
        """`near`: (last clean, first preempting) of another setting's boundary (or a prediction), with its
        `direction`: start there, and skip the recheck unless asked (None: recheck only a search that starts at
        the ends). `noisy`: replicate the clean side from the start (another setting's repeats disagreed).
        `gallop`: the start is a floor of the boundary (a prediction), so where it runs clean the boundary is
        most likely near above it."""
        values = knob_values(dist)
        start = tuple(values.index(v) for v in near if v in values) if near else ()
        return cls(Boundary(knob, dict(others), values, {}, max_preemptions, direction if start else None,
                            noisy), (not start) if recheck is None else recheck, parallel, start, gallop=gallop)

    def add(self, index: int, repeat: int, preemptions: int | None) -> None:
        self._asked.discard((index, repeat))
        counts = self.boundary.counts.setdefault(index, [])
        if repeat <= len(counts):  # the same probe answered twice (a resume): the first answer stands
            return
        counts.append(preemptions)  # a repeat is only planned once the probe before it has answered

    def wanted(self, free: int) -> list[tuple[int, int]]:
        """Up to `free` (index, repeat) probes to hand out now; [] while waiting for answers, or when done."""
        if free <= 0:
            return []
        out = [p for p in self._plan() if p not in self._asked][:free]
        self._asked.update(out)
        return out

    def done(self) -> bool:
        return not self._asked and not self._plan()

    def _plan(self) -> list[tuple[int, int]]:
        """This round's probes: both ends first (or the given start), then (once a round has answered) the
        split of the interval between the last clean and the first preempting value, then the recheck of the
        two deciding values."""
        b, n = self.boundary, len(self.boundary.values)
        if b.proven:
            return []
        first = [i for i in dict.fromkeys(self.start or (0, n - 1)) if i not in b.counts]
        if first:
            return [(i, 1) for i in first]
        if self._asked:
            return []  # the next round depends on this one's answers
        if not b.monotone:
            return []  # the assumption broke: no amount of bisection helps
        ends = [i for i in (0, n - 1) if i not in b.counts]
        if b.expected is not None and b.direction != b.expected and ends:
            return [(i, 1) for i in ends]  # the start values point the other way: the ends tell what is true
        clean, dirty = b.edge()
        if self.gallop and dirty is None and clean is not None and b.direction == "up" and clean < n - 1:
            first = min(self.start or (0,))  # steps that double, from 1/32 of the start's index (staggered
            return [(min(n - 1, clean + max(1, first // 32, clean - first)), 1)]  # admission: often well above)
        if clean is None or dirty is None:  # all probed alike (a search that started near a boundary)
            if b.expected is not None:  # the end the boundary moved towards: worse if clean, better if not
                worse = n - 1 if b.expected == "up" else 0
                ends = [i for i in ends if i == (worse if dirty is None else n - 1 - worse)]
            if ends:
                return [(i, 1) for i in ends]
        if clean is not None and dirty is not None and abs(clean - dirty) > 1:
            lo, hi = sorted((clean, dirty))
            k = min(self.parallel, hi - lo - 1)
            points = sorted({lo + round((hi - lo) * j / (k + 1)) for j in range(1, k + 1)} - {lo, hi})
            return [(i, 1) for i in points]
        if b.noisy:  # the last clean value, once more at a time, until NOISY_REPEATS probes say it is clean
            runs = len(b.counts[clean]) if clean is not None else NOISY_REPEATS
            return [(clean, runs + 1)] if runs < NOISY_REPEATS else []
        if not self.recheck:
            return []
        # neighbours (or one end of a range without a boundary): probe the deciding values once more
        deciding = [i for i in (clean, dirty) if i is not None]
        return [(i, 2) for i in deciding if len(b.counts[i]) < 2]


def describe(summary: Mapping[str, Any], predicted: int | None = None) -> str:
    """One sentence for the report: the exact boundary, or why there is none."""
    knob, others = summary["knob"], summary.get("others") or {}
    given = (" with " + " ".join(f"{k}={v}" for k, v in sorted(others.items()))) if others else ""
    probes = summary["probes"]

    def counted(value: Any) -> str:
        counts = probes.get(str(value)) or []
        shown = ", ".join("failed" if c is None else str(c) for c in counts)
        return f"{shown} preemptions in {len(counts)} probe{'s' if len(counts) > 1 else ''}"

    if not summary["monotone"]:
        text = (f"no clean preemption boundary along {knob}{given}: preempting and clean values interleave "
                f"({'; '.join(f'{v}: {c}' for v, c in probes.items())}); feasibility is judged from replicates")
    elif not summary["settled"]:
        text = (f"preemption along {knob}{given} is not deterministic here (a repeated probe disagreed: "
                f"{'; '.join(f'{v}: {c}' for v, c in probes.items())}); feasibility is judged from replicates")
    elif summary["last_clean"] is None:
        text = (f"every {knob}{given} preempts ({summary['low']} to {summary['high']}): the boundary lies outside "
                "the range")
    elif summary.get("proven"):
        text = (f"no preemption at any {knob}{given} ({summary['low']} to {summary['high']}): the KV capacity the "
                "engine reported holds the most this work keeps in flight at full length, so no probe was run")
    elif summary["first_preempting"] is None:
        text = (f"no preemption at any {knob}{given} ({summary['low']} to {summary['high']}): the boundary lies "
                "outside the range")
    else:
        clean, dirty = summary["last_clean"], summary["first_preempting"]
        text = (f"preemption boundary{given}: last clean {knob}={clean} ({counted(clean)}), first preempting "
                f"{knob}={dirty} ({counted(dirty)})"
                + ("" if summary["exact"] else " (not neighbours: a probe between them failed)"))
    if summary["monotone"] and summary["settled"] and summary.get("noisy"):
        runs = len(probes.get(str(summary["last_clean"])) or [])
        text += (f"; feasibility was noisy (repeated probes disagreed: "
                 f"{'; '.join(f'{v}: {c}' for v, c in probes.items() if len(set(c)) > 1) or 'in another setting'})"
                 + (f", so the last clean value ran clean in all {runs} of its probes" if runs else "")
                 + ", and a value that preempted in any probe counts as preempting")
    if predicted is not None:
        text += f"; the KV capacity the engine reported predicts the last clean {knob}={predicted}"
    return text


def predicted_last_clean(blocks: int | None, block_size: int | None, request_tokens: Sequence[int]) -> int | None:
    """How many requests of this fixed work fit in the KV cache at their full length, from the engine's own
    capacity (usable blocks of block_size tokens): with closed-loop fixed work they grow together, so one more
    than this running at once must preempt. None when the engine did not say, or the requests differ."""
    if not blocks or not block_size or not request_tokens or len(set(request_tokens)) != 1:
        return None
    per_request = -(-request_tokens[0] // block_size)
    return blocks // per_request
