"""What vLLM's OpenAI API server adds to the cost per token, on the real engine (vLLM CPU, the embedded tiny
model): the same configuration and fixed work measured in-process (`backend=vllm`) and through the server
(`backend=server`: HTTP, streaming, request handling, the multiprocess engine core), interleaved in
balanced B C C B blocks on two warm engines, analysed like any comparison (drift-aware ratio, 95% interval).

    python benchmarks/server_overhead.py [--replicates 6] [--max-num-seqs 8] [--output-len 64]

Ratio = server / in-process cost per output token (steady state); above 1 means the server costs more.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from throttle_sweep.cluster.slot import WarmSlot
from throttle_sweep.engines import VllmInprocEngine
from throttle_sweep.engines.vllm_server import VllmServerEngine
from throttle_sweep.measurement.cost import Price
from throttle_sweep.measurement.workload import WorkloadSpec
from throttle_sweep.stats.analysis import analyse
from throttle_sweep.stats.schedule import BASELINE, CANDIDATE, make_schedule
from throttle_sweep.stats.verdict import Thresholds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--replicates", type=int, default=6, help="per arm (a multiple of 2: B C C B blocks)")
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=64)
    args = parser.parse_args()
    spec = WorkloadSpec(num_requests=args.requests, prompt_len=32, output_len=args.output_len,
                        concurrency=args.max_num_seqs)
    flags = {"max_num_seqs": args.max_num_seqs, "max_model_len": 256, "kv_cache_memory_bytes": 8 << 20,
             "enforce_eager": True, "seed": 0}
    price = Price()
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as logs:
        slots = {BASELINE: WarmSlot(VllmInprocEngine(), spec, price, run_id="bench", restart="never", engines=1),
                 CANDIDATE: WarmSlot(VllmServerEngine(log_dir=logs), spec, price, run_id="bench", restart="never",
                                     engines=1)}
        try:
            order = make_schedule("abba", args.replicates, seed=0, lead=BASELINE)
            records = []
            for i, arm in enumerate(order):
                record = slots[arm].measure(flags, arm, i, {"served_by": "in-process" if arm == BASELINE else "server"})
                assert record["status"] == "ok", record.get("reason")
                records.append(record)
                ttft = record["latency_s"]["ttft"]["p95"]
                print(f"  {i + 1:2d} {record['served_by']:10s} {record['steady']['usd_per_mtok']:.4f} $/M  "
                      f"{record['output_tokens_per_s']:.0f} tok/s  p95 TTFT {ttft * 1e3:.0f} ms", flush=True)
        finally:
            for slot in slots.values():
                slot.close()
    result = analyse(records, Thresholds(), cost="steady")
    est = result.estimate
    print(f"server / in-process cost per token (max_num_seqs={args.max_num_seqs}, {args.requests} requests x "
          f"{args.output_len} tokens, {args.replicates} replicates each, warm engines): ratio {est.ratio:.3f} "
          f"[{est.ci_low:.3f}, {est.ci_high:.3f}]  {result.verdict} (for the server)")
    print(f"took {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
