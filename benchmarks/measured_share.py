"""Measured-work share of `scripts/demo`: the replicates' measured seconds (sum of `wall_s`) over the
command's wall time times its slots (each slot side by side has that time to fill), and where the rest went (engine starts, warm-up runs, process start-up, the driver).
With --old, the demo also runs as it did before warm engines (a new engine for every replicate and an
unmeasured warm-up run in every comparison), interleaved new, old, new, old..., and the wall times are
set side by side. With --cold, the demo also runs with an empty engine-flag cache (engines/flags.py), so its
driver imports vLLM to check the flags, as every command did before the cache.

    python benchmarks/measured_share.py [--rounds 1] [--old] [--cold] [-- extra overrides]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OLD = ["compare.restart=per_replicate", "compare.warmup_replicate=true", "compare.engine_warmup=none"]


def run(overrides: list[str], cold: bool = False) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as out:
        env = {**os.environ, "THROTTLE_SWEEP_CACHE": os.path.join(out, "empty-cache")} if cold else None
        began = time.perf_counter()
        subprocess.run([sys.executable, "-m", "throttle_sweep", "+experiment=demo", f"results_dir={out}", *overrides],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        wall = time.perf_counter() - began
        records = [json.loads(line) for line in (Path(out) / "demo" / "replicates.jsonl").open()]
    measured = sum(r.get("wall_s") or 0 for r in records if not r.get("warmup"))
    # slots side by side each have the command's wall time to fill: the share is of slot-seconds
    slots = max((r.get("slots") or 1 for r in records), default=1)
    return {"wall": wall, "measured": measured, "slots": slots, "share": measured / (wall * slots),
            "runs": len(records),
            "starts": sum(r.get("engine_start_s") or 0 for r in records),
            "warmups": sum(r.get("engine_warmup_s") or 0 for r in records)
            + sum(r.get("wall_s") or 0 for r in records if r.get("warmup"))}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--old", action="store_true", help="also run the demo as before warm engines")
    parser.add_argument("--cold", action="store_true", help="also run the demo with an empty engine-flag cache")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {"new": [], "old": [], "cold": []}
    arms = ["new", *(["old"] if args.old else []), *(["cold"] if args.cold else [])]
    for _ in range(args.rounds):
        for name in arms:
            r = run(args.overrides + (OLD if name == "old" else []), cold=name == "cold")
            results[name].append(r)
            print(f"{name}: wall {r['wall']:.0f} s on {r['slots']} slot(s), measured {r['measured']:.0f} s "
                  f"(share of slot-seconds {r['share']:.2f}), "
                  f"{r['runs']} records, engine starts {r['starts']:.0f} s, warm-up runs {r['warmups']:.0f} s", flush=True)
    if args.old:
        new, old = (sum(r["wall"] for r in results[k]) for k in ("new", "old"))
        print(f"demo wall time new/old: {new / old:.2f} ({new:.0f} s vs {old:.0f} s)")
    if args.cold:
        new, cold = (sum(r["wall"] for r in results[k]) for k in ("new", "cold"))
        print(f"demo wall time with the flag cache / without: {new / cold:.2f} ({new:.0f} s vs {cold:.0f} s)")


if __name__ == "__main__":
    main()
