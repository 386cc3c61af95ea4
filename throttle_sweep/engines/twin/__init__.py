"""The GPU twin: a simulated GPU engine on a virtual clock (engine.py), from a GPU's datasheet (gpus.py) and a
model's config.json (model_shape.py): step times (step_time.py) and the KV cache vLLM would allocate
(memory.py). It predicts; a real GPU's figures recalibrate it (docs/twin.md)."""

from __future__ import annotations

from throttle_sweep.engines.twin.engine import StartCosts, TwinConf, TwinEngine
from throttle_sweep.engines.twin.gpus import GPUS, GpuSpec, gpu_spec

__all__ = ["GPUS", "GpuSpec", "StartCosts", "TwinConf", "TwinEngine", "gpu_spec"]
