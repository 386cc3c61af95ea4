"""Warm engines on the real engine (vLLM CPU, the embedded tiny model), two measurements in one run:

1. Lifetime-to-lifetime against within-lifetime variance of the cost per token: L engine lifetimes of R
   replicates each of one configuration (a warm slot with restart=every_k, k=R), one-way random-effects
   ANOVA on log cost (each lifetime's first replicate left out). If the between-lifetime component is not
   small against the within-lifetime one, a comparison whose arms each run on one lifetime understates its
   noise.
   The same runs, made without a warm-up run, show how much slower a new engine's first replicate is.
2. A/A comparisons with the default policy, as a sweep runs them: the baseline's engine stays warm across
   comparisons, each comparison's candidate (the same flags; only `seed` differs, which moves no cost with
   fixed-length outputs) gets a new engine. The false-verdict rate should be at most alpha.

    python benchmarks/warm_engines.py [--lifetimes 5] [--replicates 5] [--aa 20] [--restart never|per_replicate]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

from scipy import stats as sps

from throttle_sweep.cluster.slot import WarmSlot
from throttle_sweep.engines import VllmInprocEngine
from throttle_sweep.measurement.cost import Price
from throttle_sweep.measurement.workload import WorkloadSpec
from throttle_sweep.stats.analysis import analyse
from throttle_sweep.stats.schedule import BASELINE, CANDIDATE, make_schedule
from throttle_sweep.stats.verdict import CHEAPER, PRICIER, Thresholds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lifetimes", type=int, default=5)
    parser.add_argument("--replicates", type=int, default=5)
    parser.add_argument("--aa", type=int, default=20)
    parser.add_argument("--max-num-seqs", type=int, default=4)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--restart", default="never", help="the policy the A/A compares use")
    args = parser.parse_args()
    spec = WorkloadSpec(num_requests=16, prompt_len=32, output_len=args.output_len, concurrency=16)
    flags = {"max_num_seqs": args.max_num_seqs, "max_model_len": 256, "kv_cache_memory_bytes": 2 << 20,
             "enforce_eager": True, "seed": 0}
    engine, price = VllmInprocEngine(), Price()
    began = time.perf_counter()

    if args.lifetimes:
        variance(args, engine, spec, price, flags)
    aa(args, engine, spec, price, flags)
    print(f"took {time.perf_counter() - began:.0f} s")


def variance(args, engine, spec, price, flags) -> None:
    # 1. variance between and within lifetimes, and what a new lifetime's first replicate costs extra
    slot = WarmSlot(engine, spec, price, run_id="bench", restart="every_k", restart_every=args.replicates,
                    engines=1, engine_warmup="none")
    try:
        groups: dict[str, list[float]] = {}
        for i in range(args.lifetimes * args.replicates):
            record = slot.measure(flags, BASELINE, i, {})
            assert record["status"] == "ok", record.get("reason")
            groups.setdefault(record["engine_lifetime"]["id"], []).append(math.log(record["steady"]["usd_per_mtok"]))
    finally:
        slot.close()
    lives = list(groups.values())
    first = [v[0] - statistics.fmean(v[1:]) for v in lives]  # log excess of each lifetime's first replicate
    print(f"a new engine's first replicate against its later ones (max_num_seqs={args.max_num_seqs}; no warm-up run):")
    print(f"  the process's first engine: {100 * math.expm1(first[0]):+.1f}%;  later engines in the same process: "
          + "  ".join(f"{100 * math.expm1(x):+.1f}%" for x in first[1:])
          + f"  (mean {100 * math.expm1(statistics.fmean(first[1:])):+.1f}%)")
    warm = [v[1:] for v in lives]  # what a comparison measures: the replicates after the first
    r, g = len(warm[0]), len(warm)
    msw = statistics.fmean(statistics.variance(v) for v in warm)
    msb = r * statistics.variance([statistics.fmean(v) for v in warm])
    between = max(0.0, (msb - msw) / r)
    f = msb / msw
    p = sps.f.sf(f, g - 1, g * (r - 1))
    print(f"variance of log cost per token, {g} lifetimes x {r} replicates after the first:")
    print(f"  within a lifetime   sd {math.sqrt(msw) * 100:.2f}%")
    print(f"  between lifetimes   sd {math.sqrt(between) * 100:.2f}%  (variance component {between / msw:.2f} x the "
          f"within one; F={f:.2f} on {g - 1} and {g * (r - 1)} df, p={p:.3f})")
    for life, v in groups.items():
        print(f"    lifetime {life}: " + "  ".join(f"{math.exp(x):.4f}" for x in v))



def aa(args, engine, spec, price, flags) -> None:
    # 2. A/A compares with the default policy
    slot = WarmSlot(engine, spec, price, run_id="bench", restart=args.restart)
    thresholds = Thresholds(equivalence_margin=0.0)  # no margin: a false verdict is the interval's miss
    verdicts, ratios = [], []
    try:
        for c in range(args.aa):
            order = make_schedule("abba", 4, seed=c, lead=BASELINE if c % 2 == 0 else CANDIDATE)
            arms = {BASELINE: flags, CANDIDATE: {**flags, "seed": c + 1}}
            records = [slot.measure(arms[arm], arm, i, {"comparison": c}) for i, arm in enumerate(order)]
            result = analyse(records, thresholds, cost="steady")
            verdicts.append(result.verdict)
            ratios.append(result.estimate.ratio if result.estimate else float("nan"))
            print(f"  A/A {c + 1:2d}: ratio {ratios[-1]:.4f}  {result.verdict}", flush=True)
    finally:
        slot.close()
    false = sum(v in (CHEAPER, PRICIER) for v in verdicts)
    print(f"A/A with restart={args.restart}: {false} of {len(verdicts)} "
          f"false verdicts ({false / len(verdicts):.3f}; alpha {thresholds.alpha}); ratios "
          f"{min(ratios):.4f} to {max(ratios):.4f}")


if __name__ == "__main__":
    main()
