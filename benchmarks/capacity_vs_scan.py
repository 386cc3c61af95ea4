"""mode=capacity's search against a dense scan, on the fake engine (a known queueing surface). For each seed,
configuration (max_num_seqs) and SLO, the same fake (its arrival schedule and per-run speed noise drawn from
the seed) is measured twice through the same machinery (WarmSlot, workload, each run's warm-up and trend rule:
runs.met_of): the capacity search as `python -m throttle_sweep mode=capacity` runs it (bracket, bisection,
replicated knee), and a dense scan: a geometric ladder of rates --step apart, --reps runs at each (ascending,
then descending), whose knee is where its mean attainment, made non-increasing and interpolated in log rate,
crosses slo.attainment (knee.fit_knee on all its runs). The scan is centred on the search's estimate, --span either
side: a scan that did not know where to look would need a wider range and cost more, so its engine-seconds
flatter it. Prints each cell's capacity and 95% interval, the scan's knee, their relative difference and the
engine-seconds of each (wall, start and warm-up seconds of every record, void runs included: sweep/trials.py
engine_seconds). Target (#26): the knee within 5% of the dense scan's in every cell, at <= 1/4 of its
engine-seconds (median); the interval should cover the scan's knee about 95% of the time. Each run is
recorded in results.jsonl.

    python benchmarks/capacity_vs_scan.py [--seeds 3] [--noise 0.02]   (about 2 min a seed here)
    python benchmarks/capacity_vs_scan.py --latest
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.results import print_latest_if_asked, record  # noqa: E402

# Poisson arrivals, 64-token prompts, 128 output tokens; at least 200 requests and 60 s a run
WORK = ["mode=capacity", "backend=fake", "workload=open_loop", "workload.num_requests=200", "capacity.run_s=60",
        "plots=false"]
CONFIGS = {"seqs=2": ["engine.max_num_seqs=2"], "seqs=8": ["engine.max_num_seqs=8"]}
SLOS = {"ttft200ms@90%": ["slo.p95_ttft_s=0.2", "slo.p95_tpot_s=0.05", "slo.attainment=0.9"],
        "ttft1s@95%": ["slo.p95_ttft_s=1.0", "slo.p95_tpot_s=0.05", "slo.attainment=0.95"]}


def search(tmp: Path, name: str, overrides: list[str]) -> dict:
    from rich.console import Console

    from tests.helpers import compose_cfg
    from throttle_sweep.commands import capacity as capacity_cmd
    from throttle_sweep.store.records import read_records
    from throttle_sweep.sweep.trials import engine_seconds

    capacity_cmd.run(compose_cfg(*WORK, f"run={name}", *overrides, tmp_path=tmp), Console(quiet=True))
    summary = json.loads((tmp / name / "summary.json").read_text())
    records = read_records(tmp / name / "replicates.jsonl")
    return {"capacity": summary.get("capacity_rps"), "ci": summary.get("capacity_ci", [None, None]),
            "bracket": summary["bracket"], "engine_s": engine_seconds(records), "runs": len(records),
            "void": sum(bool(r.get("void")) for r in records)}


def scan(tmp: Path, name: str, overrides: list[str], center: float, args: argparse.Namespace) -> dict:
    from tests.helpers import compose_cfg
    from throttle_sweep.capacity.knee import fit_knee
    from throttle_sweep.capacity.runs import measure_rate, met_of
    from throttle_sweep.cluster.slot import WarmSlot
    from throttle_sweep.commands.capacity import STAGE
    from throttle_sweep.settings.capacity import load_capacity
    from throttle_sweep.store.records import RecordLog
    from throttle_sweep.sweep.trials import engine_seconds

    r = load_capacity(compose_cfg(*WORK, f"run={name}", *overrides, tmp_path=tmp))
    r.out.mkdir(parents=True)
    n = math.ceil(math.log(args.span) / math.log(1 + args.step))
    rates = [center * (1 + args.step) ** i for i in range(-n, n + 1)]
    log = RecordLog(r.out / "replicates.jsonl", say=print)
    slot = WarmSlot(r.engine, r.settings.spec, r.price, run_id=name, **r.warm)
    points = []
    try:
        for rep in range(args.reps):
            for rate in rates if rep % 2 == 0 else rates[::-1]:
                rec = measure_rate(slot, r.flags, rate, {"stage": STAGE, "search_stage": "scan"}, log, r.settings,
                                   STAGE, print, replicate=rep)  # the rep-th schedule, as the search's knee
                assert rec["status"] == "ok", rec.get("reason")
                points.append((rate, *met_of(rec, r.settings)))
    finally:
        slot.close()
    knee = fit_knee(points, r.settings.slo.attainment)
    target = r.settings.slo.attainment
    return {"knee": knee.capacity_rps, "engine_s": engine_seconds(log.records), "runs": len(log.records),
            "void": sum(bool(x.get("void")) for x in log.records), "rates": len(rates),
            "contains": knee.levels[0].attainment >= target > knee.levels[-1].attainment}


def main() -> None:
    print_latest_if_asked(__file__)
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--noise", type=float, default=0.02, help="the fake's sd of log step time, per run")
    parser.add_argument("--drift", type=float, default=0.0, help="slow-down per run")
    parser.add_argument("--step", type=float, default=0.03, help="the scan's ratio between rates, less 1")
    parser.add_argument("--span", type=float, default=1.6, help="the scan spans the estimate / span .. x span")
    parser.add_argument("--reps", type=int, default=4, help="the scan's runs at each rate")
    parser.add_argument("--tol", type=float, default=0.05)
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            for (cname, conf), (sname, slo) in ((c, s) for c in CONFIGS.items() for s in SLOS.items()):
                over = [*conf, *slo, f"fake.noise_sd={args.noise}", f"fake.drift_per_start={args.drift}",
                        f"fake.seed={seed}", f"workload.seed={seed}"]
                tag = f"{seed}-{cname}-{sname}".replace("=", "").replace("@", "-").replace("%", "")
                s = search(Path(tmp), f"search-{tag}", over)
                center = s["capacity"] or math.sqrt(s["bracket"][0] * s["bracket"][1])
                d = scan(Path(tmp), f"scan-{tag}", over, center, args)
                low, high = s["ci"]
                rel = (s["capacity"] / d["knee"] - 1) if s["capacity"] and d["knee"] else math.inf
                covered = d["knee"] is not None and (low or 0) <= d["knee"] <= (high or math.inf)
                where = (math.log(s["capacity"] / low) / math.log(high / low)
                         if low and high and s["capacity"] and high > low else None)
                rows.append({"seed": seed, "config": cname, "slo": sname, "capacity": s["capacity"], "ci": [low, high],
                             "scan_knee": d["knee"], "rel": rel, "covered": covered, "where": where,
                             "ratio": s["engine_s"] / d["engine_s"], "search": s, "scan": d})
                fmt = lambda x: f"{x:.4g}" if x is not None else "-"  # noqa: E731
                print(f"seed {seed} {cname:6} {sname:13}: search {fmt(s['capacity'])} req/s [{fmt(low)}, "
                      f"{fmt(high)}] ({s['runs']} runs, {s['engine_s']:.0f} engine-s)   scan {fmt(d['knee'])} "
                      f"({d['rates']} rates x {args.reps}, {d['engine_s']:.0f} engine-s"
                      f"{'' if d['contains'] else ', KNEE OUTSIDE ITS RANGE'})   diff {rel:+.1%}   "
                      f"ratio {rows[-1]['ratio']:.3f}   {'covered' if covered else 'NOT covered'}", flush=True)

    rels = [abs(r["rel"]) for r in rows]
    ratios = [r["ratio"] for r in rows]
    coverage = sum(r["covered"] for r in rows) / len(rows)
    bounded = sum(None not in r["ci"] for r in rows) / len(rows)
    wheres = [r["where"] for r in rows if r["where"] is not None]
    widths = [r["ci"][1] / r["ci"][0] - 1 for r in rows if None not in r["ci"]]
    voids = sum(r["search"]["void"] + r["scan"]["void"] for r in rows)
    print(f"\n{len(rows)} cells ({args.seeds} seeds x {len(CONFIGS)} configurations x {len(SLOS)} SLOs), noise sd "
          f"{args.noise}, drift {args.drift}/run; scan: {args.step:.0%} steps over /{args.span:g}..x{args.span:g} "
          f"of the search's estimate, {args.reps} runs a rate; void runs: {voids}")
    print(f"|search - scan| / scan: median {statistics.median(rels):.1%}, max {max(rels):.1%}; within "
          f"{args.tol:.0%}: {sum(x <= args.tol for x in rels)}/{len(rels)}")
    print(f"engine-seconds search/scan: median {statistics.median(ratios):.3f}, max {max(ratios):.3f}")
    print(f"the search's 95% interval covers the scan's knee in {coverage:.0%} of cells; bounded both sides in "
          f"{bounded:.0%}, median width {statistics.median(widths) if widths else math.nan:.0%}; the estimate "
          f"sits at {statistics.median(wheres) if wheres else math.nan:.2f} of its interval (median, log scale, "
          "0 = lower bound)")
    se = max(math.sqrt(0.95 * 0.05 / len(rows)), 0.02)
    if abs(coverage - 0.95) > 2 * se:
        print(f"note: coverage {coverage:.0%} is far from 0.95 (more than 2 standard errors, {se:.2f} each, "
              f"over {len(rows)} cells)")
    ok = max(rels) <= args.tol and statistics.median(ratios) <= 0.25
    print(f"target (every knee within {args.tol:.0%} of the scan's, at <= 1/4 of its engine-seconds, median): "
          f"{'met' if ok else 'NOT met'}")
    record(__file__, vars(args), {
        "rel_diff_median": round(statistics.median(rels), 4), "rel_diff_max": round(max(rels), 4),
        "engine_seconds_ratio_median": round(statistics.median(ratios), 4),
        "engine_seconds_ratio_max": round(max(ratios), 4), "coverage": coverage, "bounded": bounded,
        "void_runs": voids, "cells": [{k: r[k] for k in ("seed", "config", "slo", "capacity", "ci", "scan_knee")}
                                      for r in rows]}, ok)


if __name__ == "__main__":
    main()
