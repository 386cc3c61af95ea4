"""How many streamed tokens per second the HTTP client absorbs (backend=server / backend=endpoint), against
vLLM's own benchmark client (`vllm.benchmarks.lib.endpoint_request_func`, aiohttp), both driving the same
minimal streaming server that answers at once (tests/stub_openai.py: no model, one token per chunk), in
alternating rounds in one run. The client runs pinned to one core and the server to the other, so the
client's own cost per token is what is measured, as far as a Python stub server can feed it.

    python benchmarks/client_overhead.py [--requests 64] [--concurrency 16] [--output-len 256] [--rounds 3]

Ratio = ours / vLLM's tokens per second; at or above 1.0 our client is not the slower one.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def ours(url: str, args: argparse.Namespace) -> float:
    from throttle_sweep.engines.base import Request
    from throttle_sweep.engines.openai_http import HttpSession
    from throttle_sweep.measurement.workload import drive

    session = HttpSession(url, "stub-model")
    try:
        requests = [Request(f"r{i}", args.output_len, prompt_token_ids=tuple(range(1, 33))) for i in range(args.requests)]
        began = time.perf_counter()
        result = drive(session, requests, loop="closed", concurrency=args.concurrency)
        took = time.perf_counter() - began
    finally:
        session.close()
    assert all(t.output_tokens == args.output_len for t in result.timings)
    return args.requests * args.output_len / took


def theirs(url: str, args: argparse.Namespace) -> float:
    import aiohttp
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncInput, async_request_openai_completions

    async def run() -> float:
        limit = asyncio.Semaphore(args.concurrency)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600),
                                         connector=aiohttp.TCPConnector(limit=0)) as session:
            async def one(i: int):
                async with limit:
                    return await async_request_openai_completions(RequestFuncInput(
                        prompt=list(range(1, 33)), api_url=f"{url}/v1/completions", prompt_len=32,
                        output_len=args.output_len, model="stub-model", ignore_eos=True), session)
            began = time.perf_counter()
            outs = await asyncio.gather(*(one(i) for i in range(args.requests)))
            took = time.perf_counter() - began
        assert all(o.success and o.output_tokens == args.output_len for o in outs), outs[0].error
        return args.requests * args.output_len / took

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from tests.stub_openai import StubProcess

    cores = sorted(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as tmp:
        server = StubProcess(Path(tmp))
        try:
            url = server.base_url
            if len(cores) > 1:  # the server on one core, this client on another
                os.sched_setaffinity(server.process.pid, {cores[-1]})
                os.sched_setaffinity(0, {cores[0]})
            ours(url, args), theirs(url, args)  # warm both (imports, connections)
            rates: dict[str, list[float]] = {"ours": [], "vllm": []}
            for r in range(args.rounds):  # alternate which goes first
                for name in (("ours", "vllm") if r % 2 == 0 else ("vllm", "ours")):
                    rates[name].append((ours if name == "ours" else theirs)(url, args))
                print(f"round {r + 1}: ours {rates['ours'][-1]:,.0f} tok/s, vLLM's client {rates['vllm'][-1]:,.0f} tok/s",
                      flush=True)
        finally:
            server.close()
    ratio = statistics.median(rates["ours"]) / statistics.median(rates["vllm"])
    print(f"client overhead ({args.requests} requests x {args.output_len} tokens, {args.concurrency} in flight, one "
          f"token per chunk, client on one core): ours / vLLM's benchmark client = {ratio:.2f} (medians of "
          f"{args.rounds} rounds; target >= 1.0)")


if __name__ == "__main__":
    main()
