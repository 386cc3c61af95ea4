"""mode=analyze's settings, read from the config once and checked before any file is read."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from throttle_sweep.errors import ConfigError
from throttle_sweep.settings.sections import folder_name, thresholds_from
from throttle_sweep.stats.analysis import COST_BASES
from throttle_sweep.stats.verdict import Thresholds


@dataclass(frozen=True)
class AnalyzeRun:
    input: Path
    comparison: str | None  # the one to recompute (all whole ones when None)
    thresholds: Thresholds
    cost: str
    token_tolerance: float
    plots: bool
    out_root: Path  # where each analysis goes: results_dir/run, or beside the input


def load_analyze(cfg: DictConfig) -> AnalyzeRun:
    if not cfg.input:
        raise ConfigError("mode=analyze needs input=PATH (replicates.jsonl, or a CSV/JSONL of arm, order, "
                          "usd_per_mtok)")
    thresholds = thresholds_from(cfg)
    if cfg.compare.cost not in COST_BASES:
        raise ConfigError(f"compare.cost must be one of {', '.join(COST_BASES)}, but got {cfg.compare.cost!r}")
    path = Path(cfg.input)
    out_root = Path(cfg.results_dir) / folder_name(cfg.run, key="run") if cfg.run else path.parent
    return AnalyzeRun(input=path, comparison=cfg.comparison, thresholds=thresholds, cost=cfg.compare.cost,
                      token_tolerance=cfg.compare.token_tolerance, plots=bool(cfg.plots), out_root=out_root)
