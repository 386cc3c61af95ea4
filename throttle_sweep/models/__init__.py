"""The embedded default model: a tiny Qwen2-architecture config served with dummy weights (no download)."""

from __future__ import annotations

import json
from pathlib import Path

TINY_QWEN2 = Path(__file__).parent / "tiny-qwen2"


def model_config(model: str) -> dict | None:
    """The model's config.json when it is a local folder, else None (a hub name we must not fetch)."""
    path = Path(model) / "config.json"
    return json.loads(path.read_text()) if path.is_file() else None
