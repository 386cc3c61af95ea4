"""How many KV-cache blocks vLLM gives an engine on a GPU, the way its memory profiling decides: the share of
the GPU that `gpu_memory_utilization` asks for, less the weights, the profiled activation peak (a forward pass
of max_num_batched_tokens and the sampler's logits for max_num_seqs), the CUDA graphs' pools and what the CUDA
context and libraries hold outside torch. `kv_cache_memory_bytes` replaces the profile, and
`num_gpu_blocks_override` the count, as in vLLM. The refusals use vLLM's words (vllm/v1/worker/gpu_worker.py,
vllm/v1/core/kv_cache_utils.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from throttle_sweep.engines.twin.gpus import GIB, GpuSpec
from throttle_sweep.engines.twin.model_shape import ModelShape
from throttle_sweep.errors import EngineStartError

NON_TORCH_BYTES = int(0.6 * GIB)  # the CUDA context, cuBLAS and NCCL workspaces: outside torch's allocator
GRAPH_POOL_BYTES_PER_SIZE = 2 << 20  # each captured graph size keeps its own buffers


@dataclass(frozen=True)
class KvCache:
    blocks: int
    block_size: int
    bytes: int
    non_kv_bytes: int | None  # what the profile counted against it (None: sized by kv_cache_memory_bytes)


def kv_cache(model: ModelShape, gpu: GpuSpec, flags: Mapping[str, Any], *, kv_bytes_per_token: int,
             max_num_seqs: int, max_num_batched_tokens: int, graphs: int, max_model_len: int, gpus: int = 1
             ) -> KvCache:
    block_size = int(flags.get("block_size") or 16)
    per_block = block_size * kv_bytes_per_token // gpus
    non_kv = None
    if flags.get("kv_cache_memory_bytes"):
        kv_bytes = int(flags["kv_cache_memory_bytes"])
    else:
        utilization = float(flags.get("gpu_memory_utilization") or 0.9)
        activations = (max_num_batched_tokens * (4 * model.hidden + 2 * model.intermediate) * model.dtype_bytes
                       + max_num_seqs * model.vocab * 4 * 2)  # hidden states and MLP, float32 logits and probs
        non_kv = (model.weight_bytes // gpus + activations + NON_TORCH_BYTES + graphs * GRAPH_POOL_BYTES_PER_SIZE)
        kv_bytes = int(utilization * gpu.memory_bytes) - non_kv
        if kv_bytes <= 0:
            raise EngineStartError(
                "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
                f"when initializing the engine. (twin: {utilization} x {gpu.memory_bytes / GIB:.1f} GiB on "
                f"{gpu.name} leaves nothing after {non_kv / GIB:.2f} GiB of weights, activations and graphs)")
    blocks = max(0, kv_bytes // per_block)
    if flags.get("num_gpu_blocks_override"):
        blocks = int(flags["num_gpu_blocks_override"])
    needed = -(-max_model_len // block_size) * per_block
    if blocks * per_block < needed:
        fits = blocks * block_size
        raise EngineStartError(
            f"ValueError: To serve at least one request with the models's max seq len ({max_model_len}), "
            f"({needed / GIB:.2f} GiB KV cache is needed, which is larger than the available KV cache memory "
            f"({blocks * per_block / GIB:.2f} GiB). Based on the available memory, the estimated maximum model "
            f"length is {fits}. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
            "initializing the engine.")
    return KvCache(blocks, block_size, kv_bytes, non_kv)
