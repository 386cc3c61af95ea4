"""What a model costs a GPU, from its config.json alone: weight bytes, KV-cache bytes per token, and the FLOPs
of a forward pass. Decoder-only transformers with grouped-query attention and a gated MLP (Llama, Qwen2,
Mistral and their kin), which is what the config fields below describe."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from throttle_sweep.errors import ConfigError

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "auto": 2, "half": 2, "fp8": 1, "fp8_e4m3": 1,
               "fp8_e5m2": 1}


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    max_position: int
    dtype_bytes: int = 2

    @property
    def layer_params(self) -> int:
        """Weights of one decoder layer: q, k, v, o projections (with q/k/v biases as Qwen2 has), the gated MLP,
        two norms."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        attention = self.hidden * (q + 2 * kv) + q * self.hidden + q + 2 * kv
        return attention + 3 * self.hidden * self.intermediate + 2 * self.hidden

    @property
    def matmul_params(self) -> int:
        """Weights every token multiplies through (the layers; the LM head is counted per sampled token)."""
        return self.layers * self.layer_params

    @property
    def weight_bytes(self) -> int:
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return (self.matmul_params + embeddings + self.hidden) * self.dtype_bytes

    def kv_bytes_per_token(self, kv_dtype_bytes: int | None = None) -> int:
        """Keys and values of every layer for one token."""
        return 2 * self.layers * self.kv_heads * self.head_dim * (kv_dtype_bytes or self.dtype_bytes)

    def token_flops(self) -> float:
        """FLOPs of one token through the layers' matmuls (attention over the context apart)."""
        return 2.0 * self.matmul_params

    def attention_flops(self, query_tokens: int, context_tokens: float) -> float:
        """Scores and weighted values of `query_tokens` against `context_tokens` each, all layers."""
        return 4.0 * self.layers * self.heads * self.head_dim * query_tokens * context_tokens

    def logits_flops(self, sequences: int) -> float:
        return 2.0 * self.hidden * self.vocab * sequences


def shape_from_config(config: Mapping[str, Any], *, source: str) -> ModelShape:
    """The shape from a config.json's fields; a missing one is named with the file it was looked for in."""
    def need(key: str) -> int:
        value = config.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ConfigError(f"{source}: the twin needs {key!r} (a positive integer) in the model's config.json, "
                              f"but got {value!r}")
        return value

    hidden, heads = need("hidden_size"), need("num_attention_heads")
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    return ModelShape(layers=need("num_hidden_layers"), hidden=hidden, heads=heads,
                      kv_heads=int(config.get("num_key_value_heads") or heads),
                      head_dim=int(config.get("head_dim") or hidden // heads),
                      intermediate=need("intermediate_size"), vocab=need("vocab_size"),
                      tied_embeddings=bool(config.get("tie_word_embeddings", False)),
                      max_position=int(config.get("max_position_embeddings") or 4096),
                      dtype_bytes=DTYPE_BYTES.get(dtype, 2))


def load_shape(model_dir: Path) -> ModelShape:
    path = model_dir / "config.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"engine.model: the twin reads the model's config.json, and {path} does not exist") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"engine.model: {path} is not valid JSON ({exc})") from None
    return shape_from_config(config, source=str(path))
