"""The fake engine's runs around its knee, many arrival schedules a rate: what the capacity tests' statistics
are calibrated on (tests/unit/test_capacity_search.py resamples them), since a run's share of requests meeting
the SLO is skewed in a way no textbook model fixes (most runs near the top, a few that a burst sank). One
configuration (max_num_seqs=8, fake.noise_sd=0.02, TTFT <= 200 ms and TPOT <= 50 ms), 60 s runs, the k-th
run at a rate on arrival schedule k (its replicate index), the first 20% of each schedule not counted.

    python benchmarks/fake_knee_runs.py [--rates 12.6,12.8,13.0] [--schedules 240]   (about 2 min a rate here)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "tests" / "unit" / "data" / "fake_knee_runs.json"


def main() -> None:
    from tests.helpers import compose_cfg
    from throttle_sweep.capacity.runs import met_of
    from throttle_sweep.cluster.slot import WarmSlot
    from throttle_sweep.cluster.thread_host import InThreadHost
    from throttle_sweep.settings.capacity import load_capacity

    parser = argparse.ArgumentParser()
    parser.add_argument("--rates", default="12.6,12.8,13.0")
    parser.add_argument("--schedules", type=int, default=240)
    args = parser.parse_args()
    WarmSlot.make_host = staticmethod(lambda engine, spec, price, *, name: InThreadHost(engine, spec, price,
                                                                                        name=name))
    cfg = compose_cfg("mode=capacity", "run=knee", "backend=fake", "workload.num_requests=20", "capacity.run_s=60",
                      "slo.p95_ttft_s=0.2", "slo.p95_tpot_s=0.05", "fake.noise_sd=0.02", "engine.max_num_seqs=8",
                      "plots=false", tmp_path=Path(tempfile.mkdtemp()))
    r = load_capacity(cfg)
    slot = WarmSlot(r.engine, r.settings.spec, r.price, run_id="knee", **r.warm)
    rates = {}
    try:
        for rate in (float(x) for x in args.rates.split(",")):
            runs = [met_of(slot.measure(dict(r.flags), "candidate", k, {"stage": "capacity"},
                                        workload=r.settings.at(rate, k)), r.settings) for k in range(args.schedules)]
            rates[f"{rate:g}"] = [list(x) for x in runs]
            print(f"{rate:g} req/s: pooled share {sum(m for m, _ in runs) / sum(n for _, n in runs):.4f}", flush=True)
    finally:
        slot.close()
    OUT.write_text(json.dumps({"made_by": "benchmarks/fake_knee_runs.py", "run_s": 60, "rates": rates}) + "\n")
    print(f"-> {OUT}")


if __name__ == "__main__":
    main()
