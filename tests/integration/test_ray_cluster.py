"""Sweeps on real Ray clusters on this machine: a two-node cluster from ray.cluster_utils with logical GPUs,
a private local Ray started by the tool, and the faults a long sweep must survive."""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import os
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import optuna
import psutil
import pytest
from optuna.trial import TrialState
from rich.console import Console

from tests.helpers import compose_cfg
from throttle_sweep.cluster.ray_runtime import belongs_to
from throttle_sweep.commands import sweep as sweep_cmd
from throttle_sweep.stats.comparison import MAX_ATTEMPTS
from throttle_sweep.store.records import read_records
from throttle_sweep.sweep.trials import measured

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

# A fake engine that really sleeps: every replicate takes ~0.4 s of wall time, so slots truly overlap.
FAKE = ["backend=fake", "fake.realtime=true", "fake.start_s=0.3", "workload.num_requests=8",
        "workload.prompt_len=16", "workload.output_len=16", "workload.concurrency=8", "workload.warmup_requests=0",
        "engine.kv_cache_memory_bytes=131072", "engine.block_size=16", "+space=batching", "space.max_num_seqs.low=1",
        "space.max_num_seqs.high=8", "space.max_num_seqs.log=false", "~space.max_num_batched_tokens",
        "study.sampler=grid", "compare.replicates=2", "study.confirm_replicates=2", "study.confirm_top=2", "plots=false"]
# the fault tests aim at comparisons: without boundary probes first (their faults are tested on the fake)
NO_PROBES = "study.boundary=none"


@contextlib.contextmanager
def two_nodes():
    """Two nodes with two logical GPUs each, in their own temp dir; torn down afterwards."""
    from ray.cluster_utils import Cluster

    temp = tempfile.mkdtemp(prefix="ts-cl-", dir="/tmp")
    os.makedirs(f"{temp}/ray")
    old = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = temp  # ray_cluster_utils writes its address file under here, not /tmp/ray
    node = {"num_cpus": 2, "num_gpus": 2}
    c = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False, "temp_dir": f"{temp}/ray"})
    worker = c.add_node(**node)
    c.wait_for_nodes()
    c.worker, c.temp = worker, temp
    try:
        yield c
    finally:
        c.shutdown()
        if old is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = old


@pytest.fixture(scope="module")
def cluster():
    """One cluster for the module's tests that leave its nodes up (about 7 s of start-up each, saved): each
    sweep ends its own actors, and a killed actor or engine is the tool's to replace."""
    with two_nodes() as c:
        yield c


@pytest.fixture
def own_cluster():
    """A cluster of the test's own, for a test that removes a node."""
    with two_nodes() as c:
        yield c


def run_sweep(tmp_path, *overrides, name="r", console=None):
    cfg = compose_cfg(*FAKE, f"study.name={name}", *overrides, tmp_path=tmp_path)
    code = sweep_cmd.run(cfg, console or Console(quiet=True))
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path / name / 'study.db'}")
    return code, study, read_records(tmp_path / name / "replicates.jsonl")


def most_at_once(records) -> int:
    """The largest number of replicates whose [started_at, ended_at] intervals overlap."""
    events = []
    for r in records:
        events += [(dt.datetime.fromisoformat(r["started_at"]), 1), (dt.datetime.fromisoformat(r["ended_at"]), -1)]
    level = peak = 0
    for _, step in sorted(events, key=lambda e: (e[0], e[1])):
        level += step
        peak = max(peak, level)
    return peak


def kill_when(records_path: Path, count: int, pick, *, timeout: float = 120.0) -> threading.Thread:
    """In the background: once `count` records exist, run `pick()` (which does the killing)."""

    def watch():
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if records_path.exists() and len(records_path.read_text().splitlines()) >= count and pick():
                return
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def assert_complete_comparisons(study, records):
    """Every completed trial's comparison has each position measured once, all ok."""
    by_comparison = Counter(r["comparison"] for r in records if r["status"] == "ok")
    per_position = Counter((r["comparison"], r["position"]) for r in records if r["status"] == "ok")
    assert max(per_position.values()) == 1, "a replicate was measured twice"
    for t in study.trials:
        if t.state == TrialState.COMPLETE and measured(t):  # (not one told the baseline's answer, or a probe's)
            assert by_comparison[t.user_attrs["comparison"]] == 2 + 2  # the engine processes warm themselves, unrecorded


def test_two_node_cluster_runs_four_trials_at_once_and_agrees_with_one_slot(cluster, tmp_path):
    code, study, records = run_sweep(tmp_path, "study.n_trials=8", "ray.enabled=true",
                                     f"ray.address={cluster.address}", name="four")
    assert code == 0
    assert most_at_once(records) == 4
    places = {(r["placement"]["node_id"], tuple(r["placement"]["gpu_ids"])) for r in records}
    assert len({node for node, _ in places}) == 2 and {gpus for _, gpus in places} == {("0",), ("1",)}
    actors = {}
    for r in records:
        actors.setdefault(r["comparison"], set()).add(r["placement"]["actor_id"])
    assert all(len(actors[t.user_attrs["comparison"]]) == 1 for t in study.trials
               if t.state == TrialState.COMPLETE and measured(t)), \
        "a trial's baseline and candidate replicates must share one slot: one actor, one engine process"
    code, single, _ = run_sweep(tmp_path, "study.n_trials=8", name="one")
    assert code == 0
    assert study.user_attrs["winner"]["params"] == single.user_attrs["winner"]["params"]
    assert sorted(t.params["max_num_seqs"] for t in study.trials if t.state == TrialState.COMPLETE) == \
        sorted(t.params["max_num_seqs"] for t in single.trials if t.state == TrialState.COMPLETE)


def test_work_sized_by_time_is_calibrated_on_one_slot_and_every_slot_runs_the_sized_work(cluster, tmp_path):
    code, study, records = run_sweep(tmp_path, NO_PROBES, "study.n_trials=4", "ray.enabled=true",
                                     f"ray.address={cluster.address}", "workload.replicate_s=3", name="timed")
    assert code == 0
    [cal] = [r for r in records if r.get("stage") == "calibration"]
    assert cal["status"] == "ok" and cal["workload"]["num_requests"] == 8 and cal["placement"]["gpu_ids"]
    sized = max(8, math.ceil(8 * 3 / cal["wall_s"]))
    rest = [r for r in records if r.get("stage") != "calibration"]
    assert {r["workload"]["num_requests"] for r in rest} == {sized} and sized > 8
    assert len({r["placement"]["actor_id"] for r in rest}) == 4  # the sweep's own slots, after the calibration's
    assert_complete_comparisons(study, rest)


def test_actor_killed_mid_replicate_is_the_slots_loss_and_is_replaced(cluster, tmp_path):
    """The actor only hands replicates to its engine processes (its children), so its own death is never
    the flags' doing: the replicate is the slot's loss, the comparison is measured again, no trial fails."""
    victims = []

    def kill_a_measuring_actor():
        for p in psutil.process_iter(["pid", "cmdline"]):
            # Ray titles an actor's process with the task it runs: this one is inside measure() now; and it is
            # this cluster's (another Ray on the machine may run the same actors)
            if (p.info["cmdline"] or [""])[0].startswith("ray::SlotActor.measure") and belongs_to(p, cluster.temp):
                victims.append((p.info["pid"], dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")))
                p.kill()
                return True
        return False

    watcher = kill_when(tmp_path / "kill" / "replicates.jsonl", 3, kill_a_measuring_actor)
    code, study, records = run_sweep(tmp_path, NO_PROBES, "study.n_trials=8", "ray.enabled=true",
                                     f"ray.address={cluster.address}", name="kill")
    watcher.join(timeout=1)
    assert code == 0 and len(victims) == 1
    (victim, killed_at), = victims
    lost = [r for r in records if r["status"] == "failed"]
    assert len(lost) == 1 and "process died" in lost[0]["reason"] and lost[0]["placement"]["pid"] == victim
    assert "died mid-replicate" in lost[0]["reason"] and killed_at > lost[0]["started_at"]  # not "already dead"
    assert lost[0]["infrastructure"] is True  # whichever arm it was measuring
    assert not [t for t in study.trials if t.state == TrialState.FAIL]
    assert sum(t.state == TrialState.COMPLETE for t in study.trials) == 8
    assert any(lost[0]["comparison"] in t.user_attrs.get("discarded_comparisons", []) for t in study.trials)
    assert any(r["slot"] == lost[0]["slot"] and r["placement"]["pid"] != victim for r in records), \
        "the slot should have gone on with a new actor"
    assert_complete_comparisons(study, records)


def test_a_candidate_that_kills_its_engine_process_fails_only_its_own_trial(cluster, tmp_path):
    code, study, records = run_sweep(tmp_path, NO_PROBES, "study.n_trials=8", "ray.enabled=true",
                                     f"ray.address={cluster.address}", "+fake.exit_when.max_num_seqs=6", name="crash")
    assert code == 0
    failed = sorted(t.params["max_num_seqs"] for t in study.trials if t.state == TrialState.FAIL)
    assert failed == [7, 8]
    assert sorted(t.params["max_num_seqs"] for t in study.trials if t.state == TrialState.COMPLETE) == [1, 2, 3, 4, 5, 6]
    assert study.user_attrs["winner"]["params"]["max_num_seqs"] <= 6
    assert all(r["arm"] == "candidate" and "process died" in r["reason"] for r in records if r["status"] != "ok")


def test_a_hung_engine_is_ended_at_its_deadline_and_blamed_on_the_slot_not_the_candidate(cluster, tmp_path):
    """The deadline for flags not yet seen (ray.job_timeout_s) is long enough for the baseline's first run on a
    busy machine (8 s was not, beside another test worker's vLLM server) and short enough to end three hangs."""
    began = time.monotonic()
    code, study, records = run_sweep(tmp_path, NO_PROBES, "study.n_trials=4", "space.max_num_seqs.high=4",
                                     "ray.enabled=true", f"ray.address={cluster.address}", "+fake.hang_when.max_num_seqs=3",
                                     "ray.job_timeout_s=20", name="hang")
    assert code == 0 and time.monotonic() - began < 240
    hung = [r for r in records if r["status"] != "ok"]
    assert len(hung) == MAX_ATTEMPTS and all(r["infrastructure"] and "no answer" in r["reason"] for r in hung)
    [failed] = [t for t in study.trials if t.state == TrialState.FAIL]
    assert failed.params == {"max_num_seqs": 4} and failed.user_attrs["blame"] == "slot"
    assert failed.user_attrs["attempts_exhausted"]  # answered: those flags are not measured again
    assert sum(t.state == TrialState.COMPLETE for t in study.trials) == 3 and study.user_attrs["winner"]


def test_an_actor_that_died_idle_is_not_blamed_on_the_next_replicate(cluster, tmp_path):
    from throttle_sweep.cluster.pool import Job
    from throttle_sweep.cluster.ray_pool import make_ray_pool
    from throttle_sweep.settings.sweep import load_sweep

    cfg = compose_cfg(*FAKE, "ray.enabled=true", f"ray.address={cluster.address}", "ray.slots=1", tmp_path=tmp_path)
    run = load_sweep(cfg)
    pool, close = make_ray_pool(run.ray, run.engine, run.spec, run.price, engine_flags=run.measurement["engine"],
                                warm=run.warm, run_id="idle", out=tmp_path, say=lambda _: None)
    try:
        job = Job(0, {"max_num_seqs": 2, "max_model_len": 1024}, "candidate", 0, {"comparison": "c"})
        pool.submit(job)
        [(_, first)] = pool.wait()
        assert first["status"] == "ok"
        victim = psutil.Process(first["placement"]["pid"])
        victim.kill()  # idle: its replicate is done and the next is not handed over yet
        victim.wait(timeout=30)
        time.sleep(1)
        pool.submit(job)
        [(_, second)] = pool.wait()
        assert second["status"] == "failed" and second["infrastructure"] is True
        assert "already dead" in second["reason"]
        pool.submit(job)  # the slot goes on with a new actor
        [(_, third)] = pool.wait()
        assert third["status"] == "ok" and third["placement"]["pid"] != victim.pid
    finally:
        close()


def test_worker_node_killed_mid_sweep_loses_nothing_and_the_sweep_finishes(own_cluster, tmp_path):
    cluster = own_cluster
    worker_id = cluster.worker.node_id
    removed = []

    def remove_worker():
        cluster.remove_node(cluster.worker)
        removed.append(time.time())
        return True

    watcher = kill_when(tmp_path / "node" / "replicates.jsonl", 5, remove_worker)
    console = Console(record=True, width=200, file=open(os.devnull, "w"))  # noqa: SIM115
    code, study, records = run_sweep(tmp_path, NO_PROBES, "study.n_trials=8", "ray.enabled=true",
                                     f"ray.address={cluster.address}", name="node", console=console)
    watcher.join(timeout=1)
    assert code == 0 and removed
    lost = [r for r in records if r.get("infrastructure")]
    assert lost and all(r["placement"]["node_id"] == worker_id and "died" in r["reason"] for r in lost)
    assert not [t for t in study.trials if t.state == TrialState.FAIL and not t.user_attrs.get("interrupted")], \
        "a dead node is not the candidate's fault"
    measured = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert len(measured) == 8 and len({t.params["max_num_seqs"] for t in measured}) == 8
    noticed = max(r["ended_at"] for r in lost)  # the driver has replaced or retired the lost slots by now
    after = [r for r in records if r["started_at"] > noticed]
    assert after and all(r["placement"]["node_id"] != worker_id for r in after)
    assert "retired" in console.export_text()
    assert_complete_comparisons(study, records)


def test_a_tensor_parallel_slot_gives_its_engine_its_own_gpus_on_one_node(cluster, tmp_path):
    """tensor_parallel_size=2 on two nodes of two (logical) GPUs: two slots of two GPUs each; every engine
    process sees exactly its slot's GPUs (vLLM's multiprocess workers, its children, inherit them), on the
    slot's node, and no two slots share a GPU. Real GPUs and vLLM's own workers cannot be tested here."""
    code, study, records = run_sweep(tmp_path, NO_PROBES, "study.n_trials=2", "ray.enabled=true",
                                     f"ray.address={cluster.address}", "engine.tensor_parallel_size=2", name="tp")
    assert code == 0 and records
    held = {}
    for r in records:
        gpus = r["placement"]["gpu_ids"]
        assert len(gpus) == 2 and r["engine_lifetime"]["visible_devices"].split(",") == gpus, r["placement"]
        held.setdefault(r["slot"], set()).add((r["placement"]["node_id"], tuple(gpus)))
    assert len(held) == 2 and all(len(v) == 1 for v in held.values())  # a slot keeps its node and GPUs
    (a,), (b,) = held.values()
    assert a[0] != b[0] or not set(a[1]) & set(b[1])


def test_what_ray_slots_finished_but_the_driver_did_not_write_is_in_drain(cluster):
    """A sweep stopping mid-batch (Ctrl-C, a failed baseline) writes what `drain` gives: the records `wait`
    returned that the driver has not written yet, and those finished on other actors that `wait` had not
    collected, also when the pool was closed first. Before, a Ray pool had no drain: they were lost."""
    import ray

    from throttle_sweep.cluster.pool import Job
    from throttle_sweep.cluster.ray_pool import RayPool, SlotShape

    class QuickAndSlow:
        """A slot actor without an engine: slot 0 answers at once, slot 1 after a second."""

        def __init__(self, slot):
            self.slot = slot

        def where(self):
            import ray

            return {"slot": f"ray-{self.slot}", "node_id": ray.get_runtime_context().get_node_id(), "node_ip": "",
                    "host": "", "gpu_ids": [], "pid": os.getpid(), "actor_id": ""}

        def measure(self, flags, arm, position, context):
            time.sleep(self.slot * 1.0)
            return {"status": "ok", "record_id": f"ray-{self.slot}-{position}", "position": position}

    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    try:  # (a class defined here travels to the workers by value; the tests are not importable there)
        remote = ray.remote(num_cpus=0, max_restarts=0)(QuickAndSlow)
        pool = RayPool(make_actor=remote.remote, shape=SlotShape(2, 0.0, 0.0, "test"), header=lambda job, env: {})
        for slot in (0, 1):
            pool.submit(Job(slot, {}, "candidate", slot))
        first = pool.wait()
        assert [r["record_id"] for _, r in first] == ["ray-0-0"]
        time.sleep(3)  # slot 1 finishes; nobody waits for it
        assert sorted(r["record_id"] for r in pool.drain()) == ["ray-0-0", "ray-1-1"]
        assert pool.drain() == []
        pool.submit(Job(1, {}, "candidate", 2))
        time.sleep(3)  # it finishes while the run stops: closing the pool keeps it for the drain after
        pool.close()
        assert [r["record_id"] for r in pool.drain()] == ["ray-1-2"]
    finally:
        ray.shutdown()
