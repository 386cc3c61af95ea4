"""Time to a trustworthy answer on the real engine: the boundary-first, sequential sweep (scripts/demo: every
max_num_seqs 2..16, probes first) against the earlier grid (max_num_seqs 2..14 step 2, fixed 2+2 screening
and 4+4 confirmations, no probes, one slot), in interleaved rounds (old new, then new old); the new sweep runs on
the slots its defaults give (on a 2-core CPU machine: two). Prints engine-seconds (the
sum of every run's engine start and measured wall time), wall time, runs, the boundary each names and the
winner, then the new/old ratios; the new sweep's boundary is checked against bare vLLM (LLM.generate).

    .venv/bin/python benchmarks/time_to_answer.py [--rounds 1]     (#27's target: <= 0.5 of the engine-seconds)
    .venv/bin/python benchmarks/time_to_answer.py --latest        its newest row in results.jsonl
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

import optuna

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.results import print_latest_if_asked, record  # noqa: E402

NEW = ["+experiment=demo"]
OLD = ["+experiment=demo", "slots=1", "+space.max_num_seqs.step=2", "space.max_num_seqs.high=14", "study.n_trials=7",
       "compare.replicates=2", "study.boundary=none", "study.sequential=false", "study.same_schedule=false",
       "study.shared_baseline=false", "study.tiebreak_replicates=0"]


def run(kind: str, out: Path) -> dict:
    name = f"{kind}"
    args = [sys.executable, "-m", "throttle_sweep", *(NEW if kind == "new" else OLD), f"study.name={name}",
            f"results_dir={out}", "plots=false"]
    began = time.monotonic()
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - began
    if proc.returncode != 0:
        raise SystemExit(f"{kind} sweep failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    log = Path(tempfile.gettempdir()) / f"time_to_answer-{kind}.log"
    log.write_text(proc.stdout)  # the sweep's own output, kept (the new arm is scripts/demo's sweep)
    records = [json.loads(line) for line in (out / name / "replicates.jsonl").read_text().splitlines()]
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{out / name / 'study.db'}")
    boundary = next((line for line in proc.stdout.splitlines()
                     if line.startswith(("preemption boundary", "preemption starts"))), "-")
    return {"engine_s": sum((r.get("wall_s") or 0) + (r.get("engine_start_s") or 0) for r in records),
            "wall_s": wall, "runs": len(records), "boundary": boundary.strip(),
            "found": (study.user_attrs.get("boundaries") or [None])[0],
            "winner": (study.user_attrs.get("winner") or {}).get("params")}


def main() -> None:
    print_latest_if_asked(__file__)
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=1)
    rounds = parser.parse_args().rounds
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    results: dict[str, list[dict]] = {"old": [], "new": []}
    for i in range(rounds):
        for kind in ("old", "new") if i % 2 == 0 else ("new", "old"):
            out = Path(tempfile.mkdtemp(prefix=f"tta-{kind}-"))
            try:
                results[kind].append(run(kind, out))
            finally:
                shutil.rmtree(out, ignore_errors=True)
            r = results[kind][-1]
            print(f"round {i + 1} {kind}: {r['engine_s']:.0f} engine-s, {r['wall_s']:.0f} s wall, {r['runs']} runs; "
                  f"winner {r['winner']}; {r['boundary']}", flush=True)
    mean = {k: {m: sum(r[m] for r in v) / len(v) for m in ("engine_s", "wall_s", "runs")} for k, v in results.items()}
    ratios = {m: round(mean["new"][m] / mean["old"][m], 3) for m in ("engine_s", "wall_s", "runs")}
    print(f"engine-seconds new/old: {ratios['engine_s']:.2f}   wall time new/old: {ratios['wall_s']:.2f}   "
          f"runs new/old: {ratios['runs']:.2f}   (target: engine-seconds <= 0.5)")
    from tests.integration.test_vllm_sweep import bare_preemptions
    from throttle_sweep.engines.vllm_inproc import prepare_environment

    prepare_environment()  # vLLM's CPU settings and quiet logs, as the tool runs it

    found = results["new"][-1]["found"]
    work = {"requests": 16, "prompt_len": 32, "output_len": 128}
    clean, dirty = found["last_clean"], found["first_preempting"]
    bare = (bare_preemptions(clean, **work), bare_preemptions(dirty, **work))
    print(f"bare vLLM at the reported boundary: max_num_seqs={clean}: {bare[0]} preemptions, max_num_seqs={dirty}: "
          f"{bare[1]} -> {'agrees' if bare[0] == 0 < bare[1] else 'DISAGREES'}; winners "
          f"{[r['winner'] for r in results['new']]} (within one step of {clean}: "
          f"{all(r['winner'] and abs(r['winner']['max_num_seqs'] - clean) <= 1 for r in results['new'])})")
    near = all(r["winner"] and abs(r["winner"]["max_num_seqs"] - clean) <= 1 for r in results["new"])
    record(__file__, {"rounds": rounds}, {
        "new_over_old": ratios, "mean": mean, "boundary": [clean, dirty], "bare_vllm_preemptions": list(bare),
        "winners": [r["winner"] for r in results["new"]], "old_winners": [r["winner"] for r in results["old"]]},
        ratios["engine_s"] <= 0.5 and bare[0] == 0 < bare[1] and near)


if __name__ == "__main__":
    main()
