"""Whether a named model can be loaded here, checked before any engine starts.

vLLM resolves a Hugging Face name only when the engine starts, and with no network it retries for about
30 s first; the answer is known at once from the local cache and one short request to the hub."""

from __future__ import annotations

import functools
import os

from throttle_sweep.errors import ConfigError

HUB = "https://huggingface.co"
TIMEOUT_S = 5.0


def cached(model: str) -> bool:
    """The model's config.json is in this machine's Hugging Face cache."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    found = try_to_load_from_cache(model, "config.json")
    return isinstance(found, str)


def check_model_reachable(model: str, *, source: str) -> None:
    """Raise ConfigError naming `source`.model when a hub name is neither cached nor fetchable (asked once
    per process: every arm and every extreme of a space is checked with the same model)."""
    problem = _problem(model)
    if problem is not None:
        raise ConfigError(f"{source}.model={model!r}{problem}")


@functools.lru_cache(maxsize=8)
def _problem(model: str) -> str | None:
    if cached(model):
        return None
    advice = (f"download it on a machine that reaches the hub (huggingface-cli download {model}) into this "
              "machine's cache, or name a local folder (engine.model=/path/to/model)")
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return f" is not in this machine's Hugging Face cache and HF_HUB_OFFLINE is set; {advice}"
    import httpx

    url = f"{os.environ.get('HF_ENDPOINT') or HUB}/{model}/resolve/main/config.json"
    token = os.environ.get("HF_TOKEN")
    try:
        answer = httpx.head(url, timeout=TIMEOUT_S, follow_redirects=True,
                            headers={"Authorization": f"Bearer {token}"} if token else None)
    except httpx.HTTPError as exc:
        return (f" is not in this machine's Hugging Face cache, and the hub cannot be reached "
                f"({type(exc).__name__}: {exc}); {advice}")
    if answer.status_code in (401, 403):
        return (f": the hub refused access ({answer.status_code}); a gated or private model needs HF_TOKEN set "
                "to a token that may read it")
    if answer.status_code == 404:
        return f": no such model on the hub ({url} answered 404); check the name, or name a local folder"
    return None
