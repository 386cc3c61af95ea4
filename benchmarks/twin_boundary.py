"""A model that does preempt (#45): Qwen2.5-7B on an H100 twin at gpu_memory_utilization=0.3 (a KV cache of
8,253 blocks, about 130k tokens, which fills inside the batching space; at vLLM's 0.9 the cache holds 2,048
requests of this work at once and the boundary lies beyond the range), requests of mixed lengths (uniform,
128-384 + 128-384 tokens), 512 in flight, and async scheduling's jitter on
(twin.jitter: an arriving request misses a step's scheduling with that chance, so preemption counts near the
boundary differ between repeats). How often does the sweep's probe stage name the exact boundary?

The truth, per max_num_batched_tokens choice: the last clean max_num_seqs with jitter and noise off (the twin is
then deterministic), found here by bisection over the whole range with the twin engine and the tool's measure
code directly (TwinEngine.start + measure_replicate), not by the sweep. How sharp that truth is under jitter is
printed too: the last clean and first preempting values at vLLM's default token budget, run --fuzz times each
with jitter on.

The sweep: the main command's space in full (`+space=batching`: max_num_seqs 1..2048, six token choices), one
seed per twin.seed, run in this process with its stages after the probes left out (Sweep.search and
Sweep.confirm return nothing: the boundary is all this benchmark reads, from the study's `boundaries`).
Work: 512 requests a run, all in flight (workload.replicate_s=null, no calibration run): short enough that a
seed's probes take minutes here, not the quarter of an hour 2,048 requests took (max_num_seqs above 512 then
runs as 512 does; the range probed is still 1..2048). A seed is
a hit when every token choice's (last clean, first preempting) is the truth's. Target (#45): >= 95% of 30 seeds.
Seeds run until --minutes of CPU time here is spent (the brief's bound on this shared machine), then stop.

    python benchmarks/twin_boundary.py [--seeds 30] [--minutes 20] [--jitter 0.2] [--checkout DIR]
    python benchmarks/twin_boundary.py --latest
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.results import print_latest_if_asked, record  # noqa: E402
from benchmarks.twin_time_to_answer import head  # noqa: E402

TOKENS = [1024, 2048, 4096, 8192, 16384, 32768]  # conf/space/batching.yaml's choices
HIGH = 2048  # conf/space/batching.yaml's max_num_seqs range: 1..2048
MODEL = "Qwen/Qwen2.5-7B-Instruct"
UTIL = 0.3
WORK = {"num_requests": 512, "concurrency": 512, "prompt_len": 256, "output_len": 256, "length_dist": "uniform",
        "length_spread": 0.5, "replicate_s": None}
TARGET = 0.95


def overrides(seed: int, jitter: float) -> list[str]:
    return ["engine=gpu", "+space=batching", "backend=twin", "twin.gpu=H100", f"engine.model={MODEL}",
            f"engine.gpu_memory_utilization={UTIL}",
            f"twin.jitter={jitter}", f"twin.seed={seed}", *(f"workload.{k}={'null' if v is None else v}"
                                                              for k, v in WORK.items()), "plots=false"]


def probe_only(results: Path, seed: int, jitter: float) -> list[dict[str, Any]]:
    """The sweep up to its probes (its later stages left out); the study's boundaries."""
    import optuna
    from rich.console import Console

    from tests.helpers import compose_cfg
    from throttle_sweep.commands import sweep as sweep_cmd
    from throttle_sweep.sweep.driver import Sweep

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    Sweep.search = lambda self, plan=None: None  # type: ignore[method-assign]
    Sweep.confirm = lambda self: []  # type: ignore[method-assign]
    name = f"seed{seed}"
    cfg = compose_cfg(*overrides(seed, jitter), f"study.name={name}", tmp_path=results)
    sweep_cmd.run(cfg, Console(quiet=True))  # (no winner: 1 is its "nothing exported" exit)
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{results / name / 'study.db'}")
    return study.user_attrs.get("boundaries") or []


class Truth:
    """Preemption counts of the same work on a twin with jitter and noise off (or on, for `jittered`)."""

    def __init__(self) -> None:
        from throttle_sweep.engines.twin import TwinConf, TwinEngine
        from throttle_sweep.measurement.cost import Price
        from throttle_sweep.measurement.workload import WorkloadSpec

        self.spec = WorkloadSpec(**WORK)
        self.price = Price()
        self.engine = TwinEngine(TwinConf(gpu="H100", noise_sd=0.0))
        self.flags = {"model": MODEL, "gpu_memory_utilization": UTIL, "enforce_eager": False, "seed": 0,
                      "tensor_parallel_size": 1}
        self.runs = 0

    def preemptions(self, seqs: int, tokens: int, engine: Any = None) -> int | None:
        """None where vLLM refuses the flags."""
        from throttle_sweep.measurement.replicate import measure_replicate

        flags = {**self.flags, "max_num_seqs": seqs, "max_num_batched_tokens": tokens}
        engine = engine or self.engine
        if engine.refusal(flags):
            return None
        self.runs += 1
        r = measure_replicate(engine, flags, self.spec, self.price, run_id="truth", arm="x", position=0)
        if r["status"] != "ok":
            raise SystemExit(f"{flags}: {r['status']} ({r.get('reason')})")
        return r["preemptions"]

    def boundary(self, tokens: int) -> tuple[int | None, int | None]:
        """(last clean, first preempting) max_num_seqs in 1..HIGH (those vLLM accepts), by bisection: the
        count rises with max_num_seqs under fixed work and no jitter."""
        high = HIGH
        top = self.preemptions(high, tokens)
        if top is None:  # refused (vLLM wants max_num_batched_tokens >= max_num_seqs): the range ends lower
            high = tokens
            top = self.preemptions(high, tokens)
        if top is None:
            raise SystemExit(f"vLLM refuses max_num_seqs={high} with max_num_batched_tokens={tokens}")
        if not top:
            return high, None
        clean, dirty = 1, high  # one sequence alone never preempts (a request that does not fit is refused)
        while dirty - clean > 1:
            mid = (clean + dirty) // 2
            clean, dirty = (mid, dirty) if not self.preemptions(mid, tokens) else (clean, mid)
        return clean, dirty

    def jittered(self, seqs: int, tokens: int, jitter: float, repeats: int) -> list[int | None]:
        from throttle_sweep.engines.twin import TwinConf, TwinEngine

        return [self.preemptions(seqs, tokens, TwinEngine(TwinConf(gpu="H100", noise_sd=0.0, jitter=jitter, seed=k)))
                for k in range(repeats)]


def main() -> None:
    print_latest_if_asked(__file__)
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=30)
    parser.add_argument("--minutes", type=float, default=20.0, help="stop starting seeds after this much CPU time")
    parser.add_argument("--jitter", type=float, default=0.2)
    parser.add_argument("--fuzz", type=int, default=5, help="jittered repeats either side of the true boundary")
    parser.add_argument("--checkout", type=Path, default=ROOT, help="the checkout whose package runs")
    args = parser.parse_args()
    checkout = args.checkout.resolve()
    sys.path.insert(0, str(checkout))

    began = time.monotonic()
    truth = Truth()
    true = {t: truth.boundary(t) for t in TOKENS}
    for t, (clean, dirty) in true.items():
        print(f"truth, max_num_batched_tokens={t}: last clean max_num_seqs={clean}, first preempting {dirty}")
    clean, dirty = true[8192]
    fuzz = {v: truth.jittered(v, 8192, args.jitter, args.fuzz) for v in (clean, dirty) if v is not None}
    print(f"  with jitter {args.jitter}, tokens 8192, {args.fuzz} repeats: "
          + "; ".join(f"max_num_seqs={v}: {c} preemptions" for v, c in fuzz.items()))
    truth_s = time.monotonic() - began
    print(f"  ({truth.runs} runs, {truth_s:.0f} s here)", flush=True)

    rows = []
    began = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            if time.monotonic() - began > args.minutes * 60:
                print(f"stopped after {seed} seeds: {args.minutes:g} minutes spent")
                break
            t0 = time.monotonic()
            found = {(s.get("others") or {}).get("max_num_batched_tokens"): s for s in probe_only(Path(tmp), seed,
                                                                                                   args.jitter)}
            got = {t: (found[t]["last_clean"], found[t]["first_preempting"]) if t in found else None for t in TOKENS}
            bad = {t: got[t] for t in TOKENS if got[t] != true[t]}
            unsure = [t for t in TOKENS if t in found and not (found[t]["consistent"] and found[t]["monotone"])]
            rows.append({"seed": seed, "hit": not bad, "wrong": {str(t): v for t, v in bad.items()},
                         "not_deterministic": unsure, "s": round(time.monotonic() - t0)})
            print(f"seed {seed}: {'exact' if not bad else 'MISSED ' + str(bad)}"
                  + (f"; probes disagreed at tokens {unsure}" if unsure else "") + f" ({rows[-1]['s']} s)", flush=True)
    hits = sum(r["hit"] for r in rows)
    rate = hits / len(rows) if rows else 0.0
    per = {t: sum(str(t) not in r["wrong"] for r in rows) for t in TOKENS}
    print(f"exact boundary (all {len(TOKENS)} token choices) in {hits} of {len(rows)} seeds ({rate:.0%}); per token "
          f"choice: {', '.join(f'{t}: {n}' for t, n in per.items())}; target >= {TARGET:.0%} of 30 seeds: "
          f"{'PASS' if rate >= TARGET and len(rows) >= 30 else 'FAIL' if rate < TARGET else 'too few seeds'}")
    print(f"CPU wall time here: truth {truth_s:.0f} s, {len(rows)} seeds {time.monotonic() - began:.0f} s")
    record(__file__, {**vars(args), "checkout": str(checkout), "checkout_commit": head(checkout)},
           {"truth": {str(t): list(v) for t, v in true.items()}, "fuzz": {str(v): c for v, c in fuzz.items()},
            "seeds": len(rows), "hits": hits, "rate": round(rate, 3), "per_tokens": {str(t): n for t, n in per.items()},
            "rows": rows, "truth_cpu_s": round(truth_s)}, rate >= TARGET and len(rows) >= 30)


if __name__ == "__main__":
    main()
