"""Several slots on one machine (`slots`): the engines of a CPU build use one core each, so a sweep runs one
comparison per core, side by side. The driver stays the one writer; each comparison keeps to one slot."""

from __future__ import annotations

import datetime as dt
import threading
from collections import defaultdict

import optuna
import pytest
from rich.console import Console

from tests.helpers import compose_cfg
from throttle_sweep.commands import sweep as sweep_cmd
from throttle_sweep.engines.host import EngineHost
from throttle_sweep.errors import ConfigError
from throttle_sweep.pool import Job, LocalPool, local_slots
from throttle_sweep.records import read_records


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
    monkeypatch.setattr(EngineHost, "__init__", lambda *a, **k: pytest.fail("an engine process started"))
    monkeypatch.setattr("throttle_sweep.engines.vllm_inproc.cpu_build", lambda: False)  # as on a GPU machine
    cfg = compose_cfg("backend=fake", "+space=batching", *overrides, tmp_path=tmp_path)
    with pytest.raises(ConfigError, match=message):
        sweep_cmd.run(cfg, Console(quiet=True))


def test_an_endpoint_is_one_slot(tmp_path):
    with pytest.raises(ConfigError, match=r"slots=2: backend=endpoint measures your servers"):
        local_slots(2, backend="endpoint", cpu_engine=False)


def test_a_sweep_on_two_slots_keeps_each_comparison_on_one_slot_and_both_busy(tmp_path):
    """The fake engine, in engine processes, on two local slots: both slots measure, every comparison's
    replicates share one slot, the two slots' work overlaps in time, and the answer is the one slot's."""
    def sweep(name, *extra):
        cfg = compose_cfg("backend=fake", "+space=batching", "~space.max_num_batched_tokens",
                          "space.max_num_seqs.low=1", "space.max_num_seqs.high=12", "space.max_num_seqs.log=false",
                          "workload.num_requests=16", "workload.concurrency=16", "workload.output_len=32",
                          "engine.kv_cache_memory_bytes=524288", "engine.block_size=16", "compare.replicates=2",
                          "study.confirm_replicates=2", "study.n_trials=4", "fake.noise_sd=0.01",
                          f"study.name={name}", *extra, tmp_path=tmp_path)
        assert sweep_cmd.run(cfg, Console(quiet=True)) == 0
        study = optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path / name / 'study.db'}")
        return study, read_records(tmp_path / name / "replicates.jsonl")

    study, records = sweep("two", "slots=2")
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
    _, one_slot = sweep("one", "slots=1")
    assert {r["slot"] for r in one_slot} == {"local-0"}
    assert study.user_attrs["boundaries"] == optuna.load_study(
        study_name="one", storage=f"sqlite:///{tmp_path / 'one' / 'study.db'}").user_attrs["boundaries"]
