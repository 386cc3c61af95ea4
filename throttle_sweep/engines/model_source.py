"""Whether a named model can be loaded here, checked before any engine starts.

vLLM resolves a Hugging Face name only when the engine starts, and with no network it retries for about
30 s first; the answer is known at once from the local cache and one short request to the hub."""

from __future__ import annotations

import functools

from throttle_sweep.errors import ConfigError

TIMEOUT_S = 5.0


def cached(model: str) -> bool:
    """The model's config.json is in this machine's Hugging Face cache."""
    from throttle_sweep.models import cached_config

    return cached_config(model) is not None


def check_model_reachable(model: str, *, source: str) -> None:
    """Raise ConfigError naming `source`.model when a hub name is neither cached nor fetchable (asked once
    per process: every arm and every extreme of a space is checked with the same model)."""
    problem = _problem(model)
    if problem is not None:
        raise ConfigError(f"{source}.model={model!r}{problem}")


@functools.lru_cache(maxsize=8)
def _problem(model: str) -> str | None:
    """Asked through huggingface_hub, as vLLM asks: its endpoint (HF_ENDPOINT), its token (HF_TOKEN, or the
    one `huggingface-cli login` stored), its offline switch, and the hub's own error codes."""
    if cached(model):
        return None
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
    )

    advice = (f"download it on a machine that reaches the hub (huggingface-cli download {model}) into this "
              "machine's cache, or name a local folder (engine.model=/path/to/model)")
    try:
        get_hf_file_metadata(hf_hub_url(model, "config.json"), timeout=TIMEOUT_S)
    except OfflineModeIsEnabled:
        return f" is not in this machine's Hugging Face cache and HF_HUB_OFFLINE is set; {advice}"
    except GatedRepoError:
        return (": a gated model this machine's token may not read yet; accept its terms on the hub and log in "
                "(huggingface-cli login, or HF_TOKEN)")
    except RepositoryNotFoundError:
        return (": no such model on the hub, or a private one this machine's token may not read; check the name "
                "(or log in: huggingface-cli login, HF_TOKEN), or name a local folder")
    except EntryNotFoundError:
        return ": the hub has no config.json for it, so vLLM cannot load it as a model"
    except HfHubHTTPError as exc:
        return f": the hub answered {str(exc).splitlines()[0]}"
    except Exception as exc:  # noqa: BLE001 - any failure to connect (the hub client's own error types)
        return (f" is not in this machine's Hugging Face cache, and the hub cannot be reached "
                f"({type(exc).__name__}: {exc}); {advice}")
    return None
