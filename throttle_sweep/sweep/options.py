"""What a sweep is told to do: its budgets, limits, schedules and rules, checked before it starts
(settings/sweep.py builds it from the config)."""

from __future__ import annotations

from dataclasses import dataclass, field

from throttle_sweep.stats.verdict import Thresholds


@dataclass(frozen=True)
class SweepSettings:
    n_trials: int = 10
    timeout_s: float | None = None
    budget_usd: float | None = None
    usd_per_gpu_hour: float = 1.39  # for the dollar budget, times the GPUs each record was charged for
    max_preemptions: int = 0
    max_p95_ttft_s: float | None = None
    max_p95_tpot_s: float | None = None  # per request: mean time per output token after the first
    max_p95_itl_s: float | None = None  # pooled: every gap between a request's tokens (vLLM's ITL)
    cost_basis: str = "steady"  # which cost per token is judged (analysis.COST_BASES)
    schedule: str = "abba"
    replicates: int = 4
    warmup_replicate: bool = False  # one unmeasured run first in every comparison (warm engines warm themselves)
    schedule_seed: int = 0
    confirm_top: int = 2
    confirm_replicates: int = 4
    tiebreak_replicates: int = 8  # runs of each candidate tied with the winner, against each other (0: none)
    token_tolerance: float = 0.0
    thresholds: Thresholds = field(default_factory=Thresholds)
    multi_objective: bool = False  # minimise cost ratio and p95 end-to-end latency; report the Pareto front
    boundary_knob: str | None = None  # probe where preemption starts along this knob first (None: no probes)
    boundary_settings_max: int = 16  # probe it for each setting of the other knobs, if there are at most this many
    sequential: bool = True  # look after every balanced block and stop comparisons once decided
    same_schedule: bool = True  # one engine schedule, one configuration (sweep/schedules.py)
    reference: str = "auto"  # what search comparisons run against: auto (probes.choose_reference) | baseline
    shared_baseline: bool = True  # confirmations run one after another share the baseline's runs (joint_schedule)
    pooled_noise: bool = True  # search comparisons judged with the noise pooled over the others (stats.pooled_prior)

    @property
    def latency_limits(self) -> dict[str, float | None]:
        return {"p95_ttft_s": self.max_p95_ttft_s, "p95_tpot_s": self.max_p95_tpot_s,
                "p95_itl_s": self.max_p95_itl_s}
