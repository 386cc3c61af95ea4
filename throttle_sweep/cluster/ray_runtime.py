"""Joining Ray or starting a private one, and what is left of it: a private local Ray is started bound to
127.0.0.1, without the dashboard UI or usage stats, in its own temp dir, and stopped at the end; its process
ids are written down so that a later run of the same study can end any that a SIGKILLed driver left behind.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
import signal
import socket
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from throttle_sweep.errors import ThrottleSweepError

LEFTOVERS = "ray-local.json"
TEMP_PREFIX = "/tmp/ts-ray-"  # short: Ray's socket paths must stay < 108 chars


def is_private_temp(path: str) -> bool:
    """A temp dir this tool made for a private Ray: directly under /tmp, named ts-ray-*."""
    real = os.path.realpath(path)
    return real.startswith(TEMP_PREFIX) and os.path.dirname(real) == os.path.dirname(TEMP_PREFIX)


class ClusterError(ThrottleSweepError):
    """Ray could not give the sweep the slots it needs."""


# ---- joining or starting Ray -------------------------------------------------------------------------------
def connect(ray_conf: Mapping[str, Any], out: Path, say: Callable[[str], None]) -> Callable[[], None]:
    """Join `ray.address` (or RAY_ADDRESS, as under `ray job submit`), or start a private local Ray.
    Returns the function that disconnects (joined) or stops (private) it."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():
        return lambda: None  # the caller's own Ray (a library user, a test): theirs to stop
    address = ray_conf.get("address") or os.environ.get("RAY_ADDRESS")
    if address:
        why_not = unreachable(address)
        try:
            if why_not is None:
                init_keeping_sigterm(address=address, log_to_driver=False, configure_logging=False,
                                     namespace="throttle_sweep")
        except ConnectionError as exc:
            why_not = str(exc).strip().splitlines()[0]
        if why_not is not None:
            raise ClusterError(
                f"ray.address={address!r}: no Ray cluster answered there ({why_not}). Start one with `ray start "
                "--head` on the head node and give its GCS address as HOST:PORT (default port 6379), or use "
                "ray.address=auto on a node of a running cluster (for a head started on this machine's loopback, "
                "set RAY_TMPDIR to its temp dir), or leave ray.address unset for a private Ray on this machine")
        say(f"ray: joined the cluster at {address} ({ray.cluster_resources().get('GPU', 0):g} GPUs, "
            f"{ray.cluster_resources().get('CPU', 0):g} CPUs)")
        return ray.shutdown
    end_leftovers(out, say)
    temp = tempfile.mkdtemp(prefix=os.path.basename(TEMP_PREFIX), dir=os.path.dirname(TEMP_PREFIX))
    need_cpus = ray_conf["cpu_slots"] * ray_conf["cpus_per_slot"] if ray_conf.get("slots") is None \
        else ray_conf["slots"] * ray_conf["cpus_per_slot"]
    unlock = lock_down(temp)
    try:
        init_keeping_sigterm(address="local", num_cpus=max(os.cpu_count() or 1, math.ceil(need_cpus)),
                             include_dashboard=False, _temp_dir=temp, _node_ip_address="127.0.0.1",
                             log_to_driver=False, configure_logging=False, namespace="throttle_sweep")
    except BaseException:
        unlock()
        raise
    write_leftovers(out, temp)
    say(f"ray: started a private local Ray in {temp} (loopback only, token authentication)")

    def stop() -> None:
        ray.shutdown()
        unlock()
        shutil.rmtree(temp, ignore_errors=True)
        (out / LEFTOVERS).unlink(missing_ok=True)

    return stop


AUTH_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_TOKEN", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")


def lock_down(temp: str) -> Callable[[], None]:
    """Make the private Ray about to start reachable from this machine's loopback only, and only with a
    token, whatever the user's environment says; returns what undoes it (after ray.shutdown).

    - Loopback: Ray binds every server (GCS, raylet, workers, agents, metrics) to loopback when it believes
      clusters are off on this platform (`ENABLE_RAY_CLUSTER`, read from RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER at
      import); otherwise it maps 127.0.0.1 to the interface address and listens on all interfaces.
    - Token: RAY_AUTH_MODE=token with a fresh random token (mode 0600) in the private temp dir, not in
      ~/.ray. Ray caches its config at import, so it is reloaded for the change to take (as Ray's own
      token set-up does). The Prometheus metrics port has no authentication; loopback is its only guard.
    Workers inherit the environment, so they see the same token."""
    import ray._private.ray_constants as constants
    from ray._raylet import AuthenticationTokenLoader, Config

    token = Path(temp) / "auth_token"
    fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_hex(32))
    saved_env = {key: os.environ.get(key) for key in AUTH_ENV}
    saved_cluster = constants.ENABLE_RAY_CLUSTER
    os.environ.pop("RAY_AUTH_TOKEN", None)  # it would win over the token file
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token), RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    constants.ENABLE_RAY_CLUSTER = False
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()  # a token read earlier (~/.ray) must not be presented

    def unlock() -> None:
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        constants.ENABLE_RAY_CLUSTER = saved_cluster
        Config.initialize("")  # the config first, then the token cache (the order Ray's own reset keeps)
        AuthenticationTokenLoader.instance().reset_cache()

    return unlock


def unreachable(address: str) -> str | None:
    """Why nothing can answer at a HOST:PORT address, found in seconds, or None. Ray itself retries an
    address where nothing listens for minutes; 'auto' and URLs are left to Ray."""
    host, _, port = address.rpartition(":")
    if not host or "://" in address or not port.isdigit():
        return None
    try:
        with socket.create_connection((host, int(port)), timeout=5):
            return None
    except OSError as exc:
        return f"{host}:{port}: {exc.strerror or exc}"


def init_keeping_sigterm(**kwargs: Any) -> None:
    """ray.init, then the caller's SIGTERM handler back: Ray installs its own, which exits with code 15 and
    would skip the sweep's clean stop (trials left for the next run, a message how to resume)."""
    import ray

    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main else None
    ray.init(**kwargs)
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)


def write_leftovers(out: Path, temp: str) -> None:
    """Note the private Ray's processes, so a run after a SIGKILL can end those still alive."""
    import psutil

    procs = [{"pid": p.pid, "create_time": p.create_time()} for p in psutil.Process().children(recursive=True)]
    out.mkdir(parents=True, exist_ok=True)
    (out / LEFTOVERS).write_text(json.dumps({"temp_dir": temp, "processes": procs}))


def end_leftovers(out: Path, say: Callable[[str], None]) -> int:
    """End the processes of a private Ray that a killed driver of this study left running. Called only by
    the holder of the study's lock (store/lock.py), so the Ray it ends can only be a dead driver's. The file is
    not trusted as written: the temp dir must be one of ours, and a process is ended only if it is the one
    noted (same start time, not a reused pid) and it shows that it belongs to that Ray (`belongs_to`)."""
    import psutil

    path = out / LEFTOVERS
    if not path.exists():
        return 0
    try:
        info = json.loads(path.read_text())
        temp, procs = str(info["temp_dir"]), list(info["processes"])
    except (ValueError, KeyError, TypeError):
        say(f"ray: {path} is not a leftovers file this tool wrote; it was left alone and nothing was ended")
        return 0
    if not is_private_temp(temp):
        say(f"ray: {path} names {temp!r}, which is not a private Ray temp dir of this tool ({TEMP_PREFIX}*); "
            "nothing was ended or removed")
        return 0
    ended = 0
    for proc in procs:
        try:
            p = psutil.Process(int(proc["pid"]))
            same = abs(p.create_time() - float(proc["create_time"])) < 1e-3  # not a reused pid
            if same and belongs_to(p, temp):
                p.kill()
                ended += 1
        except (psutil.Error, KeyError, TypeError, ValueError):
            pass
    shutil.rmtree(temp, ignore_errors=True)
    path.unlink()
    if ended:
        say(f"ray: ended {ended} processes left by an earlier run of this study that was killed")
    return ended


def belongs_to(process: Any, temp: str) -> bool:
    """Does this process show that it is part of the private Ray in `temp`? Its command line names the dir
    (GCS, raylet, monitors), or, for the processes Ray retitles (`ray::IDLE`, `ray::DashboardAgent`), the
    log files its output goes to live there."""
    if any(temp in arg for arg in process.cmdline()):
        return True
    return any(f.path.startswith(temp + os.sep) for f in process.open_files())
