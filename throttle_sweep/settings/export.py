"""mode=export's settings, read from the config once and checked before the study is opened."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

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
    if (words := goodput_words(name, out)) is not None:  # whatever study.storage holds: not a cost sweep's study
        raise ConfigError(words)
    if cfg.study.storage is None and not (out / "study.db").is_file():
        raise ConfigError(f"study.name={name!r}: no study at {out / 'study.db'}")
    return ExportRun(name=name, folder=out, storage=storage,
                     composed=measured_sections(cfg, workload_from(cfg)), overrides=user_overrides())


def goodput_words(name: str, out: Path) -> str | None:
    """For a goodput sweep's folder (its config.yaml says study.objective=goodput), whose study (in memory, or at
    study.storage) is not exported from: what the folder holds, and where its export is (best/, written by the
    sweep itself). None for any other."""
    saved = out / "config.yaml"
    if not saved.is_file() or OmegaConf.load(saved).get("study", {}).get("objective") != "goodput":
        return None
    held = [f for f in ("replicates.jsonl", "summary.json", "best") if (out / f).exists()]
    head = (f"study.name={name!r} is a goodput sweep (study.objective=goodput in {saved}), whose study "
            f"mode=export does not read; "
            f"{out} holds {', '.join(held) or 'no records yet'}")
    best = out / "best"
    if best.is_dir():
        files = ", ".join(sorted(p.name for p in best.iterdir()))
        return (f"{head}. Its export is the best/ folder the sweep wrote when it confirmed its winner: {best} "
                f"({files}); mode=export has nothing to add. To write it again, run the sweep's command again: it "
                "replays its records and measures nothing again")
    return (f"{head}, and no best/ folder: the sweep writes its export there once it confirms a winner. To finish "
            "it, run the sweep's command again (it goes on from its records); if it finished, its summary.json "
            "says why no configuration was exported")
