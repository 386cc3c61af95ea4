"""The client's ceiling: streamed tokens/s and requests/s that our HTTP client (backend=server / endpoint)
absorbs at high concurrency, against vLLM's own benchmark client (`vllm.benchmarks.lib.endpoint_request_func`,
aiohttp) and against a client that only counts (the stub's own ceiling), all on the fast stub
(tests/fast_stub.py: pre-encoded frames, one chunk per request per step, `--chunks-per-write` steps a write),
closed loop, in alternating rounds in one run. Unpinned: the stub and the client share this machine's cores.

    python benchmarks/client_ceiling.py [--requests 4096] [--concurrency 256,1024] [--output-len 128] [--rounds 3]
    python benchmarks/client_ceiling.py --latest

Target (#45): ours >= 100k tokens/s; ours / vLLM's client per round, min/median/max.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.client_overhead import ours, theirs  # noqa: E402
from benchmarks.results import print_latest_if_asked, record  # noqa: E402

TARGET_TOKENS_S = 100_000


def raw(url: str, args: argparse.Namespace) -> float:
    from tests.fast_stub import raw_rate

    return asyncio.run(raw_rate(url, args.requests, args.concurrency, args.output_len)) * args.output_len


def spread(values: list[float]) -> str:
    return f"{min(values):,.0f} / {statistics.median(values):,.0f} / {max(values):,.0f}"


def main() -> None:
    print_latest_if_asked(__file__)
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=4096)
    parser.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[256, 1024])
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--tokens-per-chunk", type=int, default=1)
    parser.add_argument("--chunks-per-write", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from tests.fast_stub import FastStubProcess

    clients: dict[str, Callable[[str, argparse.Namespace], float]] = {"raw": raw, "ours": ours, "vllm": theirs}
    figures: dict[str, dict] = {}
    met = True
    with tempfile.TemporaryDirectory() as tmp:
        server = FastStubProcess(Path(tmp), args.tokens_per_chunk, args.chunks_per_write)
        try:
            for concurrency in args.concurrency:
                run = argparse.Namespace(**{**vars(args), "concurrency": concurrency})
                warm = argparse.Namespace(**{**vars(run), "requests": concurrency})
                for fn in clients.values():  # imports, connections
                    fn(server.base_url, warm)
                got: dict[str, list[float]] = {name: [] for name in clients}
                names = list(clients)
                for r in range(args.rounds):
                    for name in names if r % 2 == 0 else names[::-1]:
                        got[name].append(clients[name](server.base_url, run))
                    print(f"{concurrency} in flight, round {r + 1}: " + ", ".join(
                        f"{n} {got[n][-1]:,.0f} tok/s" for n in names), flush=True)
                ratios = [a / b for a, b in zip(got["ours"], got["vllm"], strict=True)]
                print(f"{concurrency} in flight, tokens/s min / median / max over {args.rounds} rounds:\n"
                      + "".join(f"  {n:5s} {spread(got[n])} tok/s  ({spread([v / args.output_len for v in got[n]])} "
                                f"req/s)\n" for n in names)
                      + f"  ours / vLLM's client per round: {min(ratios):.2f} / {statistics.median(ratios):.2f} / "
                        f"{max(ratios):.2f}", flush=True)
                figures[str(concurrency)] = {**{n: [round(v) for v in got[n]] for n in names},
                                             "ratio": [round(x, 3) for x in ratios]}
                met = met and statistics.median(got["ours"]) >= TARGET_TOKENS_S
        finally:
            server.close()
    print(f"target ours >= {TARGET_TOKENS_S:,} tok/s: {'met' if met else 'not met'}")
    record(__file__, vars(args), figures, met)


if __name__ == "__main__":
    main()
