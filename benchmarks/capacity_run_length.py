"""Does mode=capacity's answer depend on how long its runs are (#46 item 1)? On the fake engine (max_num_seqs=8,
TTFT <= 200 ms and TPOT <= 50 ms for 90% of requests, no per-run speed noise, so that a run's schedule is all
that differs), the capacity search runs at capacity.run_s 30, 120 and 480, each twice in this one run: with
each run's warm-up chosen from its own requests and the trend test (the code as it is), and with the rule it
replaced (the first 20% of each run's schedule dropped, no trend test), patched in here.
The truth is the fake's long-run capacity: one run of --truth-s seconds at each of a grid of rates, all its
requests counted, the shares made non-increasing and interpolated in log rate where they cross 90%; computed
once and kept in capacity_run_length_truth.json, keyed by its settings. Target (#46): every capacity within
2% of the truth and of each other. One search a run length and rule (a seed): its own noise is part of what
is measured (the 95% intervals are printed beside).

    python benchmarks/capacity_run_length.py [--seed 0] [--truth-s 3000] [--lengths 30 120 480]
    python benchmarks/capacity_run_length.py --latest
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.results import print_latest_if_asked, record  # noqa: E402

TRUTH = Path(__file__).resolve().with_name("capacity_run_length_truth.json")
WORK = ["mode=capacity", "backend=fake", "workload=open_loop", "workload.num_requests=200", "plots=false",
        "engine.max_num_seqs=8", "slo.p95_ttft_s=0.2", "slo.p95_tpot_s=0.05", "slo.attainment=0.9",
        "fake.noise_sd=0"]
RATES = [5.4, 5.6, 5.8, 6.0, 6.2]
LENGTHS = [30, 120, 480]


def old_met_of(record, settings):
    """The rule before #46 item 1: the first 20% of the run's schedule not counted."""
    rows = record.get("requests_s") or []
    last = max(row[0] for row in rows)
    counted = [row for row in rows if row[0] >= 0.2 * last]
    return sum(settings.slo.met(row[1], row[2]) for row in counted), len(counted)


def truth(tmp: Path, truth_s: float) -> dict:
    """The long-run attainment at each rate and where it crosses 90% (cached by its settings)."""
    from tests.helpers import compose_cfg
    from throttle_sweep.capacity.knee import fit_knee
    from throttle_sweep.capacity.runs import measure_rate
    from throttle_sweep.cluster.slot import WarmSlot
    from throttle_sweep.settings.capacity import load_capacity
    from throttle_sweep.store.records import RecordLog

    key = json.dumps({"work": WORK, "rates": RATES, "truth_s": truth_s})
    cached = json.loads(TRUTH.read_text()) if TRUTH.exists() else {}
    if key in cached:
        return cached[key]
    r = load_capacity(compose_cfg(*WORK, f"capacity.run_s={truth_s}", "run=truth", tmp_path=tmp))
    r.out.mkdir(parents=True)
    log = RecordLog(r.out / "replicates.jsonl", say=print)
    slot = WarmSlot(r.engine, r.settings.spec, r.price, run_id="truth", **r.warm)
    points = []
    try:
        with mock.patch("throttle_sweep.capacity.runs.undecided", lambda *a: None):  # one run, whatever it shows
            for rate in RATES:
                rec = measure_rate(slot, r.flags, rate, {"stage": "capacity", "search_stage": "truth"}, log,
                                   r.settings, "capacity", print)
                met = sum(r.settings.slo.met(row[1], row[2]) for row in rec["requests_s"])
                points.append((rate, met, len(rec["requests_s"])))
                print(f"truth: {rate:g} req/s over {truth_s:g} s: {met / len(rec['requests_s']):.4f}", flush=True)
    finally:
        slot.close()
    knee = fit_knee(points, 0.9)
    found = {"capacity": knee.capacity_rps, "points": points}
    cached[key] = found
    TRUTH.write_text(json.dumps(cached, indent=1) + "\n")
    return found


def search(tmp: Path, name: str, run_s: int, seed: int, before: bool) -> dict:
    from rich.console import Console

    from tests.helpers import compose_cfg
    from throttle_sweep.commands import capacity as capacity_cmd

    patches = [mock.patch("throttle_sweep.capacity.runs.met_of", old_met_of),
               mock.patch("throttle_sweep.commands.capacity.met_of", old_met_of),
               mock.patch("throttle_sweep.capacity.runs.undecided", lambda *a: None)] if before else []
    for p in patches:
        p.start()
    try:
        start = time.process_time()
        capacity_cmd.run(compose_cfg(*WORK, f"capacity.run_s={run_s}", f"workload.seed={seed * 1000}",
                                     f"fake.seed={seed}", f"run={name}", tmp_path=tmp), Console(quiet=True))
    finally:
        for p in patches:
            p.stop()
    s = json.loads((tmp / name / "summary.json").read_text())
    return {"capacity": s.get("capacity_rps"), "ci": s.get("capacity_ci"), "warmup_s": s.get("warmup_s"),
            "trend_runs": s.get("trend_runs"), "lengthened_runs": s.get("lengthened_runs"),
            "driver_cpu_s": round(time.process_time() - start, 1)}


def main() -> None:
    print_latest_if_asked(__file__)
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--truth-s", type=float, default=3000.0)
    parser.add_argument("--tol", type=float, default=0.02)
    parser.add_argument("--lengths", type=int, nargs="+", default=LENGTHS, help="capacity.run_s of the searches")
    args = parser.parse_args()
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        true = truth(Path(tmp), args.truth_s)["capacity"]
        print(f"truth: {true:.4g} req/s (runs of {args.truth_s:g} s at {RATES} req/s, all requests counted)")
        for rule in ("before", "after"):
            for run_s in args.lengths:
                s = search(Path(tmp), f"{rule}-{run_s}", run_s, args.seed, rule == "before")
                rows[f"{rule} {run_s}"] = s
                cap, (low, high) = s["capacity"], s["ci"] or (None, None)
                fmt = lambda x: f"{x:.4g}" if x is not None else "-"  # noqa: E731
                warm = s["warmup_s"]
                print(f"{rule:6} runs of {run_s:3d} s: capacity {fmt(cap)} req/s [{fmt(low)}, {fmt(high)}]  "
                      f"{(cap / true - 1) if cap else math.nan:+.1%} from the truth"
                      + (f"  warm-up {warm[0]:.1f}-{warm[1]:.1f} s, trend in {s['trend_runs']} knee runs, "
                         f"{s['lengthened_runs']} lengthened" if rule == "after" and warm else ""), flush=True)
    ok = {}
    for rule in ("before", "after"):
        caps = [rows[f"{rule} {n}"]["capacity"] for n in args.lengths]
        off = max(abs(c / true - 1) for c in caps)
        spread = max(caps) / min(caps) - 1
        ok[rule] = off <= args.tol and spread <= args.tol
        print(f"{rule}: largest distance from the truth {off:.1%}, spread between run lengths {spread:.1%}: "
              f"target ({args.tol:.0%}) {'met' if ok[rule] else 'NOT met'}")
    record(__file__, vars(args), {"truth": true, "rows": rows}, ok["after"])


if __name__ == "__main__":
    main()
