"""Write a small synthetic trace in Mooncake's JSONL format (examples/mooncake-synthetic.jsonl): steady
arrivals with bursts, and multi-turn sessions behind a few shared system prompts, so that hash ids repeat.

Its blocks are 128 tokens (vLLM's CPU build's KV block), not Mooncake's 512, so that a shared block is a
whole cache block and every request fits the embedded tiny model (max_model_len 1024): replay it with
`workload.trace_block_size=128`. Seeded: the same file every time. Usage:
`python scripts/make_trace.py [OUT] [--seed N]`."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

BLOCK = 128  # tokens per hash id
MAX_BLOCKS = 5  # a prompt of at most 640 tokens, + at most 48 output: within max_model_len 1024
SYSTEM_BLOCKS = (2, 1, 3)  # three system prompts of 2, 1 and 3 blocks
SPAN_S, RATE = 16.0, 2.5  # steady arrivals (Poisson) over the span
BURSTS_S, BURST_SIZE, BURST_WIDTH_S = (4.0, 9.0, 13.0), 6, 0.15  # ... and bursts on top


def arrivals(rng: random.Random) -> list[float]:
    times, t = [], 0.0
    while t < SPAN_S:
        times.append(t)
        t += rng.expovariate(RATE)
    for at in BURSTS_S:
        times += [at + rng.uniform(0, BURST_WIDTH_S) for _ in range(BURST_SIZE)]
    return sorted(times)


def trace(seed: int) -> list[dict]:
    """One line per arrival: a new session (a system prompt and one block of its own) or the next turn of an
    open one (its previous turn's blocks and one more); the last block of every prompt is partial."""
    rng = random.Random(seed)
    next_id = 0
    systems = []
    for n in SYSTEM_BLOCKS:
        systems.append(list(range(next_id, next_id + n)))
        next_id += n
    sessions: list[list[int]] = []
    lines = []
    for at in arrivals(rng):
        open_ = [s for s in sessions if len(s) < MAX_BLOCKS]
        if open_ and rng.random() < 0.5:
            ids = rng.choice(open_)
            sessions.remove(ids)
        else:
            ids = list(rng.choice(systems))
        ids = ids + [next_id]
        next_id += 1
        sessions.append(ids)
        lines.append({"timestamp": round(at * 1000), "input_length": len(ids) * BLOCK - rng.randrange(0, BLOCK - 16),
                      "output_length": rng.randrange(8, 49), "hash_ids": ids})
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default=str(Path(__file__).resolve().parents[1] / "examples" /
                                                       "mooncake-synthetic.jsonl"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    lines = trace(args.seed)
    Path(args.out).write_text("".join(json.dumps(line) + "\n" for line in lines))
    print(f"{args.out}: {len(lines)} requests over {lines[-1]['timestamp'] / 1000:.1f} s, "
          f"{len({h for line in lines for h in line['hash_ids']})} distinct hash ids of {BLOCK} tokens")


if __name__ == "__main__":
    main()
