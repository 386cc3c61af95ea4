"""The t and F tails an estimate needs, through scipy.stats' distributions and through scipy.special (what
stats.py calls), side by side in one run, alternating rounds; then one whole `estimate()` of an abba
comparison. Prints microseconds per call and the ratio stats/special.

    .venv/bin/python benchmarks/stats_speed.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import timeit

from scipy import special
from scipy import stats as sps

from throttle_sweep.stats.schedule import make_schedule
from throttle_sweep.stats.verdict import Observation, Thresholds, estimate

PAIRS = {
    "t quantile": (lambda: sps.t.ppf(0.9875, 5.0), lambda: special.stdtrit(5.0, 0.9875)),
    "t tail": (lambda: sps.t.sf(2.1, 5.0), lambda: special.stdtr(5.0, -2.1)),
    "F tail": (lambda: sps.f.sf(2.1, 2, 5.0), lambda: special.fdtrc(2, 5.0, 2.1)),
}


def per_call_us(fn, number: int) -> float:
    return timeit.timeit(fn, number=number) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    for name, (old, new) in PAIRS.items():
        a = b = 0.0
        for _ in range(args.rounds):  # alternating: drift lands on both
            a += per_call_us(old, 2000)
            b += per_call_us(new, 2000)
        print(f"{name:<11} scipy.stats {a / args.rounds:7.1f} us  scipy.special {b / args.rounds:6.2f} us  "
              f"ratio {a / b:5.1f}")
    order = make_schedule("abba", 4)
    runs = [Observation(arm, i, (0.5 if arm == "candidate" else 1.0) * (1 + 0.01 * i)) for i, arm in enumerate(order)]
    us = per_call_us(lambda: estimate(runs, Thresholds()), 500)
    print(f"estimate() of an abba comparison (8 runs), as stats/verdict.py computes it now: {us:.0f} us")


if __name__ == "__main__":
    main()
