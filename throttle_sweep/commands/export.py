"""mode=export study.name=NAME: the confirmed winner of an existing study as serving configs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
from omegaconf import DictConfig
from rich.console import Console

from throttle_sweep.errors import ConfigError
from throttle_sweep.runlock import hold
from throttle_sweep.search.export import export_best
from throttle_sweep.settings import arm_flags, engine_from, plain


def export_winner(cfg: DictConfig, engine: Any, study: optuna.Study, out: Path) -> dict[str, Path]:
    winner = study.user_attrs.get("winner")
    if winner is None:
        raise ConfigError(f"study '{study.study_name}' has no confirmed winner to export (the sweep has not "
                          "finished, or no candidate was confirmed cheaper than the baseline)")
    flags = engine.engine_flags(arm_flags(plain(cfg.engine), winner["params"]))
    overrides = [f"++engine.{k}={v}" for k, v in sorted(winner["params"].items())]
    summary = {"ratio_vs_baseline": winner["ratio"], "ci": winner["ci"], "trial": winner["trial"],
               "baseline": study.user_attrs.get("baseline"), "study": study.study_name,
               "usd_per_gpu_hour_assumed": cfg.cost.usd_per_gpu_hour}
    return export_best(out / "best", engine_flags=flags, params=winner["params"], summary=summary,
                       hydra_overrides=overrides)


def run(cfg: DictConfig, console: Console) -> int:
    from throttle_sweep.commands.sweep import study_location

    if not cfg.study.name:
        raise ConfigError("mode=export needs study.name=NAME (the folder under results/)")
    name, out, storage = study_location(cfg)
    if cfg.study.storage is None and not (out / "study.db").is_file():
        raise ConfigError(f"study.name={name!r}: no study at {out / 'study.db'}")
    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        raise ConfigError(f"study.name={name!r}: no such study in {storage}") from None
    with hold(out, what=f"study {name!r}"):  # not while a sweep of it is still writing
        paths = export_winner(cfg, engine_from(cfg), study, out)
    for kind, path in paths.items():
        console.print(f"{kind}: {path}")
    return 0
