"""Engines: the interface measurement needs, vLLM in-process, vLLM's API server, servers you run, a GPU twin
(a simulated GPU on a virtual clock), and a fake for fast tests."""

from __future__ import annotations

from throttle_sweep.engines.base import Engine, EngineSession, Request, StepEvent
from throttle_sweep.engines.fake import FakeEngine, FakeKnobs
from throttle_sweep.engines.vllm_inproc import VllmInprocEngine

__all__ = ["Engine", "EngineSession", "FakeEngine", "FakeKnobs", "Request", "StepEvent", "VllmInprocEngine",
           "make_engine"]


BACKENDS = ("vllm", "server", "endpoint", "fake", "twin")


def make_engine(kind: str, *, fake_knobs: FakeKnobs | None = None, server: dict | None = None,
                endpoint: dict | None = None, twin: dict | None = None) -> Engine:
    """`server`: the server engine's options (log_dir, start_timeout_s, stop_grace_s, request_timeout_s);
    `endpoint`: api_key_env and request_timeout_s for servers the user runs; `twin`: the GPU twin's (TwinConf)."""
    if kind == "vllm":
        return VllmInprocEngine()
    if kind == "server":
        from throttle_sweep.engines.vllm_server import VllmServerEngine

        return VllmServerEngine(**(server or {}))
    if kind == "endpoint":
        from throttle_sweep.engines.endpoint import EndpointEngine

        options = endpoint or {}
        return EndpointEngine(api_key_env=options.get("api_key_env"),
                              request_timeout_s=options.get("request_timeout_s", 600.0))
    if kind == "fake":
        return FakeEngine(fake_knobs)
    if kind == "twin":
        from throttle_sweep.engines.twin import TwinConf, TwinEngine

        return TwinEngine(TwinConf(**(twin or {})))
    from throttle_sweep.errors import ConfigError

    raise ConfigError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, but got {kind!r}")
