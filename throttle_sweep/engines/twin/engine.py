"""The GPU twin (`backend=twin`): vLLM's scheduling rules (the fake engine's scheduler) on a virtual clock, with
a GPU's step times (step_time.py), its KV cache as vLLM's memory profiling sizes it (memory.py), the batch
defaults `vllm serve` resolves on that GPU, and what an engine start costs there. It predicts what a GPU
would do, so that the GPU path runs end to end at GPU scale on a machine without one; it measures nothing.

Async scheduling (vLLM's default on a GPU) makes the batch a request joins depend on timing: with `jitter` > 0
an arriving request misses each step's scheduling with that probability (seeded per replicate), so it joins
a step or more late, and preemption counts near the boundary can differ between repeats, as they may on a GPU."""

from __future__ import annotations

import os
import platform
import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from throttle_sweep.engines.base import Request, StepEvent
from throttle_sweep.engines.fake import FakeKnobs, FakeSession
from throttle_sweep.engines.twin.gpus import GpuSpec, describe, gpu_spec
from throttle_sweep.engines.twin.memory import KvCache, kv_cache
from throttle_sweep.engines.twin.model_shape import DTYPE_BYTES, ModelShape, load_shape
from throttle_sweep.engines.twin.step_time import HOSTS, Batch, Efficiency, Roofline, graph_sizes
from throttle_sweep.errors import ConfigError
from throttle_sweep.models import QWEN2_5_0_5B, QWEN2_5_7B

STEP_TIMES = ("roofline", "aiconfigurator")
# Hub names whose config.json ships in the package (nothing is fetched).
SHIPPED_MODELS = {"Qwen/Qwen2.5-0.5B-Instruct": QWEN2_5_0_5B, "Qwen/Qwen2.5-0.5B": QWEN2_5_0_5B,
                  "Qwen/Qwen2.5-7B-Instruct": QWEN2_5_7B, "Qwen/Qwen2.5-7B": QWEN2_5_7B}


@dataclass
class TwinConf:
    """backend=twin: which GPU it simulates, and how it departs from a perfectly repeatable one."""

    gpu: Any = "H100"  # a known GPU's name (twin/gpus.py), or {name, memory_gib, bandwidth_gb_s, bf16_tflops}
    jitter: float = 0.0  # the chance that an arriving request misses a step's scheduling (async scheduling)
    noise_sd: float = 0.01  # sd of log step time, drawn per replicate (run-to-run noise of a GPU)
    seed: int = 0
    host: str = "seed"  # the host's calibration (step_time.HOSTS): seed | large-batch (docs/twin.md)
    step_time: str = "roofline"  # the GPU's part of a step: roofline | aiconfigurator (measured kernels, an extra)
    host_step_s: float | None = None  # the host's time per step and per sequence; null: the calibration's
    host_per_seq_s: float | None = None


@dataclass(frozen=True)
class StartCosts:
    """What a vLLM engine start costs on a GPU, before it serves (docs/twin.md): the process and imports, the
    weights from local disk, the memory profile, torch.compile (cached after the first start of a model in a
    process) and the CUDA graph capture (per captured size)."""

    process_s: float = 12.0
    load_bytes_s: float = 2e9
    profile_s: float = 3.0
    compile_first_s: float = 30.0
    compile_cached_s: float = 6.0
    graph_s: float = 0.08


def served_defaults(gpu: GpuSpec) -> dict[str, int]:
    """The batch flags `vllm serve` resolves on this GPU (EngineArgs.get_batch_defaults, OPENAI_API_SERVER):
    1024 sequences and 8192 tokens on GPUs of 70 GiB or more other than the A100, 16384 tokens at 160 GiB or
    more, 256 and 2048 elsewhere."""
    if gpu.memory_bytes >= 160 << 30:
        return {"max_num_seqs": 1024, "max_num_batched_tokens": 16384}
    if gpu.memory_bytes >= 70 << 30 and "a100" not in gpu.name.lower():
        return {"max_num_seqs": 1024, "max_num_batched_tokens": 8192}
    return {"max_num_seqs": 256, "max_num_batched_tokens": 2048}


def model_dir(model: str | None) -> Path:
    """The folder whose config.json describes the model: a shipped one by hub name, or a local folder."""
    if model is None:
        return QWEN2_5_0_5B
    if model in SHIPPED_MODELS:
        return SHIPPED_MODELS[model]
    path = Path(model).expanduser()
    if (path / "config.json").is_file():
        return path
    raise ConfigError(f"engine.model={model!r}: the twin reads a model's config.json and fetches nothing; name a "
                      f"local folder with one, or a model whose config ships: {', '.join(SHIPPED_MODELS)}")


class TwinSession(FakeSession):
    def __init__(self, flags: Mapping[str, Any], knobs: FakeKnobs, start_index: int, *, roofline: Roofline,
                 cache: KvCache, jitter: float, seed: int) -> None:
        super().__init__({**flags, "block_size": cache.block_size, "num_gpu_blocks_override": cache.blocks},
                         knobs, start_index)
        self.flags = dict(flags)
        self.roofline, self.jitter, self.seed = roofline, jitter, seed
        self.held: list[Request] = []
        self.rng = random.Random(f"{seed}/{start_index}")

    def begin_replicate(self, index: int) -> None:
        super().begin_replicate(index)
        self.rng = random.Random(f"{self.seed}/jitter/{index}")

    def add(self, request: Request) -> None:
        if self.jitter > 0 and self.rng.random() < self.jitter:
            self.held.append(request)  # the scheduler sees it one step late
        else:
            super().add(request)

    def step(self) -> list[StepEvent]:
        held, self.held = self.held, []
        for request in held:  # each step a held request gets in with probability 1 - jitter
            if self.rng.random() < self.jitter:
                self.held.append(request)
            else:
                super().add(request)
        if not self.running and not self.waiting:  # only held requests: the step that lets them in
            return []
        return super().step()

    def has_unfinished(self) -> bool:
        return bool(self.held) or super().has_unfinished()

    def _step_seconds(self, prefill_tokens: int) -> float:
        sampled = sum(1 for seq in self.running if seq["computed"] >= self._context(seq))
        kv_tokens = sum(seq["computed"] for seq in self.running)
        return self.roofline.seconds(Batch(prefill_tokens=prefill_tokens, decode_seqs=sampled,
                                           kv_tokens=kv_tokens, sampled=sampled, seqs=len(self.running)))


class TwinEngine:
    """A GPU that is not there: see the module's docstring."""

    name = "twin"

    def __init__(self, conf: TwinConf | None = None, costs: StartCosts | None = None) -> None:
        self.conf = conf or TwinConf()
        self.gpu = gpu_spec(self.conf.gpu)
        self.costs = costs or StartCosts()
        self.starts = 0
        self.compiled: set[str] = set()
        if self.conf.host not in HOSTS:
            raise ConfigError(f"twin.host must be one of {', '.join(sorted(HOSTS))} (docs/twin.md, Calibration), "
                              f"but got {self.conf.host!r}")
        if self.conf.step_time not in STEP_TIMES:
            raise ConfigError(f"twin.step_time must be one of {', '.join(STEP_TIMES)} (docs/twin.md), but got "
                              f"{self.conf.step_time!r}")
        if not 0 <= self.conf.jitter <= 1:
            raise ConfigError(f"twin.jitter must be a probability in [0, 1], but got {self.conf.jitter!r}")

    def flag_schema(self) -> Mapping[str, Any]:
        from throttle_sweep.engines.flags import vllm_flag_schema

        return vllm_flag_schema()

    def refusal(self, flags: Mapping[str, Any]) -> str | None:
        """What vLLM's own config validation refuses on this GPU (a mocked CUDA platform with its name, memory
        and capability: engines/vllm_validation.py), decided before a start; the driver asks it of every set of
        flags before it starts one, so start() does not ask again."""
        from throttle_sweep.engines.vllm_validation import CudaDevice, vllm_refusal

        device = CudaDevice(self.gpu.device_name, self.gpu.memory_bytes, self.gpu.capability)
        return vllm_refusal({**self.engine_flags(flags), "skip_tokenizer_init": True}, cuda=device)

    def engine_flags(self, flags: Mapping[str, Any]) -> dict[str, Any]:
        resolved = {k: v for k, v in flags.items() if v is not None}
        resolved["model"] = str(model_dir(resolved.get("model")))
        return resolved

    def start(self, flags: Mapping[str, Any]) -> TwinSession:
        index = self.starts
        self.starts += 1
        resolved = self.engine_flags(flags)
        model = load_shape(Path(resolved["model"]))
        served = {k: v for k, v in served_defaults(self.gpu).items() if resolved.get(k) is None}
        seqs = int(resolved.get("max_num_seqs") or served["max_num_seqs"])
        tokens = int(resolved.get("max_num_batched_tokens") or served["max_num_batched_tokens"])
        gpus = int(resolved.get("tensor_parallel_size") or 1) * int(resolved.get("pipeline_parallel_size") or 1)
        kv_dtype = str(resolved.get("kv_cache_dtype") or "auto")
        per_token = model.kv_bytes_per_token(DTYPE_BYTES.get(kv_dtype) if kv_dtype != "auto" else None)
        graphs = [] if resolved.get("enforce_eager") else graph_sizes(seqs, tokens)
        max_len = int(resolved.get("max_model_len") or model.max_position)
        cache = kv_cache(model, self.gpu, resolved, kv_bytes_per_token=per_token, max_num_seqs=seqs,
                         max_num_batched_tokens=tokens, graphs=len(graphs), max_model_len=max_len, gpus=gpus)
        step_s, per_seq_s = HOSTS[self.conf.host]
        conf = self.conf
        efficiency = Efficiency(host_step_s=step_s if conf.host_step_s is None else conf.host_step_s,
                                host_per_seq_s=per_seq_s if conf.host_per_seq_s is None else conf.host_per_seq_s)
        forward = None
        if self.conf.step_time == "aiconfigurator":
            from throttle_sweep.engines.twin.aiconfigurator import forward_pass

            forward = forward_pass(Path(resolved["model"]), self.gpu, int(resolved.get("tensor_parallel_size") or 1))
        roofline = Roofline(model, self.gpu, per_token, graphs, efficiency, gpus=gpus, forward=forward)
        knobs = FakeKnobs(kv_bytes_per_token=per_token, noise_sd=self.conf.noise_sd, seed=self.conf.seed)
        session = TwinSession({**resolved, "max_num_seqs": seqs, "max_num_batched_tokens": tokens}, knobs, index,
                              roofline=roofline, cache=cache, jitter=self.conf.jitter, seed=self.conf.seed)
        session.start_seconds = self.start_seconds(model, resolved, graphs)
        session.served_defaults = served
        session.kv_bytes = cache.bytes
        return session

    def start_seconds(self, model: ModelShape, flags: Mapping[str, Any], graphs: list[int]) -> float:
        c = self.costs
        dummy = flags.get("load_format") == "dummy"
        seconds = c.process_s + c.profile_s + (1.0 if dummy else model.weight_bytes / c.load_bytes_s)
        if not flags.get("enforce_eager"):
            key = f"{flags['model']}/{flags.get('kv_cache_dtype')}"
            seconds += c.compile_cached_s if key in self.compiled else c.compile_first_s
            self.compiled.add(key)
            seconds += c.graph_s * len(graphs)
        return seconds

    def environment(self) -> dict[str, Any]:
        return {"engine": self.name, "vllm_version": None, "device": "twin", "device_name": self.gpu.name,
                "gpu": describe(self.gpu), "host": platform.node(), "cpu_count": os.cpu_count(),
                "predicted": True}



