"""mode=measure: one configuration, measured once."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf
from rich.console import Console

from throttle_sweep.measure import measure_replicate, one_line
from throttle_sweep.records import append_record
from throttle_sweep.settings import (
    arm_flags,
    engine_from,
    plain,
    preflight,
    price_from,
    run_dir,
    workload_from,
)


def run(cfg: DictConfig, console: Console) -> int:
    price, spec, engine = price_from(cfg), workload_from(cfg), engine_from(cfg)
    flags = arm_flags(plain(cfg.engine))
    preflight(engine, flags, spec, source="engine")
    out = run_dir(cfg)
    out.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, out / "config.yaml")
    console.print(f"measuring {flags} on {engine.name} ...")
    record = measure_replicate(engine, flags, spec, price, run_id=out.name, arm="measure", position=0)
    path = out / "replicates.jsonl"
    append_record(path, record)
    console.print(one_line(record, price))
    console.print(f"record: {path}")
    return 0 if record["status"] == "ok" else 1
