"""The sweep's driver as a real process on Ray: stopped by a signal, killed, submitted as a Ray job to a running
cluster, and a real vLLM sweep on two Ray slots (a file of its own, so that the test workers share the Ray
tests between them)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
import psutil
import pytest
from optuna.trial import TrialState
from rich.console import Console

from tests.helpers import compose_cfg, default_sigint
from tests.integration.test_ray_cluster import FAKE, NO_PROBES, ROOT, assert_complete_comparisons, most_at_once
from throttle_sweep.commands import sweep as sweep_cmd
from throttle_sweep.store.records import read_records
from throttle_sweep.sweep.trials import measured

pytestmark = pytest.mark.integration


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
    # two trials, neither the baseline's own flags (max_num_seqs=1 is told the baseline's answer, not measured)
    cfg = compose_cfg("+space=batching", "study.name=rv", "study.n_trials=2", "study.sampler=grid",
                      "space.max_num_seqs.low=2", "space.max_num_seqs.high=8", "+space.max_num_seqs.step=6",
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
    # study.n_trials counts trials measured by a comparison of their own (not those the probes or the baseline
    # answered)
    assert sum(measured(t) for t in study.trials) == 4 and "winner" in study.user_attrs
    records = read_records(tmp_path / "job" / "replicates.jsonl")
    assert {r["slot"] for r in records} == {"ray-0", "ray-1"}
    # two CPU slots on one node share its cores: confirmations run alone there, as local slots' do
    confirm = [r for r in records if r["stage"] == "confirm"]
    assert confirm and {r["slots"] for r in confirm} == {1} and most_at_once(confirm) == 1
