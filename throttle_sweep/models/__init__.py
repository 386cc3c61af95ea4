"""Model configs that travel with the package, served with dummy weights (no download): the embedded default
(a tiny Qwen2 architecture), Qwen2.5-0.5B's architecture for the GPU check, and Qwen2.5-7B's for the GPU twin."""

from __future__ import annotations

import json
from pathlib import Path

TINY_QWEN2 = Path(__file__).parent / "tiny-qwen2"
# The public architecture of Qwen/Qwen2.5-0.5B-Instruct (its config.json and generation_config.json), for the
# GPU check: served with dummy weights and token-id prompts, it does a real 0.5B model's work without a download.
QWEN2_5_0_5B = Path(__file__).parent / "qwen2.5-0.5b-instruct"
# Qwen2.5-7B-Instruct's public config.json alone: the GPU twin's model whose KV cache fills inside the batching
# space on one 80 GB GPU (no weights ship, not even dummy ones: only the twin reads it).
QWEN2_5_7B = Path(__file__).parent / "qwen2.5-7b-instruct"


def model_config(model: str) -> dict | None:
    """The model's config.json when it is a local folder, or a hub name this machine's Hugging Face cache
    holds; else None (a hub name is never fetched here)."""
    path = Path(model) / "config.json"
    if not path.is_file():
        found = cached_config(model)
        path = Path(found) if found is not None else path
    return json.loads(path.read_text()) if path.is_file() else None


def cached_config(model: str) -> str | None:
    """Where this machine's Hugging Face cache holds a hub model's config.json, or None."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(model, "config.json")
    except Exception:  # noqa: BLE001 - no hub client, or not a hub name: nothing cached
        return None
    return found if isinstance(found, str) else None
