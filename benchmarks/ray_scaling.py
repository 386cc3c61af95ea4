"""Ray scaling: the same sweep (a grid, so every run does the same work) on 1, 2 and 4 slots of one Ray,
with a fake engine whose replicates take a fixed wall time (it sleeps). Prints the wall time of each
sweep, the scaling efficiency T1 / (k * Tk), and the driver's overhead per trial: wall time beyond
(replicate time / k), divided by the trials. Runs are interleaved (1, 2, 4, 4, 2, 1, ...), medians
reported. Target: efficiency >= 85% at 4 slots.

    python benchmarks/ray_scaling.py [--rounds 2] [--trials 16] [--replicate-s 0.5]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def sweep_once(slots: int, args: argparse.Namespace, results: Path, name: str) -> tuple[float, float]:
    """(wall seconds of the whole sweep command, summed replicate seconds)."""
    from rich.console import Console

    from tests.helpers import compose_cfg
    from throttle_sweep.commands import sweep as sweep_cmd
    from throttle_sweep.store.records import read_records

    cfg = compose_cfg(
        "backend=fake", "fake.realtime=true", f"fake.start_s={args.replicate_s}", "workload.num_requests=4",
        "workload.prompt_len=8", "workload.output_len=4", "workload.concurrency=4", "workload.warmup_requests=0",
        "+space=batching", "space.max_num_seqs.low=1", f"space.max_num_seqs.high={args.trials}",
        "space.max_num_seqs.log=false", "~space.max_num_batched_tokens", "study.sampler=grid",
        f"study.n_trials={args.trials}", "compare.replicates=2", "study.confirm_top=4", "study.confirm_replicates=2",
        "plots=false", "ray.enabled=true", f"ray.slots={slots}", f"study.name={name}", tmp_path=results)
    began = time.perf_counter()
    assert sweep_cmd.run(cfg, Console(quiet=True)) == 0
    wall = time.perf_counter() - began
    records = read_records(results / name / "replicates.jsonl")
    busy = sum((dt.datetime.fromisoformat(r["ended_at"]) - dt.datetime.fromisoformat(r["started_at"])).total_seconds()
               for r in records)
    return wall, busy


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--replicate-s", type=float, default=0.5)
    parser.add_argument("--slots", default="1,2,4")
    args = parser.parse_args()
    counts = [int(s) for s in args.slots.split(",")]

    import ray

    temp = tempfile.mkdtemp(prefix="ts-bench-", dir="/tmp")
    ray.init(address="local", num_cpus=max(counts), include_dashboard=False, _temp_dir=temp,
             _node_ip_address="127.0.0.1", log_to_driver=False, configure_logging=False)
    walls: dict[int, list[float]] = {k: [] for k in counts}
    busy: dict[int, list[float]] = {k: [] for k in counts}
    try:
        with tempfile.TemporaryDirectory() as results:
            for i in range(args.rounds):
                for k in counts if i % 2 == 0 else reversed(counts):
                    wall, work = sweep_once(k, args, Path(results), f"s{k}-{i}")
                    walls[k].append(wall)
                    busy[k].append(work)
                    print(f"round {i}: {k} slot(s): sweep {wall:6.1f}s  replicate time {work:6.1f}s", flush=True)
    finally:
        ray.shutdown()
    t1 = statistics.median(walls[counts[0]]) * counts[0]
    comparisons = args.trials + 4
    print(f"\n{args.trials} trials + 4 confirmations, 2+2 replicates each, ~{args.replicate_s}s a replicate "
          f"(medians of {args.rounds} runs)")
    print(f"{'slots':>5}  {'wall s':>7}  {'speed-up':>8}  {'efficiency':>10}  {'overhead/comparison':>20}")
    for k in counts:
        wall = statistics.median(walls[k])
        overhead = (wall - statistics.median(busy[k]) / k) / comparisons
        print(f"{k:>5}  {wall:7.1f}  {t1 / wall:8.2f}  {t1 / (k * wall):10.1%}  {overhead * 1e3:17.0f} ms")
    print(f"target: efficiency >= 85% at 4 slots -> {'met' if t1 / (4 * statistics.median(walls[4])) >= 0.85 else 'NOT met'}"
          if 4 in walls else "")


if __name__ == "__main__":
    main()
