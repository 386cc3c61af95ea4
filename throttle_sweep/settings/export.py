"""mode=export's settings, read from the config once and checked before the study is opened."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from throttle_sweep.errors import ConfigError
from throttle_sweep.settings.sections import measured_sections, user_overrides, workload_from
from throttle_sweep.settings.sweep import study_location


@dataclass(frozen=True)
class ExportRun:
    name: str  # the study's
    folder: Path  # results_dir/name: where the exports go
    storage: str
    composed: dict[str, Any]  # the engine, workload and baseline sections this command line composes
    overrides: list[str]  # the keys the user set on it (the only ones that can conflict with the study)


def load_export(cfg: DictConfig) -> ExportRun:
    if not cfg.study.name:
        raise ConfigError("mode=export needs study.name=NAME (the folder under results/)")
    name, out, storage = study_location(cfg)
    if cfg.study.storage is None and not (out / "study.db").is_file():
        raise ConfigError(f"study.name={name!r}: no study at {out / 'study.db'}")
    return ExportRun(name=name, folder=out, storage=storage,
                     composed=measured_sections(cfg, workload_from(cfg)), overrides=user_overrides())
