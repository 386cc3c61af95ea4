"""Time to answer on the GPU twin (#45): the main command, `engine=gpu +space=batching` with Qwen2.5-0.5B on an
H100 twin, run as a user runs it (a subprocess, its own results folder). From its records (sweep/gpu_time.py:
each engine's start and warm-up once, every run's simulated seconds) it prints the simulated GPU-minutes before
the plan (calibration and probes) and in all (until the exported winner, or the verdict that none beat vLLM's
defaults), against #45's targets: the plan within 5 GPU-minutes, the answer within 30. The twin predicts; these
are not measured GPU-minutes. The CPU wall time the simulation took here is printed beside them.

    python benchmarks/twin_time_to_answer.py [--checkout DIR] [--keep DIR] [-- key=value ...]
    python benchmarks/twin_time_to_answer.py --latest

--checkout runs another checkout's package (e.g. main after a fix) with this script; --keep leaves the sweep's
folder there (benchmarks/twin_vs_grid.py --sweep can then reuse it). Overrides after `--` go to the command.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.results import print_latest_if_asked, record  # noqa: E402

COMMAND = ["engine=gpu", "+space=batching", "backend=twin", "twin.gpu=H100"]
PLAN_MIN, ANSWER_MIN = 5.0, 30.0  # #45's targets, simulated GPU-minutes


def run_sweep(checkout: Path, results: Path, extra: list[str], name: str = "twin-tta") -> tuple[Path, float, str]:
    """Run the main command from `checkout`; (its run folder, CPU wall seconds, its stdout)."""
    args = [sys.executable, "-m", "throttle_sweep", *COMMAND, *extra, f"study.name={name}",
            f"results_dir={results}", "plots=false"]
    began = time.monotonic()
    proc = subprocess.run(args, cwd=checkout, capture_output=True, text=True)
    wall = time.monotonic() - began
    if proc.returncode != 0:
        raise SystemExit(f"the sweep failed ({' '.join(args[2:])}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return results / name, wall, proc.stdout


def gpu_minutes(folder: Path, checkout: Path) -> dict[str, float]:
    """GPU-minutes before the plan and in all, computed by the checkout's own gpu_time.py from the records."""
    code = ("import json,sys; from throttle_sweep.sweep.gpu_time import gpu_time; "
            "t = gpu_time(json.loads(l) for l in open(sys.argv[1])); print(json.dumps([t.before_plan_s, t.total_s]))")
    out = subprocess.run([sys.executable, "-c", code, str(folder / "replicates.jsonl")], cwd=checkout,
                         capture_output=True, text=True, check=True).stdout
    before, total = json.loads(out)
    return {"before_plan_min": before / 60, "total_min": total / 60}


def answer_line(stdout: str) -> str:
    """The sweep's own sentence on its winner (or on why there is none)."""
    keys = ("winner (", "no candidate was confirmed", "exported:", "no winner to export")
    return next((line.strip() for line in stdout.splitlines() if line.lower().startswith(keys)), "-")


def head(checkout: Path) -> str:
    """The checkout's commit, as results.py names this one's: the code that ran is the checkout's."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=checkout, capture_output=True, text=True).stdout.strip()
    return (git("rev-parse", "--short", "HEAD") or "unknown") + \
        ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def main() -> None:
    print_latest_if_asked(__file__)
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkout", type=Path, default=ROOT, help="the checkout whose package runs the sweep")
    parser.add_argument("--keep", type=Path, default=None, help="keep the results folder here")
    parser.add_argument("overrides", nargs="*", help="more key=value overrides for the command (after --)")
    args = parser.parse_args()
    results = args.keep or Path(tempfile.mkdtemp(prefix="twin-tta-"))
    try:
        folder, wall, stdout = run_sweep(args.checkout.resolve(), results, args.overrides)
        minutes = gpu_minutes(folder, args.checkout.resolve())
        runs = sum(1 for _ in (folder / "replicates.jsonl").open())
    finally:
        if args.keep is None:
            shutil.rmtree(results, ignore_errors=True)
    printed = next((line.strip() for line in stdout.splitlines() if line.startswith("GPU time on the twin")), "-")
    plan_ok, answer_ok = minutes["before_plan_min"] <= PLAN_MIN, minutes["total_min"] <= ANSWER_MIN
    print(f"python -m throttle_sweep {' '.join(COMMAND + args.overrides)}: {runs} runs, {wall:.0f} s of CPU wall "
          "time here to simulate")
    print(f"  the sweep's own line: {printed}")
    print(f"  answer: {answer_line(stdout)}")
    print(f"GPU-minutes before the plan: {minutes['before_plan_min']:.1f} (target <= {PLAN_MIN:g}: "
          f"{'PASS' if plan_ok else 'FAIL'}, {minutes['before_plan_min'] / PLAN_MIN:.1f}x the target)")
    print(f"GPU-minutes in all:          {minutes['total_min']:.1f} (target <= {ANSWER_MIN:g}: "
          f"{'PASS' if answer_ok else 'FAIL'}, {minutes['total_min'] / ANSWER_MIN:.1f}x the target)")
    record(__file__, {"checkout": str(args.checkout), "checkout_commit": head(args.checkout), "overrides": args.overrides},
           {**{k: round(v, 1) for k, v in minutes.items()}, "runs": runs, "cpu_wall_s": round(wall),
            "answer": answer_line(stdout)}, plan_ok and answer_ok)


if __name__ == "__main__":
    main()
