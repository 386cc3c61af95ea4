"""Several slots on one machine (`slots`): the engines of a CPU build use one core each, so a sweep runs one
comparison per core, side by side. The driver stays the one writer; each comparison keeps to one slot."""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections import defaultdict

import optuna
import pytest
from rich.console import Console

from tests.helpers import PoolBasics, compose_cfg, stage
from throttle_sweep.cluster.pool import Job, LocalPool, local_slots
from throttle_sweep.cluster.slot import WarmSlot
from throttle_sweep.commands import sweep as sweep_cmd
from throttle_sweep.errors import ConfigError
from throttle_sweep.store.records import read_records


def test_two_slots_measure_at_the_same_time_and_return_to_the_caller():
    both = threading.Barrier(2, timeout=5)  # broken (an error) unless both measures run at once
    callers = set()

    def measure(flags, arm, position, context):
        both.wait()
        callers.add(threading.current_thread().name)
        return {"status": "ok", "slot": context["slot"], "position": position}

    pool = LocalPool([measure, measure])
    try:
        pool.submit(Job(0, {}, "baseline", 0))
        pool.submit(Job(1, {}, "baseline", 0))
        done = []
        while len(done) < 2:
            done += pool.wait()
    finally:
        pool.close()
    assert sorted(r["slot"] for _, r in done) == ["local-0", "local-1"]
    assert threading.current_thread().name not in callers and len(callers) == 2


def test_a_slot_that_raises_raises_in_the_driver_after_the_records_beside_it_are_returned():
    slow_done = threading.Event()

    def fine(flags, arm, position, context):
        return {"status": "ok", "slot": context["slot"]}

    def broken(flags, arm, position, context):
        slow_done.wait(5)  # so that both outcomes are queued before the driver looks
        raise RuntimeError("the slot's own bug")

    pool = LocalPool([fine, broken])
    try:
        pool.submit(Job(0, {}, "baseline", 0))
        pool.submit(Job(1, {}, "baseline", 0))
        first = pool.wait()
        slow_done.set()
        returned = list(first)
        with pytest.raises(RuntimeError, match="the slot's own bug"):
            while True:
                returned += pool.wait()
    finally:
        pool.close()
    assert [r["slot"] for _, r in returned] == ["local-0"]  # measured, returned, never lost to the error


def test_one_slot_measures_in_the_callers_thread():
    seen = []
    pool = LocalPool(lambda *a: seen.append(threading.current_thread()) or {"status": "ok"})
    pool.submit(Job(0, {}, "baseline", 0))
    assert pool.wait()[0][1] == {"status": "ok"} and seen == [threading.current_thread()]
    assert pool.size == 1 and pool.slots == [0]


def test_auto_gives_the_cpu_engine_one_slot_per_group_of_its_threads(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda _: set(range(6)))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert local_slots(None, backend="vllm", cpu_engine=True)[0] == 4  # capped: the memory bus and the driver
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert local_slots(None, backend="vllm", cpu_engine=True)[0] == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "8")
    assert local_slots(None, backend="vllm", cpu_engine=True)[0] == 1
    monkeypatch.delenv("OMP_NUM_THREADS")  # the engine processes get 1 (engines/vllm_inproc.py)
    assert local_slots(None, backend="vllm", cpu_engine=True)[0] == 4
    for backend, cpu in [("vllm", False), ("server", True), ("fake", True), ("endpoint", False)]:
        assert local_slots(None, backend=backend, cpu_engine=cpu)[0] == 1, backend
    assert local_slots(3, backend="fake", cpu_engine=False) == (3, "slots")


@pytest.mark.parametrize(("overrides", "message"), [
    (["slots=0"], r"slots must be an integer >= 1 or null .*but got 0"),
    (["slots=2", "backend=vllm"], r"slots=2: several engines on this machine's GPUs need one device each; use "
                                  r"ray.enabled=true"),
    (["slots=2", "ray.enabled=true"], r"slots=2 counts slots on this machine; with ray.enabled=true .*ray.slots"),
])
def test_a_bad_slot_count_is_named_before_any_engine_starts(tmp_path, monkeypatch, overrides, message):
    monkeypatch.setattr(WarmSlot, "make_host", staticmethod(lambda *a, **k: pytest.fail("an engine started")))
    monkeypatch.setattr("throttle_sweep.engines.vllm_inproc.cpu_build", lambda: False)  # as on a GPU machine
    cfg = compose_cfg("backend=fake", "+space=batching", *overrides, tmp_path=tmp_path)
    with pytest.raises(ConfigError, match=message):
        sweep_cmd.run(cfg, Console(quiet=True))


def test_an_endpoint_is_one_slot(tmp_path):
    with pytest.raises(ConfigError, match=r"slots=2: backend=endpoint measures your servers"):
        local_slots(2, backend="endpoint", cpu_engine=False)


def test_a_sweep_on_two_slots_keeps_each_comparison_on_one_slot_and_both_busy(tmp_path):
    """The fake engine, in each slot's thread, on two local slots: both slots measure, every comparison's
    replicates share one slot, the two slots' work overlaps in time, and the answer is the one slot's."""
    def sweep(name, *extra):
        cfg = compose_cfg("backend=fake", "+space=batching", "~space.max_num_batched_tokens",
                          "space.max_num_seqs.low=1", "space.max_num_seqs.high=32", "space.max_num_seqs.log=false",
                          "workload.num_requests=32", "workload.concurrency=32", "workload.prompt_len=16",
                          "workload.output_len=48", "workload.warmup_requests=0",
                          f"engine.kv_cache_memory_bytes={48 * 16 * 1024}", "engine.block_size=16", "compare.replicates=2",
                          "study.confirm_replicates=2", "study.n_trials=4", "fake.noise_sd=0.01",
                          f"study.name={name}", *extra, tmp_path=tmp_path)
        assert sweep_cmd.run(cfg, Console(quiet=True)) == 0
        study = optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path / name / 'study.db'}")
        return study, read_records(tmp_path / name / "replicates.jsonl")

    study, records = sweep("two", "slots=2", "study.sequential=false")  # both confirmations at once
    by_comparison = defaultdict(set)
    for r in records:
        by_comparison[r["comparison"]].add(r["slot"])
    assert {r["slot"] for r in records} == {"local-0", "local-1"}
    assert all(len(slots) == 1 for slots in by_comparison.values()), by_comparison
    def span(r):  # when the slot ran it, on the wall clock (the fake engine's durations are virtual)
        return dt.datetime.fromisoformat(r["started_at"]), dt.datetime.fromisoformat(r["ended_at"])

    assert len(records) == len({(r["comparison"], r["position"]) for r in records})  # one writer, nothing twice
    zero = [span(r) for r in records if r["slot"] == "local-0"]
    one = [span(r) for r in records if r["slot"] == "local-1"]
    assert any(a0 < b1 and a1 < b0 for a0, b0 in zero for a1, b1 in one)  # the slots measured side by side
    # confirmation, which quotes the answer, runs alone: one slot, nothing beside it
    confirm = [span(r) for r in records if r["stage"] == "confirm"]
    assert len({r["slot"] for r in records if r["stage"] == "confirm"}) == 1 and len(confirm) >= 6
    # the two confirmed share their baseline's runs (one after the other anyway): B, C1 and C2 twice each
    assert len({json.dumps(r["flags"], sort_keys=True) for r in records
                if r["stage"] == "confirm" and r["arm"] == "candidate"}) == 2
    first, last = min(a for a, _ in confirm), max(b for _, b in confirm)
    assert not [r for r in records if r["stage"] != "confirm" and span(r)[1] > first and span(r)[0] < last]
    assert {r["slots"] for r in records if r["stage"] != "confirm"} == {2}
    assert {r["slots"] for r in records if r["stage"] == "confirm"} == {1}  # alone
    _, one_slot = sweep("one", "slots=1", "study.sequential=false")
    assert {r["slot"] for r in one_slot} == {"local-0"}
    edge = [(b["last_clean"], b["first_preempting"], b["exact"]) for b in study.user_attrs["boundaries"]]
    assert edge == [(b["last_clean"], b["first_preempting"], b["exact"]) for b in optuna.load_study(
        study_name="one", storage=f"sqlite:///{tmp_path / 'one' / 'study.db'}").user_attrs["boundaries"]]


class BothAtOnce(PoolBasics):
    """Two slots whose replicates finish together: `wait` returns both; one more sits done in `drain`."""

    size, slots = 2, [0, 1]

    def __init__(self, late=None):
        self.queue, self.late = [], late

    def submit(self, job):
        self.queue.append(job)

    def wait(self):
        done, self.queue = self.queue, []
        return [(job, {"status": "ok", "comparison": job.context["comparison"], "position": job.position,
                       "slot": f"s{job.slot}", "preemptions": 0}) for job in done]

    def drain(self):
        return [self.late] if self.late else []

    def close(self):
        pass


def probe_driver(pool, written):
    from throttle_sweep.sweep.driver import Sweep
    from throttle_sweep.sweep.options import SweepSettings

    flags = {"max_model_len": 1024}
    return Sweep(study=optuna.create_study(), distributions={"max_num_seqs": optuna.distributions.IntDistribution(1, 8)},
                 base_flags=flags, baseline_flags={**flags, "max_num_seqs": 1}, workload_key={}, pool=pool,
                 write=written.append, existing=[], settings=SweepSettings())


def test_a_run_that_stops_on_one_record_of_a_batch_still_writes_the_others():
    """Two slots finish at once and acting on the first stops the run (a failed baseline, Ctrl-C): the second
    record was measured, so it is written too, and so is one another slot finished while the driver worked."""
    from throttle_sweep.stats.schedule import CANDIDATE
    from throttle_sweep.sweep.runner import SweepStopped

    written = []
    late = {"status": "ok", "comparison": "late", "position": 0, "slot": "s1"}
    sweep = probe_driver(BothAtOnce(late), written)
    comps = iter([sweep.runner.comparison(f"probe {n}", "probe", {}, 1, slot, arms={CANDIDATE: {"max_num_seqs": n}},
                                   order=[CANDIDATE]) for slot, n in ((0, 2), (1, 3))])

    def finish(comp):
        raise SweepStopped("the baseline failed")

    with pytest.raises(SweepStopped):
        sweep.runner.run(stage(lambda slot: next(comps, None), finish))
    assert sorted(r["slot"] for r in written) == ["s0", "s1", "s1"] and late in written


def test_a_ctrl_c_while_the_driver_writes_a_batch_loses_none_of_its_records(ctrl_c):
    """A real SIGINT lands while the first record of a two-record batch is being written (the fsync is the
    long part of a write). The sweep stops as Ctrl-C asks, but only after the batch is written: the second
    record was measured too."""
    import os
    import signal

    from throttle_sweep.stats.schedule import CANDIDATE

    written = []

    def write(record):
        written.append(record)
        if len(written) == 1:
            os.kill(os.getpid(), signal.SIGINT)  # Python runs the handler at the next bytecode

    sweep = probe_driver(BothAtOnce(), written)
    sweep.runner._write = write  # noqa: SLF001 - the log's append
    comps = iter([sweep.runner.comparison(f"probe {n}", "probe", {}, 1, slot, arms={CANDIDATE: {"max_num_seqs": n}},
                                   order=[CANDIDATE]) for slot, n in ((0, 2), (1, 3))])
    with pytest.raises(KeyboardInterrupt):
        sweep.runner.run(stage(lambda slot: next(comps, None), lambda comp: None))
    assert sorted(r["slot"] for r in written) == ["s0", "s1"]


def test_records_that_wait_returned_stay_in_drain_until_the_driver_has_written_them():
    """A stop that comes after `wait` returned and before the driver wrote what it returned (Ctrl-C between
    the two) must not lose those records: `drain` still holds them until the driver says each is written."""
    release = threading.Event()

    def measure(flags, arm, position, context):
        release.wait(30)
        return {"status": "ok", "record_id": f"{context['slot']}-{position}", "position": position}

    pool = LocalPool([measure, measure])
    try:
        for slot in (0, 1):
            pool.submit(Job(slot, {}, "candidate", slot))
        release.set()
        returned = []
        while len(returned) < 2:
            returned += pool.wait()
        assert sorted(r["record_id"] for _, r in returned) == ["local-0-0", "local-1-1"]
        pool.written(returned[0][0])  # the driver wrote the first; Ctrl-C came before the second
        assert [r["record_id"] for r in pool.drain()] == [returned[1][1]["record_id"]]
        assert pool.drain() == []  # handed over once
    finally:
        pool.close()
        pool.join()


def test_after_a_write_that_failed_nothing_more_is_appended():
    """A full disk fails a write mid-batch: the stop's drain must not append after it (the failed write may
    have left a torn line, and a retry of the same record could land after it or twice)."""
    from throttle_sweep.stats.schedule import CANDIDATE

    attempts = []

    def write(record):
        attempts.append(record["slot"])
        raise OSError(28, "No space left on device")

    sweep = probe_driver(BothAtOnce({"status": "ok", "comparison": "late", "position": 0, "slot": "s9"}), [])
    sweep.runner._write = write  # noqa: SLF001 - the log's append
    comps = iter([sweep.runner.comparison(f"probe {n}", "probe", {}, 1, slot, arms={CANDIDATE: {"max_num_seqs": n}},
                                   order=[CANDIDATE]) for slot, n in ((0, 2), (1, 3))])
    with pytest.raises(OSError):
        sweep.runner.run(stage(lambda slot: next(comps, None), lambda comp: None))
    assert attempts == ["s0"]


def test_a_replicate_that_finishes_while_a_stopped_run_closes_its_slots_is_written(tmp_path, monkeypatch):
    """Ctrl-C: the run drains what is done, then closes the slots; a replicate may finish in between (its
    slot's thread was already waiting for it). The command writes it after closing, before it ends."""
    from throttle_sweep.store.records import SCHEMA_VERSION

    late = {"schema_version": SCHEMA_VERSION, "record_id": "late-1", "run_id": "stop", "arm": "baseline",
            "flags": {}, "position": 0, "status": "ok", "comparison": "c", "slot": "local-1"}
    cut = {**late, "record_id": "cut-1", "status": "failed", "infrastructure": True}

    class StoppedPool(BothAtOnce):
        finished: list = []

        def wait(self):
            raise KeyboardInterrupt

        def drain(self):
            done, self.finished = self.finished, []
            return done

    pool = StoppedPool()

    def make_pool(*args, **kwargs):
        return pool, lambda: pool.finished.extend([late, cut])  # closing: one finished, one was cut short

    monkeypatch.setattr(sweep_cmd, "make_pool", make_pool)
    cfg = compose_cfg("backend=fake", "+space=batching", "study.name=stop", "plots=false", tmp_path=tmp_path)
    assert sweep_cmd.run(cfg, Console(quiet=True)) == 130
    assert [r["record_id"] for r in read_records(tmp_path / "stop" / "replicates.jsonl")] == ["late-1"]
