"""Warm engines (cluster/slot.py, cluster/host.py) on the fake engine: each engine lives in its own process and stays
up across its flags' replicates; the restart policy ends lifetimes when asked; an engine process that dies
fails its replicate and is replaced; no engine process outlives the driver, however the driver ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest

from tests.helpers import compose_cfg, default_sigint
from throttle_sweep.cluster.slot import WarmSlot
from throttle_sweep.engines import FakeEngine, FakeKnobs
from throttle_sweep.errors import ConfigError
from throttle_sweep.measurement.cost import Price
from throttle_sweep.measurement.workload import WorkloadSpec

SPEC = WorkloadSpec(num_requests=8, prompt_len=16, output_len=16, concurrency=8, warmup_requests=0)
B, C = {"max_num_seqs": 1}, {"max_num_seqs": 4}


def slot(knobs: FakeKnobs | None = None, **policy) -> WarmSlot:
    """A slot that keeps its engines up (restart=never) unless told otherwise."""
    policy.setdefault("restart", "never")
    return WarmSlot(FakeEngine(knobs or FakeKnobs()), SPEC, Price(), run_id="t", environment={}, **policy)


def lifetimes(records):
    return [(r["arm"], r["engine_lifetime"]["id"], r["engine_lifetime"]["replicate"]) for r in records]


def run(s: WarmSlot, order: str) -> list[dict]:
    try:
        return [s.measure(B if a == "B" else C, "baseline" if a == "B" else "candidate", i, {})
                for i, a in enumerate(order)]
    finally:
        s.close()


def test_each_arm_keeps_one_engine_alive_across_its_replicates():
    records = run(slot(), "BCCBCBBC")
    assert all(r["status"] == "ok" for r in records)
    ids = {arm: {life for a, life, _ in lifetimes(records) if a == arm} for arm in ("baseline", "candidate")}
    assert len(ids["baseline"]) == 1 and len(ids["candidate"]) == 1 and ids["baseline"] != ids["candidate"]
    assert [r["engine_lifetime"]["replicate"] for r in records if r["arm"] == "candidate"] == [0, 1, 2, 3]
    pids = {r["engine_lifetime"]["pid"] for r in records}
    assert len(pids) == 2 and os.getpid() not in pids  # two engine processes, neither of them this one
    started = [r for r in records if r["engine_start_s"] > 0]
    assert [r["position"] for r in started] == [0, 1] and all(r["engine_warmup_s"] > 0 for r in started)
    assert all(not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE for pid in pids)


def test_the_two_arms_of_an_aa_comparison_run_on_two_engines():
    s = slot()
    try:
        records = [s.measure(B, arm, i, {}) for i, arm in enumerate(["baseline", "candidate"] * 2)]
    finally:
        s.close()
    ids = {arm: {r["engine_lifetime"]["id"] for r in records if r["arm"] == arm} for arm in ("baseline", "candidate")}
    assert len(ids["baseline"]) == len(ids["candidate"]) == 1 and ids["baseline"] != ids["candidate"]


def test_a_warm_engine_skips_the_warm_up_requests_a_cold_one_needs():
    spec = WorkloadSpec(num_requests=8, prompt_len=16, output_len=16, concurrency=8)  # one batch of warm-up requests
    s = WarmSlot(FakeEngine(FakeKnobs()), spec, Price(), run_id="t", environment={}, engine_warmup="none",
                 restart="never")
    try:
        records = [s.measure(B, "baseline", i, {"stage": "probe" if i == 0 else "search"}) for i in range(3)]
    finally:
        s.close()
    # a cold engine gets one full batch of its own (B runs max_num_seqs at once), a warm one none
    assert [r["warmup_requests"] for r in records] == [min(8, B["max_num_seqs"]), 0, 0]
    assert "engine_warmup_s" not in records[0]


def test_a_probe_needs_no_warm_engine_and_warms_one_for_the_comparison_after_it():
    s = slot()
    try:
        records = [s.measure(C, "candidate", i, {"stage": stage}) for i, stage in enumerate(["probe", "search"])]
    finally:
        s.close()
    assert "engine_warmup_s" not in records[0] and records[0]["engine_start_s"] > 0
    assert records[1]["engine_lifetime"]["id"] == records[0]["engine_lifetime"]["id"]
    assert records[1]["engine_start_s"] == 0 and records[1]["warmup_requests"] == 0


def test_on_a_gpu_the_idle_engine_sleeps_so_that_two_fit(tmp_path):
    """The fake's pretend GPU holds one awake engine: a slot keeping two must put the idle one to sleep and
    wake it for its next replicate; without sleeping, the second engine cannot even start."""
    knobs = FakeKnobs(gpu_dir=str(tmp_path))
    s = slot(knobs)
    s.environment = None  # read from the engine process: it says it is on a (pretend) GPU
    records = run(s, "BCCBCBBC")
    assert all(r["status"] == "ok" for r in records), [r.get("reason") for r in records]
    assert all(r["engine_flags"]["enable_sleep_mode"] is True and "enable_sleep_mode" not in r["flags"] for r in records)
    woke = [r["position"] for r in records if "engine_wake_s" in r]
    # every switch back to an engine that had slept; at 3 the baseline starts again (pinned), since the
    # candidate's first start at 1 had the GPU to itself (the next test)
    assert woke == [4, 5, 7]
    assert len({r["engine_lifetime"]["id"] for r in records}) == 3 and not list(tmp_path.iterdir())

    s = slot(knobs, restart="per_replicate")  # one engine at a time: nothing sleeps, no sleep mode is measured
    s.environment = None
    records = run(s, "BCCB")
    assert all(r["status"] == "ok" and "enable_sleep_mode" not in r["engine_flags"] for r in records)

    s = slot(knobs)
    s.environment = {"device": "fake"}  # a slot that does not know it is on a GPU
    records = run(s, "BC")
    assert records[0]["status"] == "ok" and records[1]["status"] == "failed"
    assert "fake GPU out of memory" in records[1]["reason"]


def test_on_a_gpu_every_start_of_the_same_flags_gets_the_kv_capacity_it_had_alone(tmp_path):
    """An engine asleep still holds some GPU memory (its CUDA context, graph pools), which a new engine's
    memory profile counts against its KV cache: beside a sleeping engine an arm would get less KV than alone,
    and preempt where alone it would not. A slot starts each set of flags alone once (the other engines are
    shut down for it), pins the KV capacity it got, and starts them with that pin beside sleeping engines."""
    knobs = FakeKnobs(gpu_dir=str(tmp_path), asleep_holds_bytes=16 << 20)
    s = slot(knobs)
    s.environment = None  # read from the engine process: a (pretend) GPU
    records = run(s, "BCCBCBBC")
    assert all(r["status"] == "ok" for r in records), [r.get("reason") for r in records]
    alone = (64 << 20) // (1024 * 128)  # the fake's GPU, alone: 512 blocks of 128 tokens
    assert {r["kv_cache"]["blocks"] for r in records} == {alone}
    started = [r for r in records if r["engine_start_s"] > 0]
    assert [(r["position"], r["kv_pin"]["solo"]) for r in started] == [(0, True), (1, True), (3, False)]
    assert started[2]["engine_flags"]["num_gpu_blocks_override"] == alone  # the record says how it was sized
    assert "num_gpu_blocks_override" not in started[2]["flags"]


def test_flags_that_size_the_kv_cache_themselves_need_no_solo_start(tmp_path):
    knobs = FakeKnobs(gpu_dir=str(tmp_path), asleep_holds_bytes=16 << 20)
    s = slot(knobs)
    s.environment = None
    sized = {"kv_cache_memory_bytes": 8 << 20}
    try:
        records = [s.measure({**B, **sized} if a == "B" else {**C, **sized}, "baseline" if a == "B" else "candidate",
                             i, {}) for i, a in enumerate("BCBC")]
    finally:
        s.close()
    assert all(r["status"] == "ok" and "kv_pin" not in r for r in records)
    assert len({r["engine_lifetime"]["id"] for r in records}) == 2  # nothing was shut down to start alone


@pytest.mark.parametrize(("policy", "per_arm"), [({"restart": "per_replicate"}, 4),
                                                   ({"restart": "every_k", "restart_every": 2}, 2)])
def test_the_restart_policy_ends_lifetimes(policy, per_arm):
    records = run(slot(**policy), "BCCBCBBC")
    by_arm = Counter(a for a, _, _ in set(lifetimes(records)) if _ == 0)
    assert by_arm == {"baseline": per_arm, "candidate": per_arm}
    assert sum(1 for r in records if r["engine_start_s"] > 0) == 2 * per_arm


def test_the_baseline_engine_stays_warm_while_candidates_come_and_go():
    s = slot()
    try:
        flags = [B, {"max_num_seqs": 2}, B, {"max_num_seqs": 3}, B, {"max_num_seqs": 2}, B]
        records = [s.measure(f, "x", i, {}) for i, f in enumerate(flags)]
    finally:
        s.close()
    base = {r["engine_lifetime"]["id"] for r in records if r["flags"] == B}
    assert len(base) == 1  # the least recently used engine makes way, never the baseline's
    assert len({r["engine_lifetime"]["id"] for r in records}) == 4  # 2, 3, then 2 again: new lifetimes


def test_drift_follows_the_slot_not_the_engine():
    """The fake's machine drift grows with the slot's replicate count, restarts or not: warm engines must not
    make a drifting machine look steady."""
    knobs = FakeKnobs(drift_per_start=0.05)
    warm, cold = run(slot(knobs), "BBBB"), run(slot(knobs, restart="per_replicate"), "BBBB")
    for records in (warm, cold):
        walls = [r["wall_s"] for r in records]
        assert walls == sorted(walls) and walls[-1] / walls[0] == pytest.approx(1.15, rel=0.01)


@pytest.mark.parametrize(("policy", "most"), [("never", None), ("per_replicate", 5)])
def test_aa_false_verdicts_by_restart_policy_when_engines_differ(policy, most):
    """Each engine instance runs 3% faster or slower than another (sd of log time), on 1% noise: with one
    engine per arm (restart=never) the interval sees only the 1%, and A/A comparisons claim differences that
    are the engines'; with a new engine per replicate the engines' spread is part of the noise, and a false
    verdict either way stays near alpha (5 of 40 would be a 1-in-100 event)."""
    from throttle_sweep.stats.analysis import analyse
    from throttle_sweep.stats.schedule import make_schedule
    from throttle_sweep.stats.verdict import CHEAPER, PRICIER, Thresholds

    s = slot(FakeKnobs(noise_sd=0.01, lifetime_sd=0.03), restart=policy, engine_warmup="none")
    false = 0
    try:
        for c in range(40):
            arms = {"baseline": B, "candidate": {**B, "seed": c + 1}}  # the same engine flags, a new candidate engine
            order = make_schedule("abba", 4, seed=c, lead="baseline" if c % 2 else "candidate")
            records = [s.measure(arms[arm], arm, i, {}) for i, arm in enumerate(order)]
            # no margin: a false verdict is the interval's miss (a 3% engine spread hides inside the 2% margin)
            false += analyse(records, Thresholds(equivalence_margin=0.0), cost="steady").verdict in (CHEAPER, PRICIER)
    finally:
        s.close()
    if most is None:
        assert false > 10, false  # the engines' differences pass for the flags'
    else:
        assert false <= most, false


def test_an_engine_process_that_dies_fails_its_replicate_and_is_replaced():
    s = slot(FakeKnobs(exit_when={"max_num_seqs": 3}))
    try:
        records = [s.measure(f, "x", i, {}) for i, f in enumerate([B, {"max_num_seqs": 4}, B, {"max_num_seqs": 2}])]
    finally:
        s.close()
    assert [r["status"] for r in records] == ["ok", "failed", "ok", "ok"]
    assert "process died mid-replicate" in records[1]["reason"] and "exit code 70" in records[1]["reason"]
    assert records[2]["engine_lifetime"]["id"] == records[0]["engine_lifetime"]["id"]  # the baseline lived on


def test_an_unknown_restart_policy_is_refused_before_anything_starts(tmp_path):
    from throttle_sweep.commands import compare

    cfg = compose_cfg("mode=compare", "backend=fake", "compare.restart=sometimes", tmp_path=tmp_path)
    with pytest.raises(ConfigError, match="compare.restart must be one of never, per_replicate, every_k"):
        compare.run(cfg, console=None)
    cfg = compose_cfg("mode=compare", "backend=fake", "compare.restart=every_k", tmp_path=tmp_path)
    with pytest.raises(ConfigError, match="restart_every"):
        compare.run(cfg, console=None)
    assert not list(tmp_path.iterdir())


def engine_children(pid: int) -> list[psutil.Process]:
    try:
        return [p for p in psutil.Process(pid).children(recursive=True) if "spawn_main" in " ".join(p.cmdline())]
    except psutil.NoSuchProcess:
        return []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_no_engine_process_outlives_the_driver(tmp_path: Path, sig):
    driver = subprocess.Popen(
        [sys.executable, "-m", "throttle_sweep", "mode=compare", "backend=fake", "fake.realtime=true",
         "fake.start_s=0.1", "workload.num_requests=8", "workload.concurrency=8", "compare.replicates=8", "compare.restart=never",
         f"results_dir={tmp_path}"],  # two engine processes, kept up
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=default_sigint)
    try:
        deadline = time.monotonic() + 120
        while len(engines := engine_children(driver.pid)) < 2 or not list(tmp_path.glob("*/replicates.jsonl")):
            assert driver.poll() is None and time.monotonic() < deadline, driver.stdout.read()
            time.sleep(0.2)
        pids = [p.pid for p in engines]
        driver.send_signal(sig)
        driver.wait(60)
        deadline = time.monotonic() + 10
        while (left := [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]) \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not left, f"engine processes {left} outlived a driver ended by {sig.name}"
        records = [json.loads(line) for path in tmp_path.glob("*/replicates.jsonl") for line in path.open()]
        assert records and all(r["status"] == "ok" for r in records)  # what was measured is kept
        assert len(records) < 16, "the comparison ended before the signal: nothing was tested"
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()


def test_an_engine_that_cannot_begin_a_replicate_fails_it_without_ending_the_engine_process(monkeypatch):
    """A warm server that died while idle cannot reset its prefix cache: the replicate fails as the slot's
    loss (it was up from an earlier replicate), the engine is ended, and the process goes on serving."""
    from throttle_sweep.cluster.host import Task, run_task
    from throttle_sweep.engines import fake

    spec = WorkloadSpec(num_requests=4, prompt_len=8, output_len=8, concurrency=4, warmup_requests=0)
    engine, flags = FakeEngine(FakeKnobs()), {"max_num_seqs": 4, "kv_cache_memory_bytes": 1 << 20}
    calls = []

    def begin(self, index):
        calls.append(index)
        if len(calls) == 2:
            raise ConnectionError("the server is gone")

    monkeypatch.setattr(fake.FakeSession, "begin_replicate", begin)
    first, second, third = ({} for _ in range(3))
    life = run_task(engine, spec, Price(), Task(flags, first, 0, "none", arm="baseline"), None)
    assert first["status"] == "ok" and life is not None
    life = run_task(engine, spec, Price(), Task(flags, second, 1, "none", arm="baseline"), life)
    assert life is None and second["status"] == "failed" and second["infrastructure"] is True
    assert second["failed_at"] == "start" and "ConnectionError: the server is gone" in second["reason"]
    life = run_task(engine, spec, Price(), Task(flags, third, 2, "none", arm="baseline"), life)
    assert third["status"] == "ok" and third["engine_start_s"] > 0  # a new engine


class UnloadableEngine(FakeEngine):
    """An engine whose code cannot be imported in its process, and whose environment only that process may
    read (vLLM's: importing it in the driver takes about 15 s, and a GB of memory)."""

    def preload(self) -> None:
        raise ImportError("libcuda.so.1: cannot open shared object file")

    def environment(self) -> dict:
        raise AssertionError("the driver read the engine's environment itself")


def test_an_engine_process_that_cannot_load_fails_the_replicate_without_the_driver_loading_the_engine():
    s = WarmSlot(UnloadableEngine(FakeKnobs()), SPEC, Price(), run_id="t", restart="never")
    try:
        record = s.measure(B, "baseline", 0, {})
    finally:
        s.close()
    assert record["status"] == "failed" and record["infrastructure"] is True
    assert "libcuda.so.1" in record["reason"] and record["environment"] == {"engine": "fake"}


def test_a_pinned_start_that_does_not_fit_beside_sleeping_engines_runs_alone_instead(tmp_path):
    """The pin asks for the KV an engine got alone; beside engines asleep (which still hold some memory) it may
    not fit. That is the GPU's doing, not the flags': the start is made again with the GPU to itself."""
    knobs = FakeKnobs(gpu_dir=str(tmp_path), asleep_holds_bytes=16 << 20, gpu_headroom_bytes=8 << 20)
    s = slot(knobs)
    s.environment = None
    records = run(s, "BCBC")
    assert all(r["status"] == "ok" for r in records), [r.get("reason") for r in records]
    third, fourth = records[2], records[3]
    assert third["kv_pin"]["solo"] is True and "out of memory" in third["kv_pin"]["refused_beside_sleepers"]
    assert third["kv_pin"]["flags"] == {"num_gpu_blocks_override": records[0]["kv_cache"]["blocks"]}
    assert third["kv_cache"]["blocks"] == records[0]["kv_cache"]["blocks"]
    # the slot has learnt: the next pinned start goes alone at once, without a failed start first
    assert fourth["kv_pin"]["solo"] is True and "refused_beside_sleepers" not in fourth["kv_pin"]
    assert fourth["kv_cache"]["blocks"] == records[1]["kv_cache"]["blocks"]


def test_an_engine_that_cannot_sleep_is_shut_down_and_its_arm_starts_again_pinned(tmp_path):
    """The engine process shuts an engine that cannot sleep down; the slot must know it is gone, or the arm's
    next replicate would count on a live engine and start an unpinned one beside a sleeper."""
    knobs = FakeKnobs(gpu_dir=str(tmp_path), asleep_holds_bytes=16 << 20, sleep_fails_when={"max_num_seqs": 2})
    s = slot(knobs)
    s.environment = None
    records = run(s, "BCBC")  # at 2 the candidate cannot sleep and is shut down; at 3 it starts again
    assert all(r["status"] == "ok" for r in records), [r.get("reason") for r in records]
    assert records[3]["engine_start_s"] > 0 and records[3]["kv_pin"] == {"solo": False, "flags": records[3][
        "engine_lifetime"]["kv_pin"]}
    assert records[3]["kv_cache"]["blocks"] == records[1]["kv_cache"]["blocks"]


def test_a_start_vllm_refuses_for_memory_beside_sleeping_engines_runs_alone_instead(tmp_path):
    """vLLM starts only when free memory >= gpu_memory_utilization x total, whatever sizes the KV cache, and an
    engine asleep keeps its context and graph pools: beside sleepers a start can be refused for memory. That is
    the GPU's doing, not the flags': made again alone, and on this slot alone from then on."""
    knobs = FakeKnobs(gpu_dir=str(tmp_path), gpu_total_bytes=1 << 30, asleep_holds_bytes=200 << 20)
    sized = {"kv_cache_memory_bytes": 1 << 20}  # the flags size the KV cache: no pin, no solo start to find one
    s = WarmSlot(FakeEngine(knobs), SPEC, Price(), run_id="t", environment=None, restart="never")
    try:
        records = [s.measure({**flags, **sized}, arm, i, {})
                   for i, (flags, arm) in enumerate([(B, "baseline"), (C, "candidate"), (B, "baseline")])]
    finally:
        s.close()
    assert [r["status"] for r in records] == ["ok"] * 3, [r.get("reason") for r in records]
    second, third = records[1], records[2]
    assert second["kv_pin"]["solo"] is True and "Free memory on device" in second["kv_pin"]["refused_beside_sleepers"]
    assert third["kv_pin"]["solo"] is True and "refused_beside_sleepers" not in third["kv_pin"]  # learnt


def test_a_start_refused_for_memory_the_slot_does_not_hold_is_the_slots_failure_not_the_flags(tmp_path):
    """Memory held by something outside the slot (another process on the GPU): the start fails alone too, and
    the record blames the infrastructure, so the comparison is run again rather than the candidate failed."""
    knobs = FakeKnobs(gpu_dir=str(tmp_path), gpu_total_bytes=1 << 30)
    (tmp_path / f"foreign-{300 << 20}").touch()  # 300 MiB held by a process outside the tool
    s = WarmSlot(FakeEngine(knobs), SPEC, Price(), run_id="t", environment=None, restart="never")
    try:
        record = s.measure(C, "candidate", 0, {})
    finally:
        s.close()
    assert record["status"] == "failed" and record["failed_at"] == "start"
    assert "Free memory on device" in record["reason"] and record["infrastructure"] is True


def test_a_start_refused_for_memory_beside_sleepers_and_again_alone_is_the_slots_failure(tmp_path):
    knobs = FakeKnobs(gpu_dir=str(tmp_path), gpu_total_bytes=1 << 30, asleep_holds_bytes=200 << 20)
    sized = {"kv_cache_memory_bytes": 1 << 20}
    s = WarmSlot(FakeEngine(knobs), SPEC, Price(), run_id="t", environment=None, restart="never")
    try:
        first = s.measure({**B, **sized}, "baseline", 0, {})
        (tmp_path / f"foreign-{300 << 20}").touch()  # meanwhile a process outside the tool takes memory
        second = s.measure({**C, **sized}, "candidate", 1, {})
    finally:
        s.close()
    assert first["status"] == "ok" and second["status"] == "failed", second.get("reason")
    assert second["kv_pin"]["solo"] is True and "refused_beside_sleepers" in second["kv_pin"]
    assert second["infrastructure"] is True and "Free memory on device" in second["reason"]
