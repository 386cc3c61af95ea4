"""backend=endpoint: measure an OpenAI-compatible vLLM server the user already runs, named by its URL. There
are no flags to set (the server has its own); an arm is a URL, so mode=compare compares two servers,
interleaved by alternating between them. The API key is read from an environment variable in the process
that sends the requests, so it never reaches a record or a saved config."""

from __future__ import annotations

import contextlib
import os
import platform
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx

from throttle_sweep.engines.openai_http import HttpSession, parse_metrics
from throttle_sweep.errors import ConfigError, EngineRunError, EngineStartError

REACH_TIMEOUT_S = 10.0


def auth_headers(api_key_env: str | None) -> dict[str, str]:
    """The Authorization header from the environment variable `api_key_env`. A key that is not printable
    ASCII (a CRLF .env leaves a carriage return) is refused naming the variable only, never the key."""
    key = os.environ.get(api_key_env) if api_key_env else None
    if not key:
        return {}
    key = key.strip()
    if not key.isascii() or not key.isprintable() or " " in key:
        raise ConfigError(f"the API key in ${api_key_env} (endpoint.api_key_env) has characters an HTTP header "
                          "cannot carry (a space, a control character such as a carriage return, or non-ASCII)")
    return {"Authorization": f"Bearer {key}"}


def check_endpoint(url: Any, *, key: str, api_key_env: str | None) -> str:
    """The served model's name, once the URL is a vLLM server that answers: /v1/models lists a model and
    /metrics has vLLM's preemption counter. Raises ConfigError naming `key` otherwise, before any work."""
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        shown = "a value with '@' in it (not repeated here: it may hold a password)" if "@" in str(url) else repr(url)
        raise ConfigError(f"{key} must be an http(s) URL of a running server (e.g. http://127.0.0.1:8000), "
                          f"but got {shown}")
    if parts.username or parts.password:  # the URL goes into every record
        raise ConfigError(f"{key} carries credentials (user:password@): records keep the URL, so give the key "
                          "through an environment variable named by endpoint.api_key_env instead")
    headers = auth_headers(api_key_env)
    try:
        with httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=REACH_TIMEOUT_S) as client:
            models = client.get("/v1/models")
            metrics = client.get("/metrics")
    except httpx.HTTPError as exc:
        raise ConfigError(f"{key}={url} cannot be reached ({type(exc).__name__}: {exc}): is the server running "
                          "and listening there?") from None
    if models.status_code in (401, 403):
        now = "" if not api_key_env else (f" (now {api_key_env}, which is "
                                          f"{'set' if api_key_env in os.environ else 'not set'})")
        raise ConfigError(f"{key}={url} refused the request (HTTP {models.status_code}): put its API key in an "
                          f"environment variable and name it with endpoint.api_key_env{now}")
    try:
        names = [m["id"] for m in models.json()["data"]]
    except (ValueError, KeyError, TypeError):
        names = []
    if models.status_code != 200 or not names:
        raise ConfigError(f"{key}={url}: /v1/models answered HTTP {models.status_code} with no model: not an "
                          "OpenAI-compatible server")
    if metrics.status_code != 200 or "vllm:num_preemptions_total" not in parse_metrics(metrics.text):
        raise ConfigError(f"{key}={url}: /metrics has no vllm:num_preemptions_total (HTTP {metrics.status_code}): "
                          "throttle_sweep needs a vLLM server's own counters to tell a clean run from one that "
                          "preempted")
    return names[0]


class EndpointSession(HttpSession):
    """A server someone else runs keeps its prefix cache: resetting it could disturb their traffic."""

    def begin_replicate(self, index: int) -> None:
        self.prefix_cache_reset = False

    def reset_prefix_cache(self) -> None:
        self.prefix_cache_reset = False


class EndpointEngine:
    name = "endpoint"

    def __init__(self, *, api_key_env: str | None = None, request_timeout_s: float = 600.0) -> None:
        self.api_key_env, self.request_timeout_s = api_key_env, request_timeout_s

    def flag_schema(self) -> Mapping[str, Any]:
        return {"url": str, "model": str}

    def engine_flags(self, flags: Mapping[str, Any]) -> dict[str, Any]:
        return dict(flags)

    def start(self, flags: Mapping[str, Any]) -> EndpointSession:
        url = str(flags["url"])
        try:
            model = flags.get("model") or check_endpoint(url, key="endpoint", api_key_env=self.api_key_env)
        except ConfigError as exc:  # it answered before the run began; now it does not
            raise EngineStartError(str(exc)) from None
        session = EndpointSession(url, model, headers=auth_headers(self.api_key_env),
                                  request_timeout_s=self.request_timeout_s)
        session.prefix_cache_reset = False  # never reset here, whichever mode measures
        with contextlib.suppress(EngineRunError):  # a server that does not say keeps kv_cache unknown
            session.read_kv_capacity()
        return session

    def environment(self) -> dict[str, Any]:
        return {"engine": self.name, "host": platform.node(), "cpu_count": os.cpu_count()}
