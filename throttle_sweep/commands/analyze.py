"""mode=analyze input=PATH: recompute a comparison from raw records, with no engine."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig
from rich.console import Console

from throttle_sweep.analysis import COST_BASES, analyse, check_positions, load_input, split_joint
from throttle_sweep.commands.compare import thresholds_from
from throttle_sweep.cost import Price
from throttle_sweep.errors import ConfigError
from throttle_sweep.report import lines, write


def run(cfg: DictConfig, console: Console) -> int:
    if not cfg.input:
        raise ConfigError("mode=analyze needs input=PATH (replicates.jsonl, or a CSV/JSONL of arm, order, usd_per_mtok)")
    thresholds = thresholds_from(cfg)
    if cfg.compare.cost not in COST_BASES:
        raise ConfigError(f"compare.cost must be one of {', '.join(COST_BASES)}, but got {cfg.compare.cost!r}")
    path = Path(cfg.input)
    records = load_input(path)
    by_comparison: dict[str | None, list[dict]] = {}
    for record in records:
        by_comparison.setdefault(record.get("comparison"), []).append(record)
    groups: dict[str | None, list[dict]] = {}  # a joint confirmation: one comparison per candidate
    for comparison, group in by_comparison.items():
        for trial, view in split_joint(group):
            groups[comparison if trial is None else f"{comparison}-trial-{trial}"] = view
    out_root = Path(cfg.results_dir) / cfg.run if cfg.run else path.parent
    for i, (comparison, group) in enumerate(groups.items()):
        check_positions(group, str(path))
        first = group[0]
        price = (Price(first["usd_per_gpu_hour"], first["gpus"]) if "usd_per_gpu_hour" in first else None)
        analysis = analyse(group, thresholds, token_tolerance=cfg.compare.token_tolerance, strict=True,
                           cost=cfg.compare.cost)
        if len(groups) > 1:
            console.print(f"[bold]comparison {comparison}[/]")
        for line in lines(analysis, thresholds, price):
            console.print(line, highlight=False)
        out = out_root / "analysis" / (comparison or f"input-{i}")
        console.print(f"summary: {write(out, analysis, thresholds, price, plot=cfg.plots)['md']}")
    return 0
