"""How often mode=capacity's 95% interval (capacity_ci) covers the true capacity, simulated: whole rate searches
(bracket, bisection, knee runs) on a known attainment curve, the interval from knee.fit_knee. The curve (as in
tests/unit/test_capacity_search.py): logit attainment falls linearly in log rate through the SLO's target at
the capacity, `kink` times steeper above it (a queue collapses faster above its capacity than attainment falls
below it), run-to-run noise on the logit, binomial requests within a run. Target (#26): coverage 0.95 +- 0.02.
The interval makes no assumption about the curve's shape between the knee's rates (bounds are rates that hold
or fail beyond doubt), so it covers at least 0.95 for any non-rising curve and is as fine as the rates are: the
script prints how coverage and width move with the number of knee rates and the bisection's tolerance.

    python benchmarks/capacity_coverage.py [--sims 1000]      (about 1 s per 100 searches here)
    python benchmarks/capacity_coverage.py --latest
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.results import print_latest_if_asked, record  # noqa: E402


def cell(sims: int, seed: int, kink: float, **search_kw) -> dict[str, float]:
    from tests.unit.test_capacity_search import search
    from throttle_sweep.capacity.knee import fit_knee

    rng = np.random.default_rng(seed)
    cover = bounded = 0
    widths = []
    for _ in range(sims):
        capacity = float(np.exp(rng.uniform(math.log(2), math.log(60))))
        s = search(capacity, rng, kink=kink, **search_kw)
        knee = fit_knee([(r.rate, r.met, r.counted) for r in s.knee_runs], 0.9)
        cover += (knee.low or 0) <= capacity <= (knee.high or math.inf)
        if knee.low is not None and knee.high is not None:
            bounded += 1
            widths.append(knee.high / knee.low - 1)
    return {"coverage": cover / sims, "bounded": bounded / sims,
            "median_width": statistics.median(widths) if widths else None}


def main() -> None:
    print_latest_if_asked(__file__)
    parser = argparse.ArgumentParser()
    parser.add_argument("--sims", type=int, default=1000)
    args = parser.parse_args()
    rows = {}
    for name, kw in [("default (5 rates x 4, rel_tol 0.1)", {}),
                     ("9 knee rates x 4", {"knee_rates": 9}),
                     ("5 rates x 4, rel_tol 0.05", {"rel_tol": 0.05}),
                     ("5 rates x 8", {"knee_replicates": 8})]:
        for kink in (1.0, 3.0):
            r = cell(args.sims, 7, kink, **kw)
            rows[f"{name}, kink {kink:g}"] = r
            width = f"{100 * r['median_width']:.1f}%" if r["median_width"] is not None else "-"
            print(f"{name:<36} kink {kink:g}: coverage {r['coverage']:.3f}  bounded both sides {r['bounded']:.3f}  "
                  f"median width {width}", flush=True)
    ok = all(abs(r["coverage"] - 0.95) <= 0.02 for r in rows.values())
    print(f"target (coverage 0.95 +- 0.02 in every row): {'met' if ok else 'NOT met'}; {args.sims} searches a row")
    record(__file__, vars(args), rows, ok)


if __name__ == "__main__":
    main()
