"""What a results folder measured, and whether this command line agrees with it.

A folder's answers hold only for the configuration its replicates ran with. Commands that come back to a
folder (a resumed run, `mode=export`) take that configuration from the folder, never from defaults the
command line happens to compose, and refuse a command line that sets something else, naming each key.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from throttle_sweep.errors import ConfigError
from throttle_sweep.settings.schema import CONF_DIR
from throttle_sweep.store.records import is_ok

# The sections of a configuration that decide what is measured (the rest says how to run or report it).
MEASURED = ("backend", "engine", "baseline", "candidate", "workload", "cost", "fake", "twin")


def set_on_command_line(overrides: Iterable[str]) -> tuple[set[str], set[str]]:
    """(whole sections, dotted keys) among MEASURED that the command line's overrides set: a key directly,
    or the keys a chosen config file sets (`+experiment=demo`, `engine=gpu`), read from the file itself
    (a section a file's own defaults choose, such as engine=gpu's workload, counts whole)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    sections: set[str] = set()
    keys: set[str] = set()
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        key = override.key_or_group
        if key.split(".")[0] not in MEASURED + ("experiment",):
            continue
        found = None if "." in key or override.is_delete() else option_keys(key, str(override.value()))
        if found is None:  # a value, or a file that cannot be found: take the section as set whole
            keys.add(key)
        else:
            sections.update(found[0])
            keys.update(found[1])
    return sections, keys


def option_keys(group: str, option: str) -> tuple[set[str], set[str]] | None:
    """(whole sections, dotted keys) that config file `group/option.yaml` sets, or None if it is not one."""
    import yaml
    from hydra.core.hydra_config import HydraConfig

    folders = [Path(CONF_DIR)]
    if HydraConfig.initialized():  # the user's own config folders (hydra.searchpath) too
        folders += [Path(s.path) for s in HydraConfig.get().runtime.config_sources if s.schema == "file"]
    for folder in folders:
        path = folder / group / f"{option}.yaml"
        if path.is_file():
            text = path.read_text()
            tree = yaml.safe_load(text) or {}
            chosen = {str(next(iter(d))).split(":")[0].removeprefix("override ").lstrip("/").split("@")[0]
                      for d in tree.pop("defaults", []) if isinstance(d, Mapping)}
            if "@package _global_" not in text.split("\n", 1)[0]:
                tree = {group: tree}
            return chosen & set(MEASURED), set(flatten(tree))
    return None


def lookup(tree: Mapping[str, Any], key: str) -> Any:
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def conflicts(recorded: Mapping[str, Any], now: Mapping[str, Any], overrides: Iterable[str]) -> dict[str, tuple]:
    """{dotted key: (recorded, now)} for every key the command line sets to something other than what was
    recorded. `recorded` and `now` hold the same sections (absent ones are not compared)."""
    sections, keys = set_on_command_line(overrides)
    wanted = {k for k in keys if k.split(".")[0] in recorded}
    for section in sections & set(recorded):
        wanted |= {k for k in flatten({section: recorded[section]}) | flatten({section: now.get(section)})}
    return differences(recorded, now, wanted)


def differences(recorded: Mapping[str, Any], now: Mapping[str, Any], keys: Iterable[str] | None = None
                ) -> dict[str, tuple]:
    """{dotted key: (recorded, now)} where they differ, over `keys` (None: every key of recorded's sections)."""
    if keys is None:
        keys = set(flatten(recorded)) | set(flatten({k: now.get(k) for k in recorded}))
    return {k: (lookup(recorded, k), lookup(now, k)) for k in sorted(keys) if lookup(recorded, k) != lookup(now, k)}


def refuse_conflicts(found: Mapping[str, tuple], *, what: str, advice: str) -> None:
    if found:
        listed = "; ".join(f"{k}={_show(now)} where it measured {_show(then)}" for k, (then, now) in found.items())
        raise ConfigError(f"{what}: this command line sets {listed}. {advice}")


def _show(value: Any) -> str:
    return "null (vLLM's default)" if value is None else repr(value)


READ_AS_OTHER = {"null", "true", "false", "nan", "inf", "-inf", "+inf"}


def hydra_value(value: Any) -> str:
    """A value as Hydra's override grammar reads it back, with no spaces (a shell splits on them)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    text = str(value)
    plain_word = re.fullmatch(r"[A-Za-z_][\w./:-]*", text) and text.lower() not in READ_AS_OTHER
    return text if plain_word else repr(text)  # else Hydra would read it as a number, a bool or null


def overrides_for(sections: Mapping[str, Any]) -> list[str]:
    """Overrides that compose exactly these sections again: engine flags with `++` (open dicts), the
    schema's sections (workload, cost) as plain keys, top-level values as they are."""
    out = []
    for section, value in sections.items():
        if not isinstance(value, Mapping):
            out.append(f"{section}={hydra_value(value)}")
            continue
        if section in ("engine", "baseline", "candidate"):  # open dicts: exactly these flags, none of the defaults'
            out += [f"~{section}", *(f"++{section}.{k}={hydra_value(v)}" for k, v in value.items())]
        else:
            out += [f"{section}.{k}={hydra_value(v)}" for k, v in value.items()]
    return out


# A run folder's configuration, as far as it decides what its records measured (per mode); the analysis'
# thresholds, timeouts, plots and where results go may change between runs of one folder.
RUN_KEYS = {
    "measure": ("mode", "backend", "engine", "workload", "cost", "endpoint.url", "endpoint.model"),
    "compare": ("mode", "backend", "engine", "baseline", "candidate", "workload", "cost", "endpoint.url",
                "endpoint.baseline_url", "endpoint.candidate_url", "endpoint.model", "compare.schedule",
                "compare.replicates", "compare.warmup_replicate", "compare.restart", "compare.restart_every",
                "compare.engine_warmup", "compare.engines_per_slot", "compare.lead", "compare.seed"),
    "sweep": ("mode", "backend"),  # a study checks the rest itself (commands/sweep.same_measurement)
    "capacity": ("mode", "backend", "engine", "workload", "cost", "slo", "capacity", "compare.restart",
                 "compare.restart_every", "compare.engine_warmup"),
    # (workload.target_rps only sizes the replicas: another one reads the same runs again)
    "goodput": ("mode", "backend", "engine", "baseline", "space", "workload", "cost", "slo", "capacity",
                "study.objective", "study.seed", "study.confirm_top", "compare.restart", "compare.restart_every",
                "compare.engine_warmup"),
}
NOT_MEASURED = {"workload.target_rps"}


def run_configuration(config: Mapping[str, Any], mode: str) -> dict[str, Any]:
    flat = {}
    for key in RUN_KEYS[mode]:
        value = lookup(config, key)
        flat.update(flatten({key: value}) if isinstance(value, Mapping) else {key: value})
    # a null flag is vLLM's default, as if absent
    return {k: v for k, v in flat.items() if v is not None and k not in NOT_MEASURED}


def claim_run_folder(out: Path, config: Mapping[str, Any], mode: str) -> None:
    """One folder, one configuration: a folder whose records were measured with another one is refused,
    naming what differs. A folder with no records yet takes this run's configuration."""
    from omegaconf import OmegaConf

    saved = out / "config.yaml"
    if not saved.is_file() or not has_records(out):
        return
    before = OmegaConf.to_container(OmegaConf.load(saved), resolve=True)
    then, now = run_configuration(before, mode), run_configuration(config, mode)  # "mode" is among them
    changed = {k: (then.get(k), now.get(k)) for k in sorted(set(then) | set(now)) if then.get(k) != now.get(k)}
    if changed:
        listed = "; ".join(f"{k}: {_show(a)} then, {_show(b)} now" for k, (a, b) in changed.items())
        raise ConfigError(f"{out} holds records of another configuration ({listed}); one folder holds one "
                          f"configuration, so its records are not mixed: choose another run=NAME (or study.name)")


def has_records(out: Path) -> bool:
    """Whether anything was measured in this folder: a replicate (a probe's included) that came back ok. A
    run whose every start failed measured nothing, and does not pin the folder to its configuration."""
    from throttle_sweep.store.records import iter_records

    records = out / "replicates.jsonl"
    return records.is_file() and any(is_ok(r) for r in iter_records(records))
