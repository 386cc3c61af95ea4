"""Two local slots against one, on the real engine (vLLM CPU, the embedded tiny model, the default workload):
is a comparison still honest when another engine runs beside it on this machine's other core, and how much
sooner do the answers come? In interleaved rounds (one slot, then two; then two, then one), A/A comparisons
as a sweep runs them (abba 4+4, the default warm-engine policy; the candidate differs only in `seed`, which
moves no cost with fixed-length outputs): with one slot alone, and with two slots each running its own A/A
comparisons at the same time. Prints, for each: false verdicts (should be at most alpha), the spread of the
A/A ratios, the spread of the runs around each comparison's fit, the cost level (how much slower a run is
with a neighbour), and comparisons answered per minute of wall time; then the two-slot/one-slot ratios.

    .venv/bin/python benchmarks/local_slots.py [--rounds 2] [--per-round 5] [--max-num-seqs 4]

`--beside N`: a neighbour whose load differs by arm instead. N A/A comparisons on slot 0 while slot 1 compares
max_num_seqs 1 against 8, each of slot 1's comparisons led against slot 0's current one; any effect of the
neighbour that follows slot 0's arms moves slot 0's mean A/A ratio off 1. (Not a strict worst case: slot 1's
arms differ in run length, so the two orders drift apart within a comparison.)
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections import defaultdict

from throttle_sweep.cluster.pool import Job, LocalPool
from throttle_sweep.cluster.slot import WarmSlot
from throttle_sweep.engines import VllmInprocEngine
from throttle_sweep.measurement.cost import Price
from throttle_sweep.measurement.workload import WorkloadSpec
from throttle_sweep.stats.analysis import analyse
from throttle_sweep.stats.schedule import BASELINE, CANDIDATE, make_schedule
from throttle_sweep.stats.verdict import CHEAPER, PRICIER, Thresholds

SPEC = WorkloadSpec(num_requests=16, prompt_len=96, output_len=64, concurrency=16)  # conf/workload/closed_loop
FLAGS = {"max_model_len": 1024, "kv_cache_memory_bytes": 2359296, "enforce_eager": True}  # conf/engine/tiny_cpu


def comparisons(pool: LocalPool, slots: int, count: int, first: int, flags: dict) -> tuple[list[list[dict]], float]:
    """`count` A/A comparisons on each of `slots` slots, all slots at once; the records of each, and the wall time."""
    todo = {s: [first + s * count + i for i in range(count)] for s in range(slots)}
    current: dict[int, tuple[int, list[str], list[dict]]] = {}
    done: list[list[dict]] = []

    def start(slot: int) -> None:
        if not todo[slot]:
            return
        c = todo[slot].pop(0)
        order = make_schedule("abba", 4, seed=c, lead=BASELINE if c % 2 == 0 else CANDIDATE)
        current[slot] = (c, order, [])
        submit(slot)

    def submit(slot: int) -> None:
        c, order, records = current[slot]
        arm = order[len(records)]
        arm_flags = {**flags, "seed": 0 if arm == BASELINE else c + 1}
        pool.submit(Job(slot, arm_flags, arm, len(records), {"comparison": c, "stage": "search"}))

    began = time.perf_counter()
    for slot in range(slots):
        start(slot)
    while current:
        for job, record in pool.wait():
            assert record["status"] == "ok", record.get("reason")
            c, order, records = current[job.slot]
            records.append(record)
            if len(records) == len(order):
                done.append(records)
                del current[job.slot]
                start(job.slot)
            else:
                submit(job.slot)
    return done, time.perf_counter() - began


def beside(pool: LocalPool, count: int, flags: dict, neighbour: tuple[int, int]) -> list[list[dict]]:
    """`count` A/A comparisons on slot 0 while slot 1 compares max_num_seqs neighbour[0] against neighbour[1]
    without pause, each of its comparisons led by the arm slot 0's current one does not lead with: the
    neighbour's load differs by arm and starts against slot 0's order (its runs' lengths differ, so the
    orders drift apart)."""
    todo, done = list(range(count)), []
    current: dict[int, tuple[int, list[str], list[dict], dict]] = {}

    def start(slot: int) -> None:
        if slot == 0:
            if not todo:
                return
            c = todo.pop(0)
            lead = BASELINE if c % 2 == 0 else CANDIDATE
            arms = {BASELINE: {**flags, "seed": 0}, CANDIDATE: {**flags, "seed": c + 1}}
        else:
            if 0 not in current:
                return
            c = 10_000 + len(done)
            lead = CANDIDATE if current[0][1][0] == BASELINE else BASELINE
            arms = {BASELINE: {**flags, "max_num_seqs": neighbour[0]}, CANDIDATE: {**flags, "max_num_seqs": neighbour[1]}}
        current[slot] = (c, make_schedule("abba", 4, seed=c, lead=lead), [], arms)
        submit(slot)

    def submit(slot: int) -> None:
        c, order, records, arms = current[slot]
        arm = order[len(records)]
        pool.submit(Job(slot, arms[arm], arm, len(records), {"comparison": c, "stage": "search"}))

    start(0)
    start(1)
    while current:
        for job, record in pool.wait():
            assert record["status"] == "ok", record.get("reason")
            c, order, records, _ = current[job.slot]
            records.append(record)
            if len(records) == len(order):
                del current[job.slot]
                if job.slot == 0:
                    done.append(records)
                start(job.slot)
                if job.slot == 0 and 1 not in current:
                    start(1)
            else:
                submit(job.slot)
    return done


def residual_sd(records: list[dict]) -> float:
    """The spread of a comparison's runs around arm + linear drift (what its interval is made of)."""
    import numpy as np

    y = np.log([r["steady"]["usd_per_mtok"] for r in records])
    x = np.column_stack([np.ones(len(y)), [r["arm"] == CANDIDATE for r in records], np.arange(len(y))])
    beta, *_ = np.linalg.lstsq(x, y, rcond=None)
    resid = y - x @ beta
    return float(math.sqrt(resid @ resid / (len(y) - 3)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--per-round", type=int, default=5, help="A/A comparisons per slot in each phase")
    parser.add_argument("--max-num-seqs", type=int, default=4)
    parser.add_argument("--beside", type=int, default=0,
                        help="instead: this many A/A comparisons on slot 0 beside a max_num_seqs 1 vs 8 neighbour")
    args = parser.parse_args()
    if args.beside:
        return main_beside(args)
    engine, price, thresholds = VllmInprocEngine(), Price(), Thresholds(equivalence_margin=0.0)  # A/A: no margin
    flags = {**FLAGS, "max_num_seqs": args.max_num_seqs}
    slots = [WarmSlot(engine, SPEC, price, run_id="bench", name=f"local-{i}") for i in range(2)]
    for slot in slots:
        slot.warm_up()
    pools = {1: LocalPool([slots[0].measure]), 2: LocalPool([s.measure for s in slots])}
    results: dict[int, list[list[dict]]] = defaultdict(list)
    walls: dict[int, float] = defaultdict(float)
    began, first = time.perf_counter(), 0
    try:
        comparisons(pools[2], 2, 1, 10_000, flags)  # both engine processes import vLLM and warm up, unmeasured
        for r in range(args.rounds):
            for n in ((1, 2) if r % 2 == 0 else (2, 1)):
                done, wall = comparisons(pools[n], n, args.per_round, first, flags)
                first += n * args.per_round
                results[n] += done
                walls[n] += wall
                print(f"round {r + 1}, {n} slot(s): {len(done)} A/A comparisons in {wall:.0f} s", flush=True)
    finally:
        for pool in pools.values():
            pool.close()
        for slot in slots:
            slot.close()
    summary = {}
    for n in (1, 2):
        analyses = [analyse(records, thresholds, cost="steady") for records in results[n]]
        ratios = [a.estimate.ratio for a in analyses if a.estimate]
        false = sum(a.verdict in (CHEAPER, PRICIER) for a in analyses)
        level = statistics.median(r["steady"]["usd_per_mtok"] for records in results[n] for r in records)
        spread = statistics.stdev(math.log(x) for x in ratios)
        within = statistics.fmean(residual_sd(records) for records in results[n])
        rate = 60 * len(analyses) / walls[n]
        summary[n] = (level, spread, within, rate)
        print(f"{n} slot(s): {false} of {len(analyses)} false verdicts (alpha {thresholds.alpha}); A/A ratios "
              f"{min(ratios):.4f}..{max(ratios):.4f}, sd of log ratio {100 * spread:.2f}%; runs around each fit: "
              f"sd {100 * within:.2f}%; median cost ${level:.4f}/M; {rate:.2f} comparisons a minute")
    (l1, s1, w1, r1), (l2, s2, w2, r2) = summary[1], summary[2]
    print(f"two slots / one: cost level {l2 / l1:.3f}, A/A ratio spread {s2 / s1:.2f}, run spread {w2 / w1:.2f}, "
          f"comparisons a minute {r2 / r1:.2f}")
    print(f"took {time.perf_counter() - began:.0f} s")


def main_beside(args) -> None:
    engine, price, thresholds = VllmInprocEngine(), Price(), Thresholds(equivalence_margin=0.0)  # A/A: no margin
    flags = {**FLAGS, "max_num_seqs": args.max_num_seqs}
    slots = [WarmSlot(engine, SPEC, price, run_id="bench", name=f"local-{i}") for i in range(2)]
    for slot in slots:
        slot.warm_up()
    pool = LocalPool([s.measure for s in slots])
    began = time.perf_counter()
    try:
        comparisons(pool, 2, 1, 20_000, flags)  # both engine processes import vLLM and warm up, unmeasured
        done = beside(pool, args.beside, flags, (1, 8))
    finally:
        pool.close()
        for slot in slots:
            slot.close()
    analyses = [analyse(records, thresholds, cost="steady") for records in done]
    logs = [math.log(a.estimate.ratio) for a in analyses if a.estimate]
    false = sum(a.verdict in (CHEAPER, PRICIER) for a in analyses)
    mean, se = statistics.fmean(logs), statistics.stdev(logs) / math.sqrt(len(logs))
    t = 2.093 if len(logs) == 20 else 2.0  # t(0.975, 19)
    print(f"A/A on slot 0 beside max_num_seqs 1 vs 8 on slot 1 (opposite leads): {false} of {len(analyses)} false "
          f"verdicts (alpha {thresholds.alpha}); mean A/A ratio {math.exp(mean):.4f} "
          f"[{math.exp(mean - t * se):.4f}, {math.exp(mean + t * se):.4f}] (a bias from the neighbour moves it off 1); "
          f"sd of log ratio {100 * statistics.stdev(logs):.2f}%; runs around each fit: sd "
          f"{100 * statistics.fmean(residual_sd(r) for r in done):.2f}%")
    print(f"took {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
