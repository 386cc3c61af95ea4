"""mode=export study.name=NAME: the confirmed winner of an existing study as serving configs.

The engine, workload and baseline are the study's own (recorded when it ran), never the command line's
defaults: the export must describe what was measured. A command line that sets any of them otherwise is
refused, naming the keys; an earlier export that differs from the new one is kept beside it, not lost."""

from __future__ import annotations

import datetime as dt
import filecmp
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import optuna
from omegaconf import DictConfig, OmegaConf
from rich.console import Console

from throttle_sweep.engines import make_engine
from throttle_sweep.errors import ConfigError
from throttle_sweep.settings.export import ExportRun, load_export
from throttle_sweep.settings.sections import arm_flags
from throttle_sweep.store.lock import hold
from throttle_sweep.store.provenance import conflicts, overrides_for, refuse_conflicts
from throttle_sweep.store.records import read_records
from throttle_sweep.sweep.export import export_best


def recorded_measurement(study: optuna.Study, out: Path) -> dict[str, Any]:
    """What the study measured: backend, engine (the base flags, nulls kept), baseline, workload, cost.
    A study written before these were kept in it has them in the config.yaml its sweep saved."""
    attrs = study.user_attrs
    found = {key: attrs[key] for key in ("backend", "engine", "baseline", "workload", "cost") if key in attrs}
    if len(found) < 5 and (out / "config.yaml").is_file():
        saved = OmegaConf.to_container(OmegaConf.load(out / "config.yaml"), resolve=True)
        for key in ("backend", "engine", "cost"):
            found.setdefault(key, saved.get(key))
    missing = [k for k in ("backend", "engine", "baseline", "workload") if found.get(k) is None]
    if missing:
        raise ConfigError(f"study {study.study_name!r} does not say which {', '.join(missing)} it measured, so its "
                          "winner cannot be exported faithfully; run the sweep again under a new study.name")
    found.setdefault("cost", None)
    return found


def export_winner(study: optuna.Study, out: Path, *, into: Path | None = None) -> dict[str, Path]:
    """The study in `out` exports its winner to `into`/best (by default `out`/best)."""
    winner = study.user_attrs.get("winner")
    if winner is None:
        raise ConfigError(f"study '{study.study_name}' has no confirmed winner to export (the sweep has not "
                          "finished, or no candidate was confirmed cheaper than the baseline)")
    measured = recorded_measurement(study, out)
    engine = make_engine(measured["backend"])  # only its engine_flags: what vLLM is given for these flags
    flags = engine.engine_flags(arm_flags(arm_flags(measured["engine"]), winner["params"]))
    flags.update(served_defaults(out, winner))  # the defaults it was measured with, resolved as `vllm serve` does
    cost = measured["cost"] or {}
    summary = {"ratio_vs_baseline": winner["ratio"], "ci": winner["ci"], "trial": winner["trial"],
               "baseline": measured["baseline"], "workload": measured["workload"], "study": study.study_name,
               "usd_per_gpu_hour_assumed": cost.get("usd_per_gpu_hour"), "gpus": cost.get("gpus"),
               **{k: winner[k] for k in ("p_best", "p_within_margin", "tiebreak") if k in winner},
               # what a recheck (mode=recheck) measures again, and the versions it was measured with
               "backend": measured["backend"], "engine": measured["engine"], "cost": cost or None,
               "measured_with": measured_with(out, winner)}
    remeasure = {"backend": measured["backend"], "engine": {**measured["engine"], **winner["params"]},
                 "workload": measured["workload"], **({"cost": cost} if cost else {})}
    return export_best((into or out) / "best", engine_flags=flags, params=winner["params"], summary=summary,
                       hydra_overrides=overrides_for(remeasure))


def winner_record(out: Path, winner: Mapping[str, Any], field: str) -> dict[str, Any] | None:
    """`field` of the first of the winner's confirmation runs (candidate arm) whose record has it."""
    path = out / "replicates.jsonl"
    if not path.is_file():
        return None
    for record in read_records(path):
        if (record.get("stage") == "confirm" and record.get("trial") == winner["trial"]
                and record.get("arm") == "candidate" and record.get(field)):
            return dict(record[field])
    return None


def served_defaults(out: Path, winner: Mapping[str, Any]) -> dict[str, Any]:
    """The flags left to vLLM's default that the winner's confirmation runs resolved as `vllm serve` does
    (records' `served_defaults`, in-process engines), so the export serves them on any machine."""
    return winner_record(out, winner, "served_defaults") or {}


VERSIONS = ("engine", "vllm_version", "torch_version", "driver_version", "device", "device_name")


def measured_with(out: Path, winner: Mapping[str, Any]) -> dict[str, Any] | None:
    """The engine, versions and device the winner's confirmation ran on (its records' `environment`)."""
    environment = winner_record(out, winner, "environment")
    return None if environment is None else {k: environment.get(k) for k in VERSIONS}


def export_keeping_the_old(study: optuna.Study, out: Path, say: Callable[[str], None]) -> dict[str, Path]:
    """Export; an earlier export with other contents is moved aside (and said), an identical one stays."""
    best = out / "best"
    if not best.exists():
        return export_winner(study, out)
    with tempfile.TemporaryDirectory(dir=out) as scratch:
        fresh = export_winner(study, out, into=Path(scratch))
        if not all((best / p.name).is_file() and filecmp.cmp(p, best / p.name, shallow=False) for p in fresh.values()):
            say(f"the earlier export differed from this one; it was moved to {move_aside(best)}")
            shutil.move(str(Path(scratch) / "best"), best)
    return {kind: best / path.name for kind, path in fresh.items()}


def move_aside(best: Path) -> Path:
    """An earlier export kept beside the new one, never lost: best.superseded-TIME (microseconds: two in a
    second cannot collide)."""
    kept = best.with_name(f"best.superseded-{dt.datetime.now():%Y%m%d-%H%M%S-%f}")
    best.rename(kept)
    return kept


def check_command_line(run: ExportRun, measured: Mapping[str, Any]) -> None:
    found = conflicts(measured, run.composed, run.overrides)
    refuse_conflicts(found, what=f"study {run.name!r} was measured with another configuration",
                     advice="mode=export takes the engine, workload and baseline from the study: leave these "
                            "keys off, or sweep them under a new study.name")


def run(cfg: DictConfig, console: Console) -> int:
    wanted = load_export(cfg)
    try:
        study = optuna.load_study(study_name=wanted.name, storage=wanted.storage)
    except KeyError:
        raise ConfigError(f"study.name={wanted.name!r}: no such study in {wanted.storage}") from None
    check_command_line(wanted, recorded_measurement(study, wanted.folder))
    with hold(wanted.folder, what=f"study {wanted.name!r}"):  # not while a sweep of it is still writing
        paths = export_keeping_the_old(study, wanted.folder, lambda msg: console.print(msg, highlight=False))
    for kind, path in paths.items():
        console.print(f"{kind}: {path}")
    return 0
