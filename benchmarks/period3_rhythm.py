"""A machine rhythm of period 3 runs against the default comparison (abba x4, ABBABAAB), simulated (#27's last
calibration row): A/A coverage and false verdicts of the drift model as it is, of the same model with
period-3 terms added when a test pooled over the sweep's other comparisons finds the rhythm, and with them
always; and the power each keeps for a 5% saving without a rhythm. Each sweep: 8 other comparisons give the
pooled noise (stats.pooled_prior, as the search pools it), +27% linear drift, 2% noise, the rhythm
amp * cos(2 pi position / 3 + phase) with a random phase per comparison. The model is the package's (log cost
on [1, arm, position]: fitting.fit_joint), written out here so that the period-3 columns can be added.
Target (#27): coverage 0.95 +- 0.01 and each false verdict <= 0.025 in every row, at no great cost in power.

    python benchmarks/period3_rhythm.py [--sims 2000]      (about 10 s per 1000 sweeps here)
    python benchmarks/period3_rhythm.py --latest
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
from scipy import special

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.results import print_latest_if_asked, record  # noqa: E402
from throttle_sweep.stats.schedule import make_schedule  # noqa: E402
from throttle_sweep.stats.verdict import pooled_prior, t_quantile  # noqa: E402

ORDER = make_schedule("abba", 4)
ARM = np.array([a == "candidate" for a in ORDER], dtype=float)
POS = np.arange(len(ORDER), dtype=float)
RHYTHM_P = 0.01  # the pooled test's level before the model takes the rhythm in


def design(rhythm: bool) -> np.ndarray:
    cols = [np.ones(len(POS)), ARM, POS - POS.mean()]
    if rhythm:
        cols += [np.cos(2 * np.pi * POS / 3), np.sin(2 * np.pi * POS / 3)]
    return np.column_stack(cols)


def costs(rng: np.random.Generator, amp: float, ratio: float = 1.0, sd: float = 0.02) -> np.ndarray:
    phase = rng.uniform(0, 2 * np.pi)
    return (np.log1p(0.27 * POS / (len(POS) - 1)) + np.log1p(amp * np.cos(2 * np.pi * POS / 3 + phase))
            + ARM * math.log(ratio) + rng.normal(0, sd, len(POS)))


def fitted(y: np.ndarray, rhythm: bool) -> tuple[float, float, int, float]:
    """The arm's log ratio, the residual sum of squares, its df, and the ratio's variance per unit noise."""
    x = design(rhythm)
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    resid = y - x @ coef
    return float(coef[1]), float(resid @ resid), len(y) - x.shape[1], float(np.linalg.inv(x.T @ x)[1, 1])


def sweep(rng: np.random.Generator, amp: float, ratio: float, policy: str) -> tuple[float, float, bool]:
    """One comparison judged beside 8 others: its interval (log scale) and whether the rhythm was modelled."""
    others = [costs(rng, amp) for _ in range(8)]
    plain, extended = [fitted(y, False) for y in others], [fitted(y, True) for y in others]
    if policy == "pooled test":
        num = sum(p[1] - e[1] for p, e in zip(plain, extended, strict=True))
        q = sum(p[2] - e[2] for p, e in zip(plain, extended, strict=True))
        den, df = sum(e[1] for e in extended), sum(e[2] for e in extended)
        rhythm = float(special.fdtrc(q, df, (num / q) / (den / df))) < RHYTHM_P
    else:
        rhythm = policy == "always"
    pool = pooled_prior([(f[1] / f[2], f[2]) for f in (extended if rhythm else plain)])
    effect, sse, df, scale = fitted(costs(rng, amp, ratio), rhythm)
    s2, total_df = sse / df, df
    if pool is not None:
        s2, total_df = (pool.df * pool.s2 + sse) / (pool.df + df), df + pool.df
    half = t_quantile(0.975, total_df) * math.sqrt(s2 * scale)
    return effect - half, effect + half, rhythm


def main() -> None:
    print_latest_if_asked(__file__)
    parser = argparse.ArgumentParser()
    parser.add_argument("--sims", type=int, default=2000)
    args = parser.parse_args()
    figures, ok = {}, True
    print(f"{'policy':12} {'rhythm':>7} {'modelled':>9} {'coverage':>9} {'cheaper':>8} {'pricier':>8} {'power 5%':>9}")
    for policy in ("as today", "pooled test", "always"):
        rng = np.random.default_rng(3)
        power = sum(sweep(rng, 0.0, 0.95, policy)[1] < 0 for _ in range(args.sims)) / args.sims
        for amp in (0.0, 0.02):
            rng = np.random.default_rng(7)
            runs = [sweep(rng, amp, 1.0, policy) for _ in range(args.sims)]
            row = {"modelled": sum(r[2] for r in runs) / args.sims,
                   "coverage": sum(lo <= 0 <= hi for lo, hi, _ in runs) / args.sims,
                   "cheaper": sum(hi < 0 for _, hi, _ in runs) / args.sims,
                   "pricier": sum(lo > 0 for lo, _, _ in runs) / args.sims, "power_5pct": power}
            figures[f"{policy}, rhythm {amp:.0%}"] = row
            ok = ok and abs(row["coverage"] - 0.95) <= 0.01 and max(row["cheaper"], row["pricier"]) <= 0.025
            print(f"{policy:12} {amp:>7.0%} {row['modelled']:>9.3f} {row['coverage']:>9.3f} {row['cheaper']:>8.4f} "
                  f"{row['pricier']:>8.4f} {power:>9.3f}")
    print(f"({args.sims} sweeps a row; target: coverage 0.95 +- 0.01 and false verdicts <= 0.025 in every row, "
          f"with power kept)")
    record(__file__, vars(args), figures, ok)


if __name__ == "__main__":
    main()
