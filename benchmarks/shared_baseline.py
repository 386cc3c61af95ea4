"""Confirmation with shared baseline runs against one comparison per candidate, on the real engine: the
demo's sweep (scripts/demo) with its top two always confirmed (`study.sequential=false`, so neither waits),
once with `study.shared_baseline=true` (one joint schedule: B C1 C2 C2 C1 B, C2 C1 B B C1 C2) and once with
false (B C C B C B B C for each), in interleaved rounds (shared, separate, then separate, shared). Prints,
for the confirmation stage alone: engine-seconds (every run's engine start, warm-up and measured wall time),
runs, wall time from its first run to its last, the width of each confirmed interval (upper / lower bound)
and the winner; then the shared/separate ratios.

    .venv/bin/python benchmarks/shared_baseline.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import optuna

ROOT = Path(__file__).resolve().parents[1]


def run(shared: bool) -> dict:
    with tempfile.TemporaryDirectory() as out:
        args = [sys.executable, "-m", "throttle_sweep", "+experiment=demo", "study.sequential=false",
                f"study.shared_baseline={str(shared).lower()}", f"results_dir={out}", "plots=false"]
        proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"sweep failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        records = [json.loads(line) for line in (Path(out) / "demo" / "replicates.jsonl").open()]
        study = optuna.load_study(study_name="demo", storage=f"sqlite:///{Path(out) / 'demo' / 'study.db'}")
        winner = study.user_attrs.get("winner") or {}
    confirm = [r for r in records if r["stage"] == "confirm"]
    spans = [(dt.datetime.fromisoformat(r["started_at"]), dt.datetime.fromisoformat(r["ended_at"])) for r in confirm]
    widths = [line.split("[", 1)[1].split("]", 1)[0] for line in proc.stdout.splitlines()
              if line.startswith("confirm trial") and "[" in line]
    widths = [float(hi) / float(lo) for lo, hi in (w.split(", ") for w in widths)]
    return {"engine_s": sum((r.get("wall_s") or 0) + (r.get("engine_start_s") or 0) + (r.get("engine_warmup_s") or 0)
                            for r in confirm),
            "runs": len(confirm), "baseline_runs": sum(r["arm"] == "baseline" for r in confirm),
            "wall_s": (max(b for _, b in spans) - min(a for a, _ in spans)).total_seconds() if spans else 0.0,
            "widths": widths, "winner": winner.get("params"), "confirmed": len(widths)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    rounds = parser.parse_args().rounds
    results: dict[bool, list[dict]] = {True: [], False: []}
    for i in range(rounds):
        for shared in (True, False) if i % 2 == 0 else (False, True):
            r = run(shared)
            results[shared].append(r)
            print(f"round {i + 1} {'shared' if shared else 'separate'}: confirmation {r['engine_s']:.0f} engine-s, "
                  f"{r['runs']} runs ({r['baseline_runs']} of the baseline), {r['wall_s']:.0f} s wall; "
                  f"{r['confirmed']} confirmed, interval widths (hi/lo) "
                  f"{', '.join(f'{w:.3f}' for w in r['widths'])}; winner {r['winner']}", flush=True)

    def mean(shared: bool, key: str) -> float:
        return sum(r[key] for r in results[shared]) / len(results[shared])

    def width(shared: bool) -> float:
        widths = [w for r in results[shared] for w in r["widths"]]
        return sum(widths) / len(widths) if widths else float("nan")

    print(f"confirmation shared/separate: engine-seconds {mean(True, 'engine_s') / mean(False, 'engine_s'):.2f}, "
          f"runs {mean(True, 'runs') / mean(False, 'runs'):.2f}, wall {mean(True, 'wall_s') / mean(False, 'wall_s'):.2f}; "
          f"mean interval width (hi/lo) {width(True):.3f} shared, {width(False):.3f} separate")


if __name__ == "__main__":
    main()
