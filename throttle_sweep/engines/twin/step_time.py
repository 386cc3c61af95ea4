"""How long one engine step takes on a GPU: a roofline (bytes against bandwidth, FLOPs against peak, a
per-layer floor that launch and synchronisation set) plus the host's own time per step and per sequence, with
decode batches padded to vLLM's CUDA graph sizes. The interface (`StepTime`) is what the twin's scheduler asks;
a measured kernel database can stand behind it instead of the roofline.

With async scheduling (vLLM's default on a GPU) the host prepares step n+1 while the GPU runs step n, so a step
takes the longer of the two, not their sum."""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from throttle_sweep.engines.twin.gpus import GpuSpec
from throttle_sweep.engines.twin.model_shape import ModelShape

DEFAULT_GRAPH_MAX = 512


@dataclass(frozen=True)
class Batch:
    """One step's work: prefill tokens, sequences decoding one token each, the KV tokens the step reads, and the
    sequences that sample a token (decoders and prefills that complete)."""

    prefill_tokens: int
    decode_seqs: int
    kv_tokens: int
    sampled: int
    seqs: int  # sequences in the step, decoding or prefilling


class StepTime(Protocol):
    def seconds(self, batch: Batch) -> float: ...


def graph_sizes(max_num_seqs: int, max_num_batched_tokens: int) -> list[int]:
    """vLLM's default CUDA graph capture sizes (VllmConfig._set_cudagraph_sizes): 1, 2, 4, then every 8 to 248,
    then every 16, up to twice max_num_seqs, at most 512, and never beyond the step's token budget."""
    top = min(2 * max_num_seqs, DEFAULT_GRAPH_MAX, max_num_batched_tokens)
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, DEFAULT_GRAPH_MAX + 1, 16)]
    return [s for s in sizes if s <= top] or [1]


# The host's time per step and per sequence, from two published measurements of Qwen2.5-0.5B on an A100-class GPU
# that disagree tenfold on the per-sequence part (docs/twin.md, Calibration; tests/unit/test_twin.py):
#   seed         the seed experiment, 1 and 8 sequences: 516 and 1,650 output tokens/s
#   large-batch  vLLM 0.10.2's offline LLM on an A800, 256 requests at once: 17,711 output tokens/s
HOSTS = {"seed": (1.52e-3, 0.4155e-3), "large-batch": (1.52e-3, 0.037e-3)}


@dataclass(frozen=True)
class Efficiency:
    """What share of the datasheet peaks a step reaches, and the host's time (calibrated: docs/twin.md)."""

    bandwidth: float = 0.80  # of peak bandwidth, streaming weights and KV
    compute: float = 0.60  # of peak bf16 FLOP/s, large GEMMs
    host_step_s: float = 1.52e-3  # the host's time per step: scheduling, input preparation, output processing
    host_per_seq_s: float = 0.4155e-3  # ... and per sequence in the step (HOSTS["seed"])
    eager_layer_s: float = 60e-6  # without CUDA graphs, kernel launches add this per layer
    head_s: float = 0.1e-3  # embedding, final norm, sampler: per step, beside the layers


@dataclass(frozen=True)
class Roofline:
    model: ModelShape
    gpu: GpuSpec
    kv_bytes_per_token: int
    graphs: list[int]  # capture sizes; empty with enforce_eager
    efficiency: Efficiency = Efficiency()
    gpus: int = 1  # tensor parallel: the work splits over this many GPUs (communication not modelled)
    async_scheduling: bool = True
    # the GPU's part from measured kernels instead of the roofline (twin/aiconfigurator.py), None: the roofline
    forward: Callable[[Batch], float] | None = None

    def padded(self, tokens: int) -> int:
        """A step whose tokens fit a captured graph runs that graph's size."""
        if not self.graphs or tokens > self.graphs[-1]:
            return tokens
        return self.graphs[bisect.bisect_left(self.graphs, tokens)]

    def gpu_seconds(self, batch: Batch) -> float:
        if self.forward is not None:  # a decode step runs the CUDA graph it pads to, as below
            decodes = batch.decode_seqs if batch.prefill_tokens else self.padded(batch.decode_seqs)
            return self.forward(Batch(batch.prefill_tokens, decodes, batch.kv_tokens, batch.sampled, batch.seqs))
        m, e = self.model, self.efficiency
        tokens = self.padded(batch.prefill_tokens + batch.decode_seqs)
        moved = m.weight_bytes + batch.kv_tokens * self.kv_bytes_per_token
        flops = (m.token_flops() * tokens + m.logits_flops(max(batch.sampled, 1))
                 + m.attention_flops(1, batch.kv_tokens / max(batch.decode_seqs, 1)) * batch.decode_seqs
                 + m.attention_flops(batch.prefill_tokens, batch.prefill_tokens / 2))
        memory_s = moved / (self.gpu.bandwidth_bytes_s * e.bandwidth)
        compute_s = flops / (self.gpu.bf16_flops * e.compute)
        floor_s = m.layers * (self.gpu.layer_floor_s + (0.0 if self.graphs else e.eager_layer_s))
        return max(memory_s, compute_s) / self.gpus + floor_s + e.head_s

    def host_seconds(self, batch: Batch) -> float:
        return self.efficiency.host_step_s + self.efficiency.host_per_seq_s * batch.seqs

    def seconds(self, batch: Batch) -> float:
        gpu, host = self.gpu_seconds(batch), self.host_seconds(batch)
        return max(gpu, host) if self.async_scheduling else gpu + host
