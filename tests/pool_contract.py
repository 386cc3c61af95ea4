"""What every pool promises the driver (pool.Pool), as one test class that each kind of pool subclasses with a
`pool_overrides` fixture (or its own `made`): LocalPool in tests/process, RayPool in tests/integration, the
in-thread LocalPool and the test double FakeOneSlot in tests/unit (as optuna runs one set of storage tests across
its storages). The fake engine, which refuses max_num_seqs above 4 at its start."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers import compose_cfg
from throttle_sweep.cluster.pool import Job, Pool

WORK = ["backend=fake", "fake.start_s=0.1", "workload.num_requests=8", "workload.prompt_len=16", "workload.output_len=16",
        "workload.concurrency=8", "workload.warmup_requests=0", "engine.kv_cache_memory_bytes=131072",
        "engine.block_size=16", "+fake.fail_start_when.max_num_seqs=4", "+space=batching"]
WAITS = 200  # a pool that never answers fails the test instead of hanging it (each wait is at least one record)


def collect(pool: Pool, count: int) -> list[tuple[Job, dict[str, Any]]]:
    got: list[tuple[Job, dict[str, Any]]] = []
    for _ in range(WAITS):
        if len(got) >= count:
            break
        got += pool.wait()
    return got


class PoolContract:
    @pytest.fixture
    def pool_overrides(self) -> list[str]:
        raise NotImplementedError("a pool kind's test class gives its config overrides")

    @pytest.fixture
    def made(self, tmp_path, pool_overrides) -> Iterator[tuple[Pool, dict[str, Any]]]:
        from throttle_sweep.cluster.open import make_pool
        from throttle_sweep.settings.sweep import load_sweep

        run = load_sweep(compose_cfg(*WORK, *pool_overrides, tmp_path=tmp_path))
        pool, close = make_pool(run, say=lambda _: None)
        try:
            yield pool, dict(run.base)
        finally:
            close()

    @staticmethod
    def jobs(pool: Pool, base: dict[str, Any], seqs: list[int]) -> list[Job]:
        """One job per entry of `seqs`, spread over the slots in turn, at positions 0, 1, ..."""
        return [Job(pool.slots[i % len(pool.slots)], {**base, "max_num_seqs": n}, "candidate", i, {"comparison": "c"})
                for i, n in enumerate(seqs)]

    def test_it_says_how_many_slots_it_has_and_whether_they_share_a_machine(self, made):
        pool, _ = made
        assert pool.size >= 1 and pool.slots == list(range(pool.size))
        assert isinstance(pool.shares_machine, bool)

    def test_each_job_comes_back_once_with_its_own_record(self, made):
        pool, base = made
        jobs = self.jobs(pool, base, [1, 2, 3, 4][: 2 * pool.size])
        for job in jobs:
            pool.submit(job)
        got = collect(pool, len(jobs))
        assert sorted(job.position for job, _ in got) == [job.position for job in jobs]  # each once
        for job, record in got:
            assert record["status"] == "ok", record.get("reason")
            assert (record["arm"], record["position"], record["comparison"]) == (job.arm, job.position, "c")
            assert record["flags"]["max_num_seqs"] == job.flags["max_num_seqs"]
        slots = {job.slot: record["slot"] for job, record in got}
        assert len(set(slots.values())) == len(slots)  # each slot's records name it, and only it

    def test_flags_that_fail_give_a_failed_record_and_the_slot_goes_on(self, made):
        pool, base = made
        bad, good = self.jobs(pool, base, [6, 2])
        good = Job(bad.slot, good.flags, good.arm, good.position, good.context)  # the same slot, afterwards
        pool.submit(bad)
        [(_, failed)] = collect(pool, 1)
        assert failed["status"] == "failed" and "refuses max_num_seqs=6" in failed["reason"]
        assert not failed.get("infrastructure")  # the flags' failure, not the slot's
        pool.submit(good)
        [(_, record)] = collect(pool, 1)
        assert record["status"] == "ok"

    def test_a_record_is_held_until_the_driver_has_written_it(self, made):
        """A stopping run drains what finished and was not yet written: nothing is lost, nothing twice."""
        pool, base = made
        jobs = self.jobs(pool, base, [1, 2, 3][: max(2, pool.size)])
        for job in jobs:
            pool.submit(job)
        got = collect(pool, len(jobs))
        (first, _), *rest = got
        pool.written(first)
        assert sorted(r["position"] for r in pool.drain()) == sorted(job.position for job, _ in rest)
        assert pool.drain() == []
