"""Same schedule, same configuration: flags that leave the engine's step-by-step schedule unchanged. An index
over records, no I/O.

With closed-loop fixed work on an engine whose steps the driver sees one by one (vLLM's in-process engine
core without CUDA graphs, the fake), a replicate records a fingerprint of its schedule: at every step, how
many requests were in flight, which of them got how many tokens, and how many tokens the scheduler had
computed for each (`workload.drive`); its preemptions and prefix-cache hits go with it. Two configurations
with the same fingerprint ran the same sequence of batches, prefill chunks included. If they differ only in
knobs that act through the scheduler and the KV cache's size (max_num_batched_tokens where it never binds, a
KV cache larger than the work needs), they computed the same thing in the same steps: one measurement
answers both. Knobs that change how fast a step runs (dtypes, prefix caching, the attention backend) are
never merged this way, whatever their schedule; with CUDA graphs no schedule is recorded at all (the
batching knobs choose the captured sizes there).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from throttle_sweep.engines.flags import flags_key
from throttle_sweep.store.records import is_ok

# Knobs whose only effect on a step is which requests it schedules and how many of their tokens (and, through
# the KV cache's size, when that runs out): equal schedules mean equal work, step by step.
SCHEDULING_KNOBS = frozenset({
    "max_num_seqs", "max_num_batched_tokens", "kv_cache_memory_bytes", "gpu_memory_utilization",
    "num_gpu_blocks_override", "enable_chunked_prefill", "max_num_partial_prefills",
    "max_long_partial_prefills", "long_prefill_token_threshold", "scheduling_policy",
})


def differs_in_scheduling_only(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Do two sets of engine flags differ in scheduling knobs alone (vLLM's default counts as a value)?"""
    keys = set(a) | set(b)
    return all(a.get(k) == b.get(k) for k in keys - SCHEDULING_KNOBS)


class ScheduleIndex:
    """Flags -> the schedules their measured runs recorded, kept up to date as records arrive (look-ups are
    made for every proposal and every ranking, so they must not rescan the records)."""

    def __init__(self, records: Iterable[Mapping[str, Any]] = ()) -> None:
        # flags -> the work's size (None: the whole work; a probe's few waves: its request count) -> schedules
        self._seen: dict[str, dict[int | None, set[str]]] = {}
        for record in records:
            self.add(record)

    def add(self, record: Mapping[str, Any]) -> None:
        """A run's schedule, with what the step trace cannot show: its preemptions (recomputed work) and the
        prompt tokens its prefix cache served (work not done), which a smaller KV cache may evict sooner."""
        mark = (record.get("engine_schedule") or {}).get("fingerprint")
        # a calibration run's work is of another size (workload.replicate_s): not these flags' schedule
        replicate = is_ok(record) and not record.get("warmup") and record.get("stage") != "calibration"
        if mark and replicate:
            hits = (record.get("prefix_cache") or {}).get("hits")
            size = (record.get("workload_changed") or {}).get("num_requests")  # a probe's waves: compared alike
            self._seen.setdefault(flags_key(record.get("flags") or {}), {}).setdefault(size, set()).add(
                f"{mark}/{record.get('preemptions')}/{hits}")

    def __bool__(self) -> bool:
        """Has this engine recorded any schedule (HTTP engines do not see the engine's steps)?"""
        return bool(self._seen)

    def fingerprint(self, flags: Mapping[str, Any]) -> str | None:
        """The one schedule every measured run of these flags had (for each size of work run), or None: none
        recorded one, or they disagree (the schedule is then not deterministic here, and nothing is merged on
        it)."""
        seen = self._seen.get(flags_key(flags), {})
        if not seen or any(len(marks) != 1 for marks in seen.values()):
            return None
        return " ".join(f"{size}:{next(iter(marks))}" for size, marks in sorted(seen.items(), key=str))

    def same(self, a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
        """Are two configurations one, as far as cost goes: scheduling knobs apart, the same flags, and the
        same recorded schedule on every size of work both ran?"""
        if not differs_in_scheduling_only(a, b) or self.fingerprint(a) is None or self.fingerprint(b) is None:
            return False
        ours, theirs = self._seen[flags_key(a)], self._seen[flags_key(b)]
        common = set(ours) & set(theirs)
        return bool(common) and all(ours[size] == theirs[size] for size in common)
