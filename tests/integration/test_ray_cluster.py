"""Sweeps on real Ray clusters on this machine: a two-node cluster from ray.cluster_utils with logical GPUs,
a private local Ray started by the tool, and the faults a long sweep must survive."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import os
import secrets
import signal
import subprocess
import sys
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
from throttle_sweep.commands import sweep as sweep_cmd
from throttle_sweep.compare import MAX_ATTEMPTS
from throttle_sweep.ray_runtime import belongs_to
from throttle_sweep.records import read_records
from throttle_sweep.search.trials import measured

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


@pytest.fixture
def cluster():
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
    from throttle_sweep.cluster import make_ray_pool
    from throttle_sweep.pool import Job
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


def test_worker_node_killed_mid_sweep_loses_nothing_and_the_sweep_finishes(cluster, tmp_path):
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


def driver(tmp_path: Path, name: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "throttle_sweep", *FAKE, f"study.name={name}", f"results_dir={tmp_path}",
            "study.n_trials=6", "ray.enabled=true", "ray.cpu_slots=2", NO_PROBES, *extra]


def wait_for_records(path: Path, count: int, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if path.exists() and len(path.read_text().splitlines()) >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"the driver did not write {count} records (exit code {proc.poll()})")


def wait_gone(pids, timeout: float) -> set[int]:
    deadline = time.monotonic() + timeout
    alive = set(pids)
    while alive and time.monotonic() < deadline:
        alive = {p for p in alive if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE}
        time.sleep(0.2)
    return alive


def assert_private_ray_is_locked_down(driver_pid: int, temp_dir: str) -> None:
    """Every socket the driver's private Ray listens on is on loopback, and it demands a token that lives in
    its own temp dir (mode 0600), whatever RAY_AUTH_MODE the user's environment had."""
    tree = {driver_pid} | {p.pid for p in psutil.Process(driver_pid).children(recursive=True)}
    listening = [c for c in psutil.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN and c.pid in tree]
    assert len(listening) >= 5, listening  # GCS, raylet (2), workers, agents: there is something to check
    exposed = [(c.pid, c.laddr) for c in listening if c.laddr.ip not in ("127.0.0.1", "::ffff:127.0.0.1", "::1")]
    assert not exposed, f"private Ray listening beyond loopback: {exposed}"
    token = Path(temp_dir) / "auth_token"
    assert token.stat().st_mode & 0o777 == 0o600 and len(token.read_text()) == 64
    raylet = next(p for p in psutil.process_iter(["pid", "cmdline"]) if p.info["pid"] in tree
                  and "raylet" in " ".join(p.info["cmdline"] or []))
    assert raylet.environ().get("RAY_AUTH_MODE") == "token"


def default_sigint() -> None:
    """A shell without job control starts background jobs with SIGINT ignored, and Python keeps it ignored:
    give the driver the default, as a terminal would."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_driver_stopped_by_signal_stops_cleanly_and_resumes(tmp_path, sig):
    records_path = tmp_path / "sig" / "replicates.jsonl"
    proc = subprocess.Popen(driver(tmp_path, "sig"), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, preexec_fn=default_sigint)
    wait_for_records(records_path, 5, proc)
    tree = {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
    proc.send_signal(sig)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, output
    assert "Run the same command again to resume" in output
    assert not wait_gone(tree, 60), "the driver left Ray or engine processes running"
    study = optuna.load_study(study_name="sig", storage=f"sqlite:///{tmp_path / 'sig' / 'study.db'}")
    in_flight = [t.number for t in study.trials if t.state == TrialState.RUNNING]  # left for the next run
    assert not [t for t in study.trials if t.state == TrialState.FAIL], "a stop is nobody's failure"
    before = read_records(records_path)
    subprocess.run(driver(tmp_path, "sig"), cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    after = read_records(records_path)
    assert after[: len(before)] == before
    study = optuna.load_study(study_name="sig", storage=f"sqlite:///{tmp_path / 'sig' / 'study.db'}")
    assert sum(t.state == TrialState.COMPLETE for t in study.trials) == 6
    assert all(study.trials[n].state == TrialState.COMPLETE for n in in_flight), "taken over and finished"
    assert not [t for t in study.trials if t.state in (TrialState.RUNNING, TrialState.WAITING, TrialState.FAIL)]
    assert_complete_comparisons(study, after)


def test_driver_sigkilled_leaves_no_engines_and_resumes_without_repeats(tmp_path):
    records_path = tmp_path / "k9" / "replicates.jsonl"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}  # the private Ray must demand a token all the same
    proc = subprocess.Popen(driver(tmp_path, "k9"), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=env)
    wait_for_records(records_path, 5, proc)
    tree = {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
    leftovers = json.loads((tmp_path / "k9" / "ray-local.json").read_text())
    assert_private_ray_is_locked_down(proc.pid, leftovers["temp_dir"])
    proc.kill()
    proc.wait()
    engines = {r["placement"]["pid"] for r in read_records(records_path)}
    assert not wait_gone(engines, 30), "engine actors outlived their driver"
    before = read_records(records_path)
    subprocess.run(driver(tmp_path, "k9"), cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    assert not wait_gone(tree | {p["pid"] for p in leftovers["processes"]}, 30), "processes of the killed run remain"
    after = read_records(records_path)
    assert after[: len(before)] == before
    study = optuna.load_study(study_name="k9", storage=f"sqlite:///{tmp_path / 'k9' / 'study.db'}")
    assert sum(t.state == TrialState.COMPLETE for t in study.trials) == 6
    assert_complete_comparisons(study, after)
    assert not (tmp_path / "k9" / "ray-local.json").exists()


@pytest.mark.quiet  # beside other engines it once confirmed no winner
def test_real_vllm_sweep_on_two_ray_slots(tmp_path):
    cfg = compose_cfg("+space=batching", "study.name=rv", "study.n_trials=2", "study.sampler=grid",
                      "space.max_num_seqs.low=1", "space.max_num_seqs.high=8", "+space.max_num_seqs.step=7",
                      "space.max_num_seqs.log=false", "~space.max_num_batched_tokens", "compare.replicates=2",
                      "study.confirm_top=1", "study.confirm_replicates=4", "workload.num_requests=16",
                      "workload.output_len=32", "workload.prompt_len=32", "workload.concurrency=16",
                      "workload.warmup_requests=2", "ray.enabled=true", "ray.cpu_slots=2", "plots=false",
                      tmp_path=tmp_path)
    assert sweep_cmd.run(cfg, Console(quiet=True)) == 0
    study = optuna.load_study(study_name="rv", storage=f"sqlite:///{tmp_path / 'rv' / 'study.db'}")
    records = read_records(tmp_path / "rv" / "replicates.jsonl")
    assert all(r["status"] == "ok" and r["environment"]["engine"] == "vllm" for r in records)
    assert {r["slot"] for r in records} == {"ray-0", "ray-1"}
    assert most_at_once(records) == 2
    assert study.user_attrs["winner"]["params"] == {"max_num_seqs": 8}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def end_ray_started_in(temp: str) -> None:
    """`ray stop` would end every Ray on the machine; end only the one whose processes name this temp dir."""
    roots = [p for p in psutil.process_iter(["cmdline"])
             if temp in " ".join(p.info["cmdline"] or []) and p.pid != os.getpid()]
    procs = {p.pid: p for root in roots for p in [root, *root.children(recursive=True)]}
    for p in procs.values():
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(list(procs.values()), timeout=30)


def test_ray_job_submit_runs_a_sweep_on_a_running_cluster(tmp_path):
    temp = tempfile.mkdtemp(prefix="ts-job-", dir="/tmp")
    port, dash = free_port(), free_port()
    # token authentication with a token of our own (a fresh machine has no ~/.ray/auth_token): the head, the
    # job CLI and the job's driver all read it from this file
    token = Path(temp) / "auth_token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    ray_cli = str(Path(sys.executable).parent / "ray")
    subprocess.run([ray_cli, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=2",
                    "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}",
                    # the job server is the agent's HTTP port: its default (52365) is fixed, and another Ray on
                    # this machine (a second test worker's) may hold it
                    f"--dashboard-agent-listen-port={free_port()}", f"--temp-dir={temp}", "--disable-usage-stats"], check=True, env=env, capture_output=True,
                   timeout=120)
    try:
        job = subprocess.run([ray_cli, "job", "submit", f"--address=http://127.0.0.1:{dash}", "--", sys.executable,
                              "-m", "throttle_sweep", *FAKE, "study.name=job", f"results_dir={tmp_path}",
                              "study.n_trials=4", "ray.enabled=true", "ray.cpu_slots=2"],
                             env=env, cwd=ROOT, capture_output=True, text=True,
                             timeout=600)
        assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
        assert "ray: joined the cluster" in job.stdout and "succeeded" in job.stdout + job.stderr
    finally:
        end_ray_started_in(temp)
    study = optuna.load_study(study_name="job", storage=f"sqlite:///{tmp_path / 'job' / 'study.db'}")
    assert sum(t.state == TrialState.COMPLETE for t in study.trials) == 4 and "winner" in study.user_attrs
    records = read_records(tmp_path / "job" / "replicates.jsonl")
    assert {r["slot"] for r in records} == {"ray-0", "ray-1"}
    # two CPU slots on one node share its cores: confirmations run alone there, as local slots' do
    confirm = [r for r in records if r["stage"] == "confirm"]
    assert confirm and {r["slots"] for r in confirm} == {1} and most_at_once(confirm) == 1


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

    from throttle_sweep.cluster import RayPool, SlotShape
    from throttle_sweep.pool import Job

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
