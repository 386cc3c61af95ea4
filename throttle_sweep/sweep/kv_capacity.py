"""What the KV capacity an engine reports says of closed-loop fixed work: how many of its requests fit at
full length (so where preemption must start along max_num_seqs), and the smallest work a probe needs to see
it. Pure: the probe stage (probes.py) supplies the records and the work."""

from __future__ import annotations

from typing import Any

from throttle_sweep.sweep.boundary import predicted_last_clean
from throttle_sweep.sweep.schedules import SCHEDULING_KNOBS

PROBE_WAVES = 2  # a probe's work: the first batch from an empty engine, and the batch that refills it
# flags that leave the KV capacity as it is: the baseline's reported capacity predicts for settings of these
KV_NEUTRAL = SCHEDULING_KNOBS - {"kv_cache_memory_bytes", "gpu_memory_utilization", "num_gpu_blocks_override"}


def one_length(work: dict[str, Any]) -> bool:
    """Synthetic requests that are all of one length (prompt and output)."""
    return work.get("length_dist") == "fixed" and not work.get("jsonl") and not work.get("sharegpt")


def capacity(record: dict[str, Any], work: dict[str, Any]) -> int | None:
    """How many requests of this fixed work the KV cache a run reported holds at full length (None: the run
    did not say, or the requests differ in length)."""
    kv = record.get("kv_cache") or {}
    if not one_length(work) or not kv.get("blocks"):
        return None
    return predicted_last_clean(kv["blocks"], kv["block_size"], [work["prompt_len"] + work["output_len"]])


def in_flight(work: dict[str, Any]) -> int:
    """The most a closed loop of this work keeps in flight (no limit known: a very large number)."""
    return min(work.get("concurrency") or 1 << 30, work.get("num_requests") or 1 << 30)


def probe_work(knob: str, value: Any, work: dict[str, Any], max_preemptions: int) -> dict[str, Any] | None:
    """What a probe at this max_num_seqs changes in the work: PROBE_WAVES waves of its batch, where the work is
    closed-loop and of one length (so that every wave reaches full length together), and where any preemption
    is infeasible (a count allowed beyond 0 is a count of the whole work). None: the whole work."""
    if knob != "max_num_seqs" or max_preemptions or work.get("loop") != "closed" or not one_length(work):
        return None
    requests = PROBE_WAVES * min(int(value), in_flight(work))
    return {"num_requests": requests} if requests < work["num_requests"] else None
