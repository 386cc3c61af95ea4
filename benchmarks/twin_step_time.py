"""The GPU twin's two step times side by side (#45): the roofline (the default) against NVIDIA's AIConfigurator
(`twin.step_time=aiconfigurator`, its kernels measured with vLLM 0.24.0 on the GPU), in one run.

1. The GPU's part of single steps: decode batches of 1 to 1024 sequences (384 KV tokens each) and a 2048-token
   prefill, Qwen2.5-0.5B and Qwen2.5-7B, on the H100 and H200 twins: milliseconds and the ratio measured/roofline.
2. Whole runs: Qwen2.5-0.5B on the H100 twin, 2048 requests of 256 + 256 tokens all in flight, max_num_seqs 8 to
   1024, output tokens/s with each step time, on each host calibration (twin.host: seed, large-batch).

Needs the twin-aic extra (aiconfigurator-core==0.12.0). Both are predictions; neither is a GPU measurement.

    python benchmarks/twin_step_time.py
    python benchmarks/twin_step_time.py --latest
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.results import print_latest_if_asked, record  # noqa: E402

MODELS = {"Qwen2.5-0.5B": "Qwen/Qwen2.5-0.5B-Instruct", "Qwen2.5-7B": "Qwen/Qwen2.5-7B-Instruct"}
DECODES = [1, 8, 64, 256, 1024]
KV_PER_SEQ = 384
SEQS = [8, 64, 256, 1024]


def closed_loop(session, requests: int = 2048, prompt: int = 256, output: int = 256) -> float:
    """Output tokens/s of fixed work with every request in flight."""
    from throttle_sweep.engines.base import Request

    session.begin_replicate(0)
    for i in range(requests):
        session.add(Request(f"r{i}", output, tuple(range(prompt))))
    while session.has_unfinished():
        session.step()
    return requests * output / session.now()


def main() -> None:
    print_latest_if_asked(__file__)
    try:
        import aiconfigurator_core  # noqa: F401
    except ImportError:
        raise SystemExit("needs the twin-aic extra: pip install 'throttle-sweep[twin-aic]'") from None
    from throttle_sweep.engines.twin import TwinConf, TwinEngine
    from throttle_sweep.engines.twin.step_time import Batch

    began = time.monotonic()
    steps: dict[str, dict[str, float]] = {}
    print("GPU time of one step, ms: roofline | AIConfigurator (measured/roofline)")
    for gpu in ("H100", "H200"):
        for label, model in MODELS.items():
            flags = {"model": model, "max_num_seqs": 1024, "max_num_batched_tokens": 8192}
            ours = TwinEngine(TwinConf(gpu=gpu)).start(flags).roofline
            theirs = TwinEngine(TwinConf(gpu=gpu, step_time="aiconfigurator")).start(flags).roofline
            batches = {f"decode {d}": Batch(0, d, d * KV_PER_SEQ, d, d) for d in DECODES}
            batches["prefill 2048"] = Batch(2048, 0, 2048, 1, 1)
            row = []
            for name, batch in batches.items():
                a, b = ours.gpu_seconds(batch) * 1e3, theirs.gpu_seconds(batch) * 1e3
                steps[f"{gpu} {label} {name}"] = {"roofline_ms": round(a, 3), "aic_ms": round(b, 3)}
                row.append(f"{name}: {a:.2f} | {b:.2f} ({b / a:.2f})")
            print(f"  {gpu} {label}: " + "; ".join(row))
    runs: dict[str, dict[str, float]] = {}
    print("Qwen2.5-0.5B on the H100 twin, 2048 x (256 + 256) tokens all in flight, output tokens/s: "
          "roofline | AIConfigurator (ratio)")
    for host in ("seed", "large-batch"):
        row = []
        for seqs in SEQS:
            flags = {"model": MODELS["Qwen2.5-0.5B"], "max_num_seqs": seqs, "max_num_batched_tokens": 8192}
            a, b = (closed_loop(TwinEngine(TwinConf(gpu="H100", noise_sd=0.0, host=host, step_time=s)).start(flags))
                    for s in ("roofline", "aiconfigurator"))
            runs[f"{host} {seqs}"] = {"roofline": round(a), "aic": round(b)}
            row.append(f"{seqs}: {a:,.0f} | {b:,.0f} ({b / a:.2f})")
        print(f"  host {host}: " + "; ".join(row))
    print(f"CPU wall time here: {time.monotonic() - began:.0f} s")
    record(__file__, {"kv_per_seq": KV_PER_SEQ, "aiconfigurator_core": "0.12.0"}, {"steps": steps, "runs": runs},
           None)


if __name__ == "__main__":
    main()
