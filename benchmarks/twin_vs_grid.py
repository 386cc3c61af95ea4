"""Against vLLM's own way (#45): the main command's sweep on the H100 twin (Qwen2.5-0.5B, `engine=gpu
+space=batching`) against the same space as a grid run the way `vllm bench sweep serve` runs one, on the same twin.

`vllm bench sweep serve` (vllm/benchmarks/sweep/serve.py) starts one `vllm serve` per entry of --serve-params,
runs `vllm bench serve` --num-runs times on it (default 3; --warmup-num-prompts default 0, no warm-up) and
writes every run; the user reads off the best. The batching space's max_num_seqs is a log-int knob of 2048
values, which no one lists in a JSON file: the grid here is what a vLLM user writes, the powers of two of
max_num_seqs (1 to 2048, 12 values) x the space's six max_num_batched_tokens choices, 72 points, less those vLLM's
own validation refuses (a refused `vllm serve` dies before loading weights; counted as no GPU time). Each point
costs one engine start (the twin's StartCosts; torch.compile from its cache after the first) plus three runs
of the sweep's own fixed work (its replicates' requests, lengths and concurrency: `vllm bench serve
--max-concurrency C --num-prompts N`).

Every point runs once on the twin with its noise off (twin.noise_sd=0): its true cost, and the length of each of
the three identical runs a noiseless GPU would give (with the twin's default 1% noise the three would differ
by about 1%, their sum far less). The grid's answer is taken as its truly cheapest point, which flatters the
grid (a real grid picks from noisy means); the sweep's answer is its exported winner, or vLLM's defaults where
it found none cheaper, also run noise-free. Target (#45): at most 0.25 of the grid's GPU-minutes, for a winner
within 1% of the grid's. Costs are the sweep's own measure ($ per million output tokens, steady state).

    python benchmarks/twin_vs_grid.py [--sweep DIR] [--checkout DIR]    (DIR: a run folder, e.g. from
                                                                         twin_time_to_answer.py --keep)
    python benchmarks/twin_vs_grid.py --latest
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.results import print_latest_if_asked, record  # noqa: E402
from benchmarks.twin_time_to_answer import head, run_sweep  # noqa: E402

SEQS = [2 ** i for i in range(12)]  # 1 .. 2048
TOKENS = [1024, 2048, 4096, 8192, 16384, 32768]  # conf/space/batching.yaml's choices
RUNS = 3  # vllm bench sweep serve --num-runs, its default
WITHIN, SHARE = 0.01, 0.25  # #45's targets


def sweep_answer(folder: Path) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """(the flags the sweep's answer serves, its baseline's flags, its records). With no winner, the answer
    is vLLM's defaults as the baseline ran them (its served defaults included)."""
    import optuna

    records = [json.loads(line) for line in (folder / "replicates.jsonl").read_text().splitlines()]
    base = next(r for r in records if r.get("arm") == "baseline" and r.get("status") == "ok")
    baseline = {k: base["engine_flags"][k] for k in ("max_num_seqs", "max_num_batched_tokens")}
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=folder.name, storage=f"sqlite:///{folder / 'study.db'}")
    winner = (study.user_attrs.get("winner") or {}).get("params")
    return (dict(winner) if winner else baseline), baseline, records


class Twin:
    """Runs of one fixed work on the sweep's twin with its noise off, each on an engine of its own (one `vllm serve` per
    grid point), in one process: torch.compile comes from its cache after the first start, as on disk."""

    def __init__(self, records: list[dict[str, Any]], twin: dict[str, Any]) -> None:
        from throttle_sweep.engines.twin import TwinConf, TwinEngine
        from throttle_sweep.measurement.cost import Price
        from throttle_sweep.measurement.workload import WorkloadSpec

        done = next(r for r in records if r.get("stage") == "search" and r.get("status") == "ok")
        work = {**done["workload"], "num_requests": done["requests_completed"], "replicate_s": None}
        self.spec = WorkloadSpec(**work)
        self.price = Price(usd_per_gpu_hour=done["usd_per_gpu_hour"], gpus=done.get("gpus") or 1)
        self.flags = {k: v for k, v in done["flags"].items() if k not in ("max_num_seqs", "max_num_batched_tokens")}
        # the sweep's own twin (its GPU and host calibration), with the noise off
        same = {k: twin[k] for k in ("gpu", "host", "host_step_s", "host_per_seq_s") if twin.get(k) is not None}
        self.engine = TwinEngine(TwinConf(**{**same, "noise_sd": 0.0}))

    def run(self, seqs: int, tokens: int) -> dict[str, Any] | None:
        """{usd_per_mtok, start_s, run_s, preemptions}, or None where vLLM refuses the flags."""
        from throttle_sweep.measurement.replicate import measure_replicate

        flags = {**self.flags, "max_num_seqs": seqs, "max_num_batched_tokens": tokens}
        if self.engine.refusal(flags):
            return None
        r = measure_replicate(self.engine, flags, self.spec, self.price, run_id="grid", arm="grid", position=0)
        if r["status"] != "ok":
            raise SystemExit(f"{flags}: {r['status']} ({r.get('reason')})")
        return {"usd_per_mtok": r["usd_per_mtok"], "start_s": r["engine_start_s"], "run_s": r["wall_s"],
                "preemptions": r["preemptions"]}


def main() -> None:
    print_latest_if_asked(__file__)
    parser = argparse.ArgumentParser()
    parser.add_argument("--sweep", type=Path, default=None, help="a finished run folder of the main command")
    parser.add_argument("--checkout", type=Path, default=ROOT, help="the checkout whose package runs both")
    args = parser.parse_args()
    checkout = args.checkout.resolve()
    sys.path.insert(0, str(checkout))  # its twin and its measure code, not this worktree's
    began = time.monotonic()
    folder = args.sweep
    if folder is None:
        folder, _, _ = run_sweep(checkout, Path(tempfile.mkdtemp(prefix="twin-vs-grid-")), [])
    sweep_s = time.monotonic() - began
    answer, baseline, records = sweep_answer(folder)
    from throttle_sweep.sweep.gpu_time import gpu_time

    sweep_min = gpu_time(records).total_s / 60
    import yaml

    twin = Twin(records, (yaml.safe_load((folder / "config.yaml").read_text()) or {}).get("twin") or {})
    began = time.monotonic()
    grid: dict[tuple[int, int], dict[str, Any]] = {}
    for seqs, tokens in itertools.product(SEQS, TOKENS):
        if (point := twin.run(seqs, tokens)) is not None:
            grid[seqs, tokens] = point
    grid_min = sum(p["start_s"] + RUNS * p["run_s"] for p in grid.values()) / 60
    clean = {k: p for k, p in grid.items() if p["preemptions"] == 0}
    best = min(clean, key=lambda k: clean[k]["usd_per_mtok"])
    key = (answer["max_num_seqs"], answer["max_num_batched_tokens"])
    mine = grid.get(key) or twin.run(*key)
    grid_s = time.monotonic() - began
    off = mine["usd_per_mtok"] / clean[best]["usd_per_mtok"] - 1
    share = sweep_min / grid_min
    print(f"grid as `vllm bench sweep serve` runs it: {len(grid)} points (max_num_seqs 1..2048 in powers of two x "
          f"{len(TOKENS)} token budgets, {len(SEQS) * len(TOKENS) - len(grid)} refused by vLLM), a server start and "
          f"{RUNS} runs each of {twin.spec.num_requests} requests of {twin.spec.prompt_len}+{twin.spec.output_len} "
          f"tokens, {twin.spec.concurrency} in flight")
    print(f"  grid's best (noise-free): max_num_seqs={best[0]} max_num_batched_tokens={best[1]} "
          f"${clean[best]['usd_per_mtok']:.4f}/M; {len(grid) - len(clean)} points preempt")
    print(f"  sweep's answer ({'its winner' if answer != baseline else 'no winner: vLLM defaults'}): "
          f"max_num_seqs={key[0]} max_num_batched_tokens={key[1]} ${mine['usd_per_mtok']:.4f}/M (noise-free), "
          f"{off:+.2%} against the grid's best")
    print(f"GPU-minutes (twin, predicted): sweep {sweep_min:.1f}, grid {grid_min:.1f}; sweep/grid {share:.3f} "
          f"(target <= {SHARE}: {'PASS' if share <= SHARE else 'FAIL'})")
    print(f"winner within {WITHIN:.0%} of the grid's best: {off:+.2%} ({'PASS' if off <= WITHIN else 'FAIL'})")
    print(f"CPU wall time here: sweep {sweep_s:.0f} s{' (reused)' if args.sweep else ''}, grid {grid_s:.0f} s")
    record(__file__, {"sweep": str(args.sweep) if args.sweep else None, "checkout": str(checkout),
                      "checkout_commit": head(checkout)},
           {"sweep_gpu_min": round(sweep_min, 1), "grid_gpu_min": round(grid_min, 1), "share": round(share, 3),
            "grid_points": len(grid), "grid_best": list(best), "grid_best_usd": round(clean[best]["usd_per_mtok"], 5),
            "answer": list(key), "answer_usd": round(mine["usd_per_mtok"], 5), "off": round(off, 4),
            "grid": {f"{s}x{t}": {k: round(v, 4) for k, v in p.items()} for (s, t), p in grid.items()},
            "grid_cpu_s": round(grid_s)}, share <= SHARE and off <= WITHIN)


if __name__ == "__main__":
    main()
