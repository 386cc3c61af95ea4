"""mode=recheck's settings: the export to re-certify (a study's best/, or any best/ folder), the experiment it
records, and the compare that repeats it, all read and checked before any engine starts.

A recheck repeats the recorded experiment with one thing free: the software and driver it runs on. So
anything else that would make it another experiment (the command line setting the engine, workload, baseline,
backend or price otherwise; a deployed flag that was not under test changed; another kind of device) is a
setup difference, refused with each one named. The flags under test are the winner's parameters and the
defaults vLLM resolved for it, which the export pins: these are read from the deployed vllm_config.yaml."""

from __future__ import annotations

import copy
import datetime as dt
import json
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, open_dict

from throttle_sweep.engines import Engine, make_engine
from throttle_sweep.errors import ConfigError
from throttle_sweep.settings.compare import CompareRun, load_compare
from throttle_sweep.settings.sections import (
    arm_flags,
    engine_from,
    folder_name,
    measured_sections,
    user_overrides,
    workload_from,
)
from throttle_sweep.settings.sweep import study_location
from throttle_sweep.store.provenance import conflicts
from throttle_sweep.sweep.export import serve_flags

RECORDED = ("backend", "engine", "baseline", "workload", "cost")  # the sections the recheck takes from the export


class SetupDiffers(ConfigError):
    """The recheck would not repeat the recorded experiment (exit 2, each difference named)."""


@dataclass(frozen=True)
class RecheckRun:
    compare: CompareRun  # the interleaved comparison that re-measures the export
    config: DictConfig  # its configuration, as its folder records it
    best: Path
    study: str | None
    under_test: dict[str, Any]  # the deployed values of the flags under test (None: vLLM's default)
    claimed: tuple[float, float, float]  # the study's confirmed ratio and interval
    measured_with: dict[str, Any] | None  # the engine, versions and device the winner was confirmed on


def load_recheck(cfg: DictConfig) -> RecheckRun:
    best, home = export_folder(cfg)
    summary, deployed = read_export(best)
    recorded = recorded_experiment(summary, best)
    candidate, under_test, differ = deployed_candidate(recorded, summary, deployed)
    composed = measured_sections(cfg, workload_from(cfg))
    differ.update({f"{k} (command line)": v for k, v in
                   conflicts({k: recorded[k] for k in RECORDED}, composed, user_overrides()).items()})
    measured_with = summary.get("measured_with") or from_study_records(best, summary)
    derived = compare_config(cfg, recorded, candidate, home)
    engine = engine_from(derived)
    differ.update({f"{k} (this machine)": v for k, v in device_differences(measured_with, engine).items()})
    if differ:
        listed = "; ".join(f"{k}: {show(then)} then, {show(now)} now" for k, (then, now) in differ.items())
        raise SetupDiffers(f"setup differs from what {best} was measured with: {listed}. A recheck repeats the "
                           "recorded experiment (only vLLM, torch and the driver may change): leave these as "
                           "they were measured, or sweep again")
    run = load_compare(derived)  # the engine and both arms checked as mode=compare checks them
    return RecheckRun(compare=run, config=derived, best=best, study=summary.get("study"), under_test=under_test,
                      claimed=(summary["ratio_vs_baseline"], *summary["ci"]), measured_with=measured_with)


def export_folder(cfg: DictConfig) -> tuple[Path, Path]:
    """(the best/ folder, the folder the recheck's own folder goes in)."""
    chosen = [o for o in user_overrides() if o.lstrip("+~").startswith(("candidate", "space"))]
    if chosen:
        raise ConfigError(f"mode=recheck measures the deployed vllm_config.yaml as the candidate, so "
                          f"{', '.join(chosen)} has no place on its command line: edit the deployed file, or "
                          "compare other flags with mode=compare")
    given = cfg.recheck.best
    if cfg.study.name and given:
        raise ConfigError(f"mode=recheck takes one of study.name or recheck.best, but got study.name="
                          f"{cfg.study.name!r} and recheck.best={given!r}")
    if given:
        best = Path(given).expanduser()
        if not best.is_dir():
            raise ConfigError(f"recheck.best={given!r}: no such folder (a best/ folder mode=sweep or mode=export "
                              "wrote)")
        return best, Path(cfg.results_dir)
    if not cfg.study.name:
        raise ConfigError("mode=recheck needs study.name=NAME or recheck.best=PATH: the study whose exported "
                          "winner it re-measures (results/NAME/best), or a best/ folder")
    name, out, _ = study_location(cfg)
    if not out.is_dir():
        raise ConfigError(f"study.name={name!r}: no study folder {out}")
    if not (out / "best").is_dir():
        raise ConfigError(f"study.name={name!r}: {out} holds no best/ export (the sweep exports its confirmed "
                          "winner there; mode=export study.name=NAME writes it again)")
    return out / "best", out


def read_export(best: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(best.json, the deployed vllm_config.yaml as engine flags)."""
    files = {name: best / name for name in ("best.json", "vllm_config.yaml")}
    for name, path in files.items():
        if not path.is_file():
            raise ConfigError(f"{best}: no {name} (a best/ folder holds the export's vllm_config.yaml and "
                              "best.json; mode=export study.name=NAME writes them again)")
    try:
        summary = json.loads(files["best.json"].read_text())
        served = yaml.safe_load(files["vllm_config.yaml"].read_text()) or {}
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{best}: best.json or vllm_config.yaml cannot be read ({exc})") from None
    missing = [k for k in ("params", "engine_flags", "baseline", "workload", "ratio_vs_baseline", "ci")
               if not isinstance(summary, dict) or k not in summary]
    if missing or not isinstance(served, dict):
        raise ConfigError(f"{files['best.json']}: not an export of a confirmed winner (no "
                          f"{', '.join(missing) or 'vllm_config.yaml mapping'})")
    return summary, deployed_flags(served)


def deployed_flags(served: Mapping[str, Any]) -> dict[str, Any]:
    """vllm_config.yaml's keys back to engine flags: `max-num-seqs` -> max_num_seqs, `no-FLAG: true` -> FLAG
    false (how the export writes a flag turned off; sweep/export.py)."""
    flags = {}
    for key, value in served.items():
        name = str(key).replace("-", "_")
        if name.startswith("no_") and value is True:
            flags[name[3:]] = False
        else:
            flags[name] = value
    return flags


def recorded_experiment(summary: Mapping[str, Any], best: Path) -> dict[str, Any]:
    """The backend, engine, baseline, workload and price the winner was measured with: best.json's, or (an
    export written before it kept them) the study's beside it."""
    found = {k: summary.get(k) for k in RECORDED}
    if found["backend"] is None or found["engine"] is None:
        study = best.parent / "study.db"
        if not study.is_file():
            raise ConfigError(f"{best / 'best.json'} does not say which backend and engine it measured (an export "
                              "made before mode=recheck), and no study.db is beside it: run mode=export "
                              "study.name=NAME again to write them")
        import optuna

        from throttle_sweep.commands.export import recorded_measurement

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        try:
            loaded = optuna.load_study(study_name=summary.get("study"), storage=f"sqlite:///{study}")
        except KeyError:
            raise ConfigError(f"{best / 'best.json'} names study {summary.get('study')!r}, which {study} does not "
                              "hold: run mode=export study.name=NAME again") from None
        found = {**recorded_measurement(loaded, best.parent), **{k: v for k, v in found.items() if v is not None}}
    found["cost"] = found.get("cost") or {}
    return found


def from_study_records(best: Path, summary: Mapping[str, Any]) -> dict[str, Any] | None:
    """The environment the winner was confirmed on, from the study's records beside an older export."""
    from throttle_sweep.commands.export import measured_with

    return measured_with(best.parent, {"trial": summary.get("trial")}) if "trial" in summary else None


def deployed_candidate(recorded: Mapping[str, Any], summary: Mapping[str, Any], deployed: Mapping[str, Any]
                       ) -> tuple[dict[str, Any], dict[str, Any], dict[str, tuple]]:
    """(the candidate arm's flags, the deployed values of the flags under test, the deployed flags not under
    test that differ from the export). Under test: the winner's parameters, and the defaults vLLM resolved for
    it that the export pins (whatever the engine adds by itself, such as the embedded model, is neither)."""
    engine = make_engine(recorded["backend"])  # only its engine_flags, as the export used them
    params = dict(summary["params"])
    exported = dict(summary["engine_flags"])
    as_measured = serve_flags(engine.engine_flags(arm_flags(arm_flags(recorded["engine"]), params)))
    under_test = {k: deployed.get(k) for k in sorted(set(params) | (set(exported) - set(as_measured)))}
    fixed = sorted((set(exported) | set(deployed)) - set(under_test))
    differ = {f"{k} (vllm_config.yaml, not under test)": (exported.get(k), deployed.get(k))
              for k in fixed if exported.get(k) != deployed.get(k)}
    base = {k: v for k, v in arm_flags(recorded["engine"]).items() if k not in under_test}
    return {**base, **{k: v for k, v in under_test.items() if v is not None}}, under_test, differ


def compare_config(cfg: DictConfig, recorded: Mapping[str, Any], candidate: Mapping[str, Any], home: Path
                   ) -> DictConfig:
    """This command line's configuration with the recorded experiment in it: the baseline against the deployed
    candidate, in a folder of its own under `home` (run=NAME, or recheck-TIME)."""
    derived = copy.deepcopy(cfg)
    with open_dict(derived):
        derived.backend = recorded["backend"]
        derived.engine = dict(recorded["engine"])
        derived.baseline = dict(recorded["baseline"])
        derived.candidate = dict(candidate)
        for section in ("workload", "cost"):  # typed sections: key by key
            for key, value in recorded[section].items():
                derived[section][key] = value
        derived.results_dir = str(home)
        derived.run = folder_name(cfg.run or f"recheck-{dt.datetime.now():%Y%m%d-%H%M%S}", key="run")
    return derived


def device_here(engine: Engine) -> dict[str, Any]:
    """The kind of device this machine gives `engine`, told without starting it (nor importing vLLM)."""
    if engine.name not in ("vllm", "server"):  # the fake and the twin say it themselves
        return {k: engine.environment().get(k) for k in ("device", "device_name")}
    from throttle_sweep.engines import gpu_found
    from throttle_sweep.engines.vllm_inproc import cpu_build

    if cpu_build():
        return {"device": "cpu", "device_name": platform.processor()}
    return {"device": "cuda", "device_name": gpu_found.gpu_name()}


def device_differences(measured_with: Mapping[str, Any] | None, engine: Engine) -> dict[str, tuple]:
    """{key: (then, now)} for the device kind and name, where both are known and differ."""
    if not measured_with:
        return {}
    now = device_here(engine)
    return {k: (measured_with.get(k), now.get(k)) for k in ("device", "device_name")
            if measured_with.get(k) and now.get(k) and measured_with.get(k) != now.get(k)}


def show(value: Any) -> str:
    return "unset (vLLM's default)" if value is None else repr(value)

