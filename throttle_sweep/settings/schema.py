"""Typed config schemas, registered in Hydra's ConfigStore so YAML values are type-checked at composition.

Engine flags (`engine`, `baseline`, `candidate`) are open dicts on purpose: their keys are vLLM's engine
arguments, checked against vLLM's own `EngineArgs` fields before any engine starts (engines/flags.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore

from throttle_sweep.engines.fake import FakeKnobs
from throttle_sweep.engines.twin.engine import TwinConf

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")  # shipped inside the package: any install works


@dataclass
class WorkloadConf:
    num_requests: int = 64
    prompt_len: int = 64
    output_len: int = 128
    length_dist: str = "fixed"
    length_spread: float = 0.5
    loop: str = "closed"
    concurrency: int = 8
    rate: float | None = None
    jsonl: str | None = None
    sharegpt: str | None = None
    chars_per_token: float = 4.0
    tokenizer: str | None = None
    shared_prefix_len: int = 0
    warmup_requests: int | None = None  # null: one full batch (concurrency) of short requests
    warmup_output_len: int = 16
    seed: int = 0
    vocab_limit: int = 1000
    replicate_s: float | None = None  # size the work by time, from one calibration run of the baseline
    target_rps: float | None = None  # a goodput sweep: the traffic to serve, which sizes the replicas
    arrival_seed: int | None = None  # open loop: the arrivals' own random stream (null: seed)
    trace: str | None = None  # a timed trace replayed (workload=trace; throttle_sweep/measurement/trace.py)
    trace_speed: float = 1.0
    trace_start_s: float = 0.0
    trace_span_s: float | None = None
    trace_max_requests: int | None = None
    trace_block_size: int = 512


@dataclass
class CostConf:
    usd_per_gpu_hour: float = 1.39
    gpus: int = 1
    usd_per_kwh: float | None = None  # a price of energy: the energy the GPUs used (NVML) added to each cost
    # GPU type -> USD per GPU-hour (a goodput sweep on Ray: the type becomes a knob, each type's runs go to a
    # slot on a node with Ray's `accelerator_type:<type>` resource)
    prices: Any = None  # {type: USD per GPU-hour} (typed Any: OmegaConf cannot merge a dict into a None Dict node)
    baseline_type: str | None = None  # the type vLLM's defaults run on as the baseline (null: the first priced)


@dataclass
class CompareConf:
    schedule: str = "abba"  # abba (complete B C C B blocks) | aba-bab | random
    replicates: int = 4  # per arm
    warmup_replicate: bool = False  # one unmeasured run first, with the leading arm's flags
    restart: str = "per_replicate"  # when an engine is restarted: per_replicate | never | every_k (see cluster/slot.py)
    restart_every: int | None = None  # every_k: replicates per engine lifetime
    # an unmeasured run of the workload: first (an engine process's first engine) | every | none
    engine_warmup: str = "first"
    engines_per_slot: int = 2  # engine processes a slot keeps warm (the baseline's and a candidate's)
    lead: str = "baseline"  # mode=compare: the arm that runs first (sweeps alternate it across comparisons)
    alpha: float = 0.05  # two-sided; CHEAPER is a one-sided claim at alpha/2
    min_effect: float = 0.0  # the smallest difference worth a change, if larger than the margin (acts as it)
    equivalence_margin: float = 0.02  # CHEAPER: whole interval below 1 - margin; NO DIFFERENCE: inside 1 +/- it
    token_tolerance: float = 0.0  # relative spread of output tokens / requests tolerated across replicates
    seed: int = 0
    cost: str = "steady"  # the cost judged: steady (closed loop, before the drain) | fixed_work | offered_load


@dataclass
class StudyConf:
    name: str | None = None  # null: "sweep-<space>"; the same name resumes the study
    objective: str = "cost"  # cost (fixed work, closed loop) | goodput (cost at capacity within the slo)
    storage: str | None = None  # any Optuna storage URL; null: sqlite under results/<name>/
    sampler: str = "tpe"  # tpe | gp | random | grid
    n_trials: int = 10
    timeout_s: float | None = None  # wall-time budget for the search
    budget_usd: float | None = None  # stop when measured GPU time (at the assumed price) reaches this
    seed: int = 0
    max_preemptions: int = 0  # a candidate that preempts more than this is infeasible
    max_p95_ttft_s: float | None = None
    max_p95_tpot_s: float | None = None  # per request: mean time per output token after the first
    max_p95_itl_s: float | None = None  # pooled gaps between tokens, as vLLM's benchmarks define ITL
    multi_objective: bool = False  # cost and p95 end-to-end latency: report the Pareto front
    confirm_top: int = 2  # best feasible candidates re-measured against the baseline, with fresh replicates
    confirm_replicates: int = 4
    tiebreak_replicates: int = 8  # runs each of the candidates tied with the winner, against each other (0: none)
    boundary: str | None = "auto"  # probe where preemption starts first: auto | none | a knob of the space
    boundary_settings_max: int = 16  # ... for each setting of the other knobs, if they have at most this many
    sequential: bool = True  # look after every balanced block; stop a comparison once it is decided
    same_schedule: bool = True  # flags with a measured configuration's engine schedule take its answer
    reference: str = "auto"  # search comparisons against: auto (the boundary's last clean point) | baseline
    shared_baseline: bool = True  # confirmations run one after another share the baseline's runs (one schedule)
    pooled_noise: bool = True  # search comparisons' noise shrunk toward the sweep's pooled estimate (stats/verdict.py)


@dataclass
class RayConf:
    enabled: bool = False  # run trials on Ray slots (one engine per slot)
    address: str | None = None  # null: start a private local Ray; "auto" or an address: join that cluster
    slots: int | None = None  # null: GPUs / an engine's GPUs (tensor x pipeline parallel), or cpu_slots on CPU
    cpu_slots: int = 1
    max_slots: int = 8
    gpus_per_slot: float | None = None  # null: tensor x pipeline parallel size on GPU clusters, 0 on CPU
    cpus_per_slot: float = 1.0
    start_timeout_s: float = 300.0  # every slot's actor must be placed within this, or the sweep stops early
    job_timeout_s: float = 1800.0  # a replicate of flags not seen yet must answer within this (start included)
    job_timeout_factor: float = 10.0  # ... and flags seen before within this many times their longest (>= 60 s)


@dataclass
class ServerConf:
    """backend=server: vLLM's OpenAI-compatible API server, one per engine lifetime (engines/vllm_server.py)."""

    start_timeout_s: float = 600.0  # the server must answer /health within this (import, load, compile)
    stop_grace_s: float = 15.0  # after SIGTERM, then SIGKILL of its process group
    request_timeout_s: float = 600.0  # the longest wait for any one read of a streamed request (not its whole time)
    log_dir: str | None = None  # null: <results_dir>/server-logs


@dataclass
class EndpointConf:
    """backend=endpoint: servers the user already runs (engines/endpoint.py); an arm is a URL, not flags."""

    url: str | None = None  # mode=measure (and both arms of an A/A compare)
    baseline_url: str | None = None  # mode=compare
    candidate_url: str | None = None
    model: str | None = None  # null: the first model the server lists
    api_key_env: str | None = None  # the environment variable holding the API key (never written anywhere)
    request_timeout_s: float = 600.0  # the longest wait for any one read of a streamed request


@dataclass
class SloConf:
    """mode=capacity: which requests meet the latency SLO, and what share of them must."""

    p95_ttft_s: float | None = None  # time to first token, from the request's scheduled arrival
    p95_tpot_s: float | None = None  # time per output token after the first
    attainment: float = 0.9  # the share of requests that must meet both limits (DistServe's goodput)


@dataclass
class CapacityConf:
    """mode=capacity: how the arrival rate is searched (capacity/rates.py)."""

    rate_start: float | None = None  # requests/s of the first run; null: workload.rate if an open loop, else 1
    rel_tol: float = 0.1  # bisection stops once the highest rate that holds and the lowest that fails are this close
    knee_rates: int = 5  # then this many rates around the knee ...
    knee_replicates: int = 4  # ... run this many times each, in alternating order (even: drift lands alike)
    knee_margin: float = 0.2  # the knee's rates reach this far beyond the bracket, each side
    settle_share: float | None = None  # replaced by a warm-up chosen per run (capacity/steady.py); refused if set
    run_s: float = 30.0  # a run's arrivals span at least this long: more than workload.num_requests at high rates
    min_rate: float = 0.01
    max_rate: float = 10000.0


@dataclass
class RecheckConf:
    best: str | None = None  # a best/ folder to re-certify (else study.name's: results/<study.name>/best)


@dataclass
class PlanConf:
    """mode=plan: the replicas a day of demand needs, read from a finished capacity or goodput study."""

    demand: str | None = None  # a CSV of start_s,requests_per_s rows, or a trace (bucketed)
    bucket_s: float | None = None  # a trace's bucket width, and a CSV's last row's (null: 3600 s; the row before's)
    config: str | None = None  # a goodput sweep's confirmed configuration ("baseline", "trial 3"); null: its winner


@dataclass
class Config:
    mode: str = "measure"  # measure | compare | analyze | sweep | export | capacity | recheck | plan
    backend: str = "vllm"  # vllm (in-process) | server (vLLM's OpenAI API server) | endpoint (yours) | twin | fake
    run: str | None = None  # results/<run>/; null: generated from mode and time
    results_dir: str = "results"
    input: str | None = None  # analyze: records (.jsonl) or a minimal CSV/JSONL
    comparison: str | None = None  # analyze: the one comparison to recompute (its id or key); null: every one
    engine: dict[str, Any] = field(default_factory=dict)
    baseline: dict[str, Any] = field(default_factory=dict)
    candidate: dict[str, Any] = field(default_factory=dict)
    workload: WorkloadConf = field(default_factory=WorkloadConf)
    cost: CostConf = field(default_factory=CostConf)
    compare: CompareConf = field(default_factory=CompareConf)
    study: StudyConf = field(default_factory=StudyConf)
    slo: SloConf = field(default_factory=SloConf)
    capacity: CapacityConf = field(default_factory=CapacityConf)
    recheck: RecheckConf = field(default_factory=RecheckConf)
    plan: PlanConf = field(default_factory=PlanConf)
    space: dict[str, Any] | None = None
    fake: FakeKnobs = field(default_factory=FakeKnobs)  # the fake engine's knobs (backend=fake)
    twin: TwinConf = field(default_factory=TwinConf)  # the GPU twin's (backend=twin): which GPU it simulates
    slots: int | None = None  # sweeps on this machine: engine slots side by side; null: one per core (CPU build)
    ray: RayConf = field(default_factory=RayConf)
    server: ServerConf = field(default_factory=ServerConf)
    endpoint: EndpointConf = field(default_factory=EndpointConf)
    plots: bool = True


def register() -> None:
    ConfigStore.instance().store(name="config_schema", node=Config)
