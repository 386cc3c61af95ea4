"""Notes said before measuring: settings that run, but change how to read the answer."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from throttle_sweep.measurement.workload import WorkloadSpec

TINY_KV = 64 << 20  # below this a KV cache is the embedded tiny model's size (tiny_cpu: 2.25 MiB), not a real model's


def kv_size_note(flags: Mapping[str, Any], *, source: str) -> str | None:
    """A named model with the embedded tiny model's KV cache size (engine=tiny_cpu's default) would fail to
    start, or preempt from the first request, after its engine has loaded: say so before measuring."""
    size = flags.get("kv_cache_memory_bytes")
    if flags.get("model") is None or size is None or size >= TINY_KV:
        return None
    return (f"{source}.kv_cache_memory_bytes={size} ({size / (1 << 20):.2f} MiB) is sized for the embedded tiny "
            f"model, not {flags['model']!r}: with engine=gpu vLLM sizes the KV cache from GPU memory "
            "(kv_cache_memory_bytes=null); on the CPU build set a size that holds the work's requests")


def concurrency_note(flags: Mapping[str, Any], spec: WorkloadSpec, *, source: str) -> str | None:
    """max_num_seqs above what a closed loop keeps in flight changes nothing: say so before measuring.
    `source` names where the value came from (an arm, the engine; a sweep clips its space instead)."""
    seqs = flags.get("max_num_seqs")
    if spec.loop == "closed" and seqs is not None and seqs > min(spec.concurrency, spec.num_requests):
        return (f"{source}.max_num_seqs={seqs} is above the {min(spec.concurrency, spec.num_requests)} requests "
                "workload.concurrency keeps in flight: the engine never runs more than that, so values above it "
                "cannot differ; raise workload.concurrency (and num_requests)")
    return None


def shared_engine_note(warm: Mapping[str, Any]) -> str | None:
    """A restart policy that lets replicates share an engine makes the interval blind to the engines' own
    speed, which differs from engine to engine (benchmarks/warm_engines.py): say so before measuring."""
    if warm["restart"] == "never":
        return ("compare.restart=never: each arm's replicates share one engine, so the interval does not see how "
                "engines differ in speed (on the real engine here: A/A log ratios spread 6.3% where the intervals "
                "assumed 3.8%, a false-verdict rate nearer 0.12 than alpha); the default, per_replicate, samples a "
                "new engine for every replicate")
    if warm["restart"] == "every_k" and warm["restart_every"] > 1:
        return (f"compare.restart=every_k with compare.restart_every={warm['restart_every']}: replicates on one "
                "engine are treated as independent, so the interval under-counts how engines differ in speed; "
                "the default, per_replicate, samples a new engine for every replicate")
    return None


def few_replicates_note(replicates: int, *, key: str) -> str | None:
    """Two runs per arm leave the drift-aware fit (intercept, arm, drift) one degree of freedom: say so before
    measuring, since such an interval decides only huge differences measured with very little noise."""
    if replicates != 2:
        return None
    return (f"{key}=2: with 2 runs per arm the drift-aware interval has 1 degree of freedom (t = 12.7 at 95%), "
            "so only a very large difference measured with very little noise can be decided; 4 or more is advised")
