"""Harness overhead: output tokens/s through throttle_sweep's driver vs a bare `LLM.generate` of the same
requests, on one engine, interleaved (bare, tool, bare, tool, ...) so drift lands on both. Target >= 0.97.

    python benchmarks/harness_overhead.py [--rounds 6] [--max-num-seqs 8]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

from throttle_sweep.engines import VllmInprocEngine
from throttle_sweep.measurement.workload import WorkloadSpec, drive, make_requests


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=128)
    args = parser.parse_args()
    k = args.max_num_seqs
    spec = WorkloadSpec(num_requests=args.requests, prompt_len=64, output_len=args.output_len, concurrency=k)
    # prefix caching off, and fresh prompts for every run: a prompt seen before would be served from the
    # prefix cache (75% of the prompt tokens from the second pass on), flattering whichever side ran later
    session = VllmInprocEngine().start({"max_num_seqs": k, "max_model_len": 1024, "enable_prefix_caching": False,
                                        "kv_cache_memory_bytes": 64 << 20, "enforce_eager": True, "seed": 0})
    from vllm import SamplingParams

    fresh = iter(range(1, 10_000))

    def bare() -> float:
        requests = make_requests(dataclasses.replace(spec, seed=next(fresh)))
        prompts = [{"prompt_token_ids": list(r.prompt_token_ids)} for r in requests]
        params = [SamplingParams(max_tokens=r.output_len, min_tokens=r.output_len, ignore_eos=True,
                                 detokenize=False) for r in requests]
        began = time.perf_counter()
        outs = session.llm.generate(prompts, params, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - began)

    def tool() -> float:
        requests = make_requests(dataclasses.replace(spec, seed=next(fresh)))
        result = drive(session, requests, loop="closed", concurrency=k)
        return sum(t.output_tokens for t in result.timings) / result.wall_s

    bare(), tool()  # warm-up, not counted
    ratios, rows = [], []
    for i in range(args.rounds):
        order = (bare, tool) if i % 2 == 0 else (tool, bare)  # ABBA-style: alternate who goes first
        got = {fn.__name__: fn() for fn in order}
        ratios.append(got["tool"] / got["bare"])
        rows.append(f"round {i}: bare {got['bare']:8.1f} tok/s   tool {got['tool']:8.1f} tok/s   "
                    f"ratio {ratios[-1]:.3f}")
    session.close()
    print("\n".join(rows))
    print(f"harness overhead (K = max_num_seqs = {k}): tool/bare output tokens/s, median of {args.rounds} "
          f"interleaved rounds = {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}); "
          f"target >= 0.97")


if __name__ == "__main__":
    main()
