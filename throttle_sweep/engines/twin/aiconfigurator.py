"""The GPU's part of a step from NVIDIA's AIConfigurator (`twin.step_time=aiconfigurator`): its database of
kernels measured with vLLM on that GPU (aiconfigurator-core, Apache-2.0), in place of the roofline. An optional
extra, pinned because its data and API move monthly (`pip install 'throttle-sweep[twin-aic]'`, about 370 MB with
pyarrow and pandas). It models the forward pass only: the host's time per step and per sequence stays the twin's
(step_time.Roofline.host_seconds), and the decode batch is padded to its CUDA graph as the roofline pads it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

from throttle_sweep.engines.twin.gpus import GpuSpec
from throttle_sweep.engines.twin.step_time import Batch
from throttle_sweep.errors import ConfigError

EXTRA = "pip install 'throttle-sweep[twin-aic]' (aiconfigurator-core==0.12.0)"
# the twin's GPUs that aiconfigurator-core 0.12.0 holds vLLM data for: (its system, the vLLM version measured)
SYSTEMS = {"H100-80GB": ("h100_sxm", "0.24.0"), "H200": ("h200_sxm", "0.24.0"), "A100-80GB": ("a100_sxm", "0.14.0")}
KV_BUCKET = 256  # KV tokens a step reads, rounded to this for the cache: a step's time moves little within it


def forward_pass(model_dir: Path, gpu: GpuSpec, tp: int = 1) -> Callable[[Batch], float]:
    """Seconds of GPU time for a step, from AIConfigurator's measured kernels; a ConfigError that names the
    setting where it is not installed, or holds no data for this GPU or model."""
    if gpu.name not in SYSTEMS:
        raise ConfigError(f"twin.step_time=aiconfigurator has no vLLM data for twin.gpu={gpu.name}: it covers "
                          f"{', '.join(SYSTEMS)}; use twin.step_time=roofline")
    system, version = SYSTEMS[gpu.name]
    estimate = _model(str(model_dir), system, version, tp)

    @lru_cache(maxsize=65536)
    def cached(prefills: int, prefill_tokens: int, decodes: int, kv_tokens: int) -> float:
        scheduled = {"num_prefill_requests": prefills, "sum_prefill_tokens": prefill_tokens, "var_prefill_length": 0.0,
                     "num_decode_requests": decodes, "sum_decode_kv_tokens": kv_tokens if decodes else 0,
                     "var_decode_kv_tokens": 0.0}
        idle = {k: 0 for k in scheduled} | {"var_prefill_length": 0.0, "var_decode_kv_tokens": 0.0}
        metrics = {"version": 1, "worker_id": "twin", "dp_rank": 0, "counter_id": 0, "wall_time": 0.0,
                   "scheduled_requests": scheduled, "queued_requests": idle}
        ms = estimate(metrics)
        if ms is None:
            raise ConfigError(f"twin.step_time=aiconfigurator gave no estimate for {scheduled} on {gpu.name}")
        return ms / 1e3

    def seconds(batch: Batch) -> float:
        prefills = max(batch.seqs - batch.decode_seqs, 1 if batch.prefill_tokens else 0)
        kv = -(-batch.kv_tokens // KV_BUCKET) * KV_BUCKET
        return cached(prefills if batch.prefill_tokens else 0, batch.prefill_tokens, batch.decode_seqs, kv)

    try:  # one step now, so that a model it has no data for is refused before any run
        seconds(Batch(prefill_tokens=256, decode_seqs=1, kv_tokens=512, sampled=2, seqs=2))
    except ConfigError:
        raise
    except Exception as exc:  # its PerfDataNotAvailableError and ValueErrors: no data for this model here
        raise ConfigError(f"twin.step_time=aiconfigurator has no data for this model on {gpu.name} "
                          f"({system}, vLLM {version}): {exc}; use twin.step_time=roofline") from exc
    return seconds


@lru_cache(maxsize=8)
def _model(model_dir: str, system: str, version: str, tp: int) -> Callable[[dict], float | None]:
    """Its forward-pass model, built once per process (loading its database takes seconds)."""
    try:
        from aiconfigurator_core.sdk.rust_engine_step import RustForwardPassPerfModel
    except ImportError as exc:
        raise ConfigError(f"twin.step_time=aiconfigurator needs the optional extra: {EXTRA}") from exc
    quiet = logging.getLogger("aiconfigurator_core")
    level, quiet.level = quiet.level, logging.ERROR  # its notes on fallback rows are for its own users
    try:
        model = RustForwardPassPerfModel.from_native(
            {"schema_version": 1, "model_name": model_dir, "system_name": system, "backend": "vllm",
             "backend_version": version, "tp_size": tp, "pp_size": 1})
    except Exception as exc:
        raise ConfigError(f"twin.step_time=aiconfigurator could not build its model of {model_dir} on {system}: "
                          f"{exc}; use twin.step_time=roofline") from exc
    finally:
        quiet.level = level
    return model.estimate_forward_pass_time_ms
