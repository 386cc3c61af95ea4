"""One config group at a time, to checked objects: the price, the workload, the engine, the arms' flags, warm
engines, slots, the decision thresholds. Every check here runs before any engine starts."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from throttle_sweep.engines import Engine, FakeKnobs, make_engine
from throttle_sweep.engines.base import engine_refusal
from throttle_sweep.engines.flags import check_flags
from throttle_sweep.engines.model_source import check_model_reachable
from throttle_sweep.errors import ConfigError, nearest
from throttle_sweep.measurement.cost import Price
from throttle_sweep.measurement.trace import counted
from throttle_sweep.measurement.workload import WorkloadSpec
from throttle_sweep.models import TINY_QWEN2, model_config
from throttle_sweep.stats.analysis import COST_BASES
from throttle_sweep.stats.verdict import Thresholds


def plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


def price_from(cfg: DictConfig, *, typed: bool = False) -> Price:
    """cost.usd_per_gpu_hour and gpus; `typed`: cost.prices may be set (a goodput sweep reads it), elsewhere
    it would be silently ignored, so it is refused."""
    if not typed and cfg.cost.get("prices") is not None:
        raise ConfigError("cost.prices prices GPU types for a goodput sweep (study.objective=goodput with "
                          "ray.enabled=true); this run has one price: set cost.usd_per_gpu_hour instead")
    kwh = cfg.cost.get("usd_per_kwh")
    price = Price(float(cfg.cost.usd_per_gpu_hour), int(cfg.cost.gpus), kwh)
    price.check()
    if kwh is not None and (why := no_energy_counter(cfg)) is not None:
        raise ConfigError(f"cost.usd_per_kwh={kwh:g} prices the energy the engine's GPUs use, read from NVML's "
                          f"energy counter, and there is no energy counter for this run: {why}; leave "
                          "cost.usd_per_kwh unset (null) to price GPU-hours alone")
    return price


def no_energy_counter(cfg: DictConfig) -> str | None:
    """Why this run's replicates will have no energy to price, told before any engine starts; None where they
    can. On Ray the slots' GPUs are not this machine's: a replicate without a reading fails there."""
    from throttle_sweep.measurement import energy

    if cfg.mode not in ("measure", "compare", "sweep"):
        return f"mode={cfg.mode} prices capacity at a request rate, not a replicate's measured energy"
    if cfg.mode == "sweep" and cfg.study.objective == "goodput":
        return "study.objective=goodput prices capacity at a request rate, not a replicate's measured energy"
    if cfg.backend not in ("vllm", "server"):
        return (f"backend={cfg.backend} " + ("measures servers you run, whose GPUs this process cannot read"
                                             if cfg.backend == "endpoint" else "runs on no GPU"))
    if cfg.ray.enabled:
        return None
    meter = energy.open_meter(1)
    return meter if isinstance(meter, str) else None


def workload_from(cfg: DictConfig) -> WorkloadSpec:
    """The workload; ShareGPT text is counted with the named model's tokenizer unless another is named."""
    # (target_rps is the traffic a fleet serves, not a run's: settings/goodput.py reads it)
    given = {k: v for k, v in plain(cfg.workload).items() if k != "target_rps"}
    unknown = sorted(set(given) - {f.name for f in fields(WorkloadSpec)})
    if unknown:  # `+workload.KEY=...` adds a key the schema does not know
        near = {k: nearest(k, [f.name for f in fields(WorkloadSpec)], n=1) for k in unknown}
        raise ConfigError("unknown workload key(s) " + ", ".join(
            f"'workload.{k}'" + (f" (nearest valid: workload.{m[0]})" if m else "") for k, m in near.items()))
    spec = WorkloadSpec(**given)
    model = (plain(cfg.engine) or {}).get("model")
    if spec.sharegpt is not None and spec.tokenizer is None and model is not None:
        spec = replace(spec, tokenizer=model)
    return counted(spec, named=chosen("workload") == "trace", overrides=user_overrides())


def engine_from(cfg: DictConfig) -> Engine:
    check_gpu_engine(cfg)
    knobs = FakeKnobs(**plain(cfg.fake)) if cfg.backend == "fake" else None
    server, endpoint = plain(cfg.server), plain(cfg.endpoint)
    for group, key in (("server", "start_timeout_s"), ("server", "stop_grace_s"), ("server", "request_timeout_s"),
                       ("endpoint", "request_timeout_s")):
        value = {"server": server, "endpoint": endpoint}[group][key]
        if not isinstance(value, int | float) or value <= 0:
            raise ConfigError(f"{group}.{key} must be a positive number of seconds, but got {value!r}")
    server["log_dir"] = str(Path(server["log_dir"] or Path(cfg.results_dir) / "server-logs").absolute())
    return make_engine(cfg.backend, fake_knobs=knobs, server=server, endpoint=endpoint, twin=plain(cfg.twin))


def check_gpu_engine(cfg: DictConfig) -> None:
    """engine=gpu with an engine this machine runs (backend=vllm or server, no Ray cluster) needs a CUDA GPU
    here: said at once, before a model is looked up or an engine started on the CPU instead. And its space
    is not the CPU build's KV sizes of a few MiB (space=memory), which vLLM refuses for a real model."""
    from throttle_sweep.engines import gpu_found

    if chosen("engine") != "gpu":
        return
    if chosen("space") == "memory":
        raise ConfigError("engine=gpu with +space=memory: that space sweeps kv_cache_memory_bytes of 4-64 MiB, "
                          "sized for the CPU build's tiny model, which vLLM refuses for a real model's KV cache; "
                          "on a GPU sweep +space=gpu_memory (gpu_memory_utilization, kv_cache_dtype, block_size)")
    if cfg.backend not in ("vllm", "server") or cfg.ray.enabled:
        return
    if (why := gpu_found.no_gpu()) is not None:
        raise ConfigError(f"engine=gpu with backend={cfg.backend} needs a CUDA GPU on this machine, and there is "
                          f"no CUDA GPU here: {why}. To run the GPU path without one, simulate a GPU with "
                          f"{gpu_found.TWIN_HINT}; for the CPU build's tiny model, leave out engine=gpu")


def chosen(group: str) -> str | None:
    """The option a config group was composed with (engine=gpu: 'gpu'); None outside a Hydra run."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    return HydraConfig.get().runtime.choices.get(group)


ARMS_OF = {"measure": ("url",), "compare": ("baseline_url", "candidate_url")}


def endpoint_arms(cfg: DictConfig) -> dict[str, dict[str, Any]]:
    """backend=endpoint: each arm is a server the user runs, named by URL (endpoint.url for mode=measure;
    endpoint.baseline_url and endpoint.candidate_url for mode=compare, or endpoint.url for both: an A/A).
    Its flags are the server's own, so a flag given on the command line is an error, not silently ignored.
    Each URL must answer as a vLLM server before anything is measured."""
    from throttle_sweep.engines.endpoint import check_endpoint

    if cfg.mode not in ARMS_OF:
        raise ConfigError(f"backend=endpoint runs mode=measure or mode=compare, not mode={cfg.mode}: it cannot set "
                          "flags on a server it did not start; sweep with backend=server (vLLM's API server, "
                          "started by throttle_sweep for each configuration)")
    flagged = [o for o in user_overrides() if o.lstrip("+~").split(".")[0] in ("engine", "baseline", "candidate")]
    if flagged:
        raise ConfigError(f"backend=endpoint measures servers you already run: it cannot set their flags "
                          f"({', '.join(flagged)}); start each server with the flags you want and name it by "
                          "URL (endpoint.url, endpoint.baseline_url, endpoint.candidate_url)")
    ep = plain(cfg.endpoint)
    arms = {}
    for key in ARMS_OF[cfg.mode]:
        source = key if ep.get(key) is not None or key == "url" else "url"
        if ep.get(source) is None:
            raise ConfigError(f"backend=endpoint needs endpoint.{key}=URL (or endpoint.url=URL for both arms)"
                              if key != "url" else "backend=endpoint needs endpoint.url=URL: the server to measure")
        listed = check_endpoint(ep[source], key=f"endpoint.{source}", api_key_env=ep["api_key_env"])
        model = ep["model"] or listed
        arms[key.removesuffix("_url") if key != "url" else "measure"] = {"url": ep[source], "model": model}
    return arms


def user_overrides() -> list[str]:
    """The command line's key=value overrides (Hydra's), or none outside a Hydra run."""
    from hydra.core.hydra_config import HydraConfig

    try:
        return list(HydraConfig.get().overrides.task)
    except ValueError:
        return []


def warm_engines_from(cfg: DictConfig) -> dict[str, Any]:
    """How a slot keeps its engines warm (compare.restart and friends), checked: the WarmSlot's keywords."""
    from throttle_sweep.cluster.slot import check_restart

    c = cfg.compare
    check_restart(c.restart, c.restart_every, c.engine_warmup)
    if not isinstance(c.engines_per_slot, int) or c.engines_per_slot < 1:
        raise ConfigError(f"compare.engines_per_slot must be an integer >= 1, but got {c.engines_per_slot!r}")
    return {"restart": c.restart, "restart_every": c.restart_every, "engines": c.engines_per_slot,
            "engine_warmup": c.engine_warmup}


def slots_from(cfg: DictConfig) -> tuple[int, str]:
    """How many slots a sweep runs on this machine (pool.local_slots), checked; Ray has its own (ray.slots)."""
    from throttle_sweep.cluster.pool import local_slots
    from throttle_sweep.engines.vllm_inproc import cpu_build

    if cfg.ray.enabled:
        if cfg.slots is not None:
            raise ConfigError(f"slots={cfg.slots} counts slots on this machine; with ray.enabled=true the cluster's "
                              "slots are ray.slots")
        return 0, "ray"
    return local_slots(cfg.slots, backend=cfg.backend, cpu_engine=cfg.backend in ("vllm", "server") and cpu_build())


def single_arm(cfg: DictConfig, engine: Engine, spec: WorkloadSpec) -> dict[str, Any]:
    """The flags of a mode that measures one configuration (measure, capacity): a server the user runs (its
    URL, checked to answer), or `engine`'s flags, checked against the engine before it starts."""
    if cfg.backend == "endpoint":
        return endpoint_arms(cfg)["measure"]
    flags = arm_flags(plain(cfg.engine))
    preflight(engine, flags, spec, source="engine")
    return flags


def arm_flags(base: Mapping[str, Any], overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Engine flags for one arm: `base` with non-null `overrides` on top; nulls mean vLLM's default."""
    flags = {k: v for k, v in dict(base).items() if v is not None}
    flags.update({k: v for k, v in dict(overrides or {}).items() if v is not None})
    return flags


def measured_sections(cfg: DictConfig, spec: WorkloadSpec) -> dict[str, Any]:
    """What a study records it measured with (a resume, or an export's command line, must match it)."""
    engine = plain(cfg.engine)
    return {"backend": cfg.backend, "engine": engine, "baseline": arm_flags(arm_flags(engine), plain(cfg.baseline)),
            "workload": asdict(spec), "cost": plain(cfg.cost)}


def is_local_path(model: str) -> bool:
    return model.startswith(("/", "./", "../", "~")) or Path(model).exists()


def preflight(engine: Engine, flags: Mapping[str, Any], spec: WorkloadSpec, *, source: str,
              refusals: bool = True) -> None:
    """Check one arm's flags and the workload against them; raises ConfigError naming the bad key. With
    `refusals`, flags the engine would refuse at start (vLLM's own config checks) are an error too; a sweep's
    space is not checked so (its search tells refused proposals to the study: sweep/refusals.py)."""
    check_flags(flags, engine.flag_schema(), source=source)
    for key in ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "kv_cache_memory_bytes",
                "block_size", "tensor_parallel_size"):
        value = flags.get(key)
        if value is not None and value <= 0:
            raise ConfigError(f"{source}.{key} must be a positive integer, but got {value!r}")
    check_data_parallel(engine, flags, source=source)
    model = flags.get("model")
    if model is not None and is_local_path(str(model)):
        path = Path(str(model)).expanduser()
        if not path.is_dir():
            raise ConfigError(f"{source}.model: no such model folder {str(model)!r}")
    elif model is not None and engine.name in ("vllm", "server"):  # engines that load the model themselves
        check_model_reachable(str(model), source=source)
    config = model_config(str(Path(str(model)).expanduser()) if model else str(TINY_QWEN2)) or {}
    max_len = flags.get("max_model_len") or config.get("max_position_embeddings")
    spec.check(max_model_len=max_len)
    if model is None and spec.jsonl is not None:
        _check_token_prompts(spec)
    if refusals and (why := engine_refusal(engine, flags)) is not None:
        given = " ".join(f"{k}={v}" for k, v in sorted(flags.items()))
        raise ConfigError(f"{source}: the engine refuses these flags ({given}) at start: {why}")


def check_data_parallel(engine: Engine, flags: Mapping[str, Any], *, source: str) -> None:
    """vLLM's in-process class (LLM) refuses data_parallel_size > 1 at start, as vllm/entrypoints/llm.py does
    unless an external launcher runs each rank: refused before it starts, where the flags are not to blame."""
    size = flags.get("data_parallel_size") or 1
    if engine.name == "vllm" and size > 1 and flags.get("distributed_executor_backend") != "external_launcher":
        raise ConfigError(f"{source}.data_parallel_size={size}: vLLM's in-process engine (backend=vllm, its LLM "
                          "class) runs one data-parallel rank only; use backend=server (vLLM's API server runs "
                          "every rank), or data_parallel_size=1")


def _check_token_prompts(spec: WorkloadSpec) -> None:
    from throttle_sweep.measurement.workload import make_requests

    if any(r.prompt_token_ids is None for r in make_requests(spec)):
        raise ConfigError(f"workload.jsonl {spec.jsonl!r}: the embedded model has no tokenizer, so prompts "
                          "must be 'prompt_token_ids'; name a real model (engine.model=...) for text prompts")


def folder_name(name: str, *, key: str) -> str:
    """A name that makes one folder directly under results_dir: it may not leave it or nest."""
    if not name or "/" in name or "\\" in name or name in (".", ".."):
        raise ConfigError(f"{key} must be a plain folder name (no '/', not '.' or '..'), but got {name!r}")
    return name


def run_dir(cfg: DictConfig, default_name: str | None = None) -> Path:
    name = cfg.run or default_name or f"{cfg.mode}-{dt.datetime.now():%Y%m%d-%H%M%S}"
    return Path(cfg.results_dir) / folder_name(name, key="run")


def thresholds_from(cfg: DictConfig) -> Thresholds:
    t = Thresholds(cfg.compare.alpha, cfg.compare.min_effect, cfg.compare.equivalence_margin)
    t.check()
    return t


def cost_basis_from(cfg: DictConfig) -> str:
    """The cost a verdict judges; an open loop's cost follows its arrival schedule, not the engine, so it is
    judged only when asked for by name."""
    basis, loop = cfg.compare.cost, cfg.workload.loop
    if basis not in COST_BASES:
        raise ConfigError(f"compare.cost must be one of {', '.join(COST_BASES)}, but got {basis!r}")
    if loop == "open" and basis != "offered_load":
        raise ConfigError(
            f"workload.loop=open with compare.cost={basis}: an open loop's cost per token follows the arrival "
            "rate (the engine idles between arrivals), not the flags; judge cost on a closed loop "
            "(workload=closed_loop), keep the open loop for latency limits in mode=measure, or set "
            "compare.cost=offered_load to judge cost at this offered load on purpose")
    if loop == "closed" and basis == "offered_load":
        raise ConfigError("compare.cost=offered_load needs workload.loop=open; a closed loop has no offered load")
    return basis
