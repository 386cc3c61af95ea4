"""The command line checked before Hydra runs the job: a config that does not compose becomes the tool's own
one-line error (a YAML file's line and column, a misspelt key's nearest valid names), not Hydra's traceback.

It composes once with Hydra's public compose API, the way `hydra.main` will (about 0.2 s); what it does not
recognise it leaves to Hydra, which fails the same way and reports it."""

from __future__ import annotations

import os
from typing import Any

import yaml
from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

from throttle_sweep.errors import ConfigError, nearest

FLAG_NODES = ("engine", "baseline", "candidate")


def causes(exc: BaseException | None):
    while exc is not None:
        yield exc
        exc = exc.__cause__ or exc.__context__


def explain(exc: BaseException, overrides: list[str], conf_dir: str) -> str | None:
    """One line for a composition failure, or None for anything we do not recognise (Hydra reports it)."""
    chain = list(causes(exc))
    for e in chain:
        if isinstance(e, yaml.MarkedYAMLError):
            return yaml_message(e)
    if isinstance(exc, MissingConfigException):
        msg = str(exc).splitlines()[0]
        return msg + (f"; available: {', '.join(exc.options)}" if exc.options else "")
    if isinstance(exc, OverrideParseException):
        return f"cannot parse override: {str(exc).splitlines()[0]} (see `--help`)"
    for e in chain:
        if isinstance(e, ConfigAttributeError | ConfigKeyError) and e.full_key:
            return unknown_key_message(e, overrides, conf_dir)
        if isinstance(e, ValidationError) and e.full_key:
            return f"{e.full_key}: {str(e.msg or e).splitlines()[0]}"
    first = str(exc).splitlines()[0] if str(exc) else ""
    if first.startswith("Ambiguous value for argument"):
        arg = first.partition("argument ")[2].strip("'")
        return (f"'{arg}': a comma separates sweep values; write a list as key=[a,b] "
                "or quote a string: key='a,b'")
    if first.startswith("Config group override must be a string"):
        return group_given_a_value(overrides, conf_dir)
    if isinstance(exc, ConfigCompositionException | OmegaConfBaseException):
        return " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return None


def group_given_a_value(overrides: list[str], conf_dir: str) -> str:
    """`cost=2.5`: a config group given a value, where a key inside it was meant."""
    from pathlib import Path

    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        options = sorted(p.stem for p in (Path(conf_dir) / key).glob("*.yaml"))
        if options and value not in options:
            return (f"'{override}': {key} is a config group (options: {', '.join(options)}), not a value; set a key "
                    f"inside it, such as {key}.KEY={value} (see --help)")
    return "a config group was given a value, not one of its options (see --help)"


def yaml_message(e: yaml.MarkedYAMLError) -> str:
    mark = e.problem_mark or e.context_mark  # 0-based line/column
    where = f"{mark.name}:{mark.line + 1}:{mark.column + 1}" if mark else "YAML"
    text = f"{where}: invalid YAML: {e.problem or e.context}"
    if e.context and e.problem and e.context_mark is not None:
        text += f" ({e.context} at line {e.context_mark.line + 1}, column {e.context_mark.column + 1})"
    return text


def find_override(full_key: str, overrides: list[str]):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    for o in OverridesParser.create().parse_overrides(overrides):
        if o.key_or_group == full_key:
            return o
    return None


def unknown_key_message(e: ConfigAttributeError | ConfigKeyError, overrides: list[str], conf_dir: str) -> str:
    full_key = e.full_key
    o = find_override(full_key, overrides)
    line = o.input_line if o is not None else full_key
    node, _, name = full_key.rpartition(".")
    if node in FLAG_NODES and o is not None:
        rest = [x for x in overrides if x != o.input_line]
        cfg = compose_quiet(rest, conf_dir)  # the config as given, less the bad override: backend, server ...
        if cfg is not None:
            from throttle_sweep.engines.flags import check_flags
            from throttle_sweep.settings.sections import engine_from

            check_flags({name: o.value()}, engine_from(cfg).flag_schema(), source=f"command line '{line}'")  # raises
            return (f"command line '{line}': engine flag '{name}' is valid but not in the config's {node} flags; "
                    f"add it with a plus: +{line}")
    keys = list(e.parent_node.keys()) if e.parent_node is not None else []
    near = nearest(name, keys)
    prefix = f"{node}." if node else ""
    hint = (f"nearest valid keys: {', '.join(prefix + k for k in near)}" if near
            else f"valid keys{' of ' + node if node else ''}: {', '.join(map(str, keys))}")
    where = (f"command line '{line}'" if o is not None
             else "set in a config file the command line chose (an experiment, a space, your own)")
    return f"unknown config key '{full_key}' ({where}); {hint}"


def compose_quiet(overrides: list[str], conf_dir: str, config_name: str = "config") -> Any:
    try:
        return compose_config(overrides, conf_dir, config_name)
    except Exception:  # a second failure: fall back to the generic message
        return None


def compose_config(overrides: list[str], conf_dir: str, config_name: str) -> Any:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=conf_dir, version_base=None):
        return compose(config_name=config_name, overrides=overrides)


def compose_or_explain(argv: list[str], conf_dir: str, config_name: str = "config") -> None:
    """Compose as hydra.main will; on a failure we recognise raise ConfigError (one line)."""
    from hydra._internal.utils import get_args_parser  # hydra.main's own parser: same flags, same overrides

    args = get_args_parser().parse_args(argv)
    if os.environ.get("HYDRA_FULL_ERROR") == "1" or args.config_dir or args.config_path:
        return  # a developer asking for tracebacks; or a search path only hydra.main knows about
    if args.multirun or args.shell_completion or args.info or args.experimental_rerun:
        return  # sweeps (a=1,2) do not compose in RUN mode; leave those to Hydra
    try:
        compose_config(args.overrides, conf_dir, args.config_name or config_name)
    except ConfigError:
        raise
    except Exception as exc:
        message = explain(exc, args.overrides, conf_dir)
        if message is None:
            return  # not ours to word: hydra.main fails the same way and reports it
        raise ConfigError(message) from exc

