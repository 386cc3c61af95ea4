"""What the rest of a sweep will cost, projected from the probes' measured run times before the search spends
anything: engine-hours, wall time and dollars at the assumed price. Pure: the driver supplies the times."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Plan:
    runs: int
    engine_s: float
    wall_s: float
    usd: float
    per_trial_usd: float  # one search comparison at most
    per_trial_s: float  # its wall time on its slot
    confirm_usd: float = 0.0  # the confirmation (and a tie-break, should it need one) at most: the search keeps it
    confirm_s: float = 0.0  # ... its wall time (it runs alone)

    def sentence(self, *, slots: int, budget_usd: float | None, timeout_s: float | None,
                 basis: str = "the probes' run times") -> str:
        text = (f"plan: up to {self.runs} more runs, about {self.engine_s / 3600:.2f} engine-hours "
                f"({self.wall_s / 60:.1f} min of wall time on {slots} slot(s)), about ${self.usd:.2f} at the assumed "
                f"price, projected from {basis}")
        if budget_usd is not None and self.usd > budget_usd:
            text += (f"; study.budget_usd={budget_usd:g} covers part of it: the search stops before a comparison "
                     "would leave too little for the confirmation of the best so far")
        if timeout_s is not None and self.wall_s > timeout_s:
            text += (f"; study.timeout_s={timeout_s:g} ends the search before all of it: no comparison is started "
                     "that would leave too little time for the confirmation")
        return text


def project(*, trials: int, replicates: int, warmup: bool, confirm: int, confirm_replicates: int, joint: bool,
            slots: int, baseline_s: float, yardstick_s: float, candidate_s: float, usd_per_s: float,
            tiebreak_replicates: int = 0) -> Plan:
    """`trials` search comparisons (up to `replicates` runs of the yardstick and of a candidate each, a warm-up
    run first if `warmup`), then `confirm` candidates against the baseline (one joint schedule, or one each);
    `*_s` are engine-seconds per run of each arm, `usd_per_s` the price of an engine-second. Search runs on
    every slot at once; confirmation runs alone, and so does a tie-break among the jointly confirmed, should
    they tie (`tiebreak_replicates` candidate runs each: counted, since the plan says "up to")."""
    trial_s = replicates * (yardstick_s + candidate_s) + (yardstick_s if warmup else 0.0)
    search_s = trials * trial_s
    groups = 1 if joint else confirm
    confirm_s = (groups * confirm_replicates * baseline_s + confirm * confirm_replicates * candidate_s
                 + (groups * baseline_s if warmup else 0.0)) if confirm else 0.0
    runs = trials * (2 * replicates + warmup) + ((groups + confirm) * confirm_replicates + groups * warmup
                                                 if confirm else 0)
    tie = joint and confirm > 1 and tiebreak_replicates > 0
    tie_s = confirm * tiebreak_replicates * candidate_s + (candidate_s if warmup else 0.0) if tie else 0.0
    runs += confirm * tiebreak_replicates + warmup if tie else 0
    confirm_s += tie_s
    engine_s = search_s + confirm_s
    return Plan(runs, engine_s, search_s / max(1, slots) + confirm_s, engine_s * usd_per_s, trial_s * usd_per_s,
                trial_s, confirm_s * usd_per_s, confirm_s)
