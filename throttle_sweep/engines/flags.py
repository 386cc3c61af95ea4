"""Check engine flags against the engine's own argument fields before any engine starts.

vLLM's `EngineArgs` dataclass is the source of truth: its field names are the valid flags and its
annotations their types. An unknown flag or a value of the wrong type is a ConfigError that names the
flag, the value, where it came from and the nearest valid names.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import sys
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, Union

from throttle_sweep.errors import ConfigError

FlagSchema = Mapping[str, Any]  # flag name -> type annotation (Any where it cannot be resolved)


def flags_key(flags: Mapping[str, Any]) -> str:
    """One string per set of flag values, whatever their order: for telling flag sets apart or alike."""
    return json.dumps(dict(flags), sort_keys=True, default=str)


@functools.cache
def vllm_flag_schema() -> dict[str, Any]:
    """Field name -> resolved annotation of vLLM's EngineArgs (imports vllm: seconds, done once)."""
    from vllm.engine.arg_utils import EngineArgs

    namespace = vars(sys.modules[EngineArgs.__module__])
    schema: dict[str, Any] = {}
    for field in dataclasses.fields(EngineArgs):
        annotation = field.type
        if isinstance(annotation, str):
            try:
                annotation = eval(annotation, namespace)  # noqa: S307 - vLLM's own annotation text
            except Exception:
                annotation = Any  # an annotation vLLM itself cannot resolve: accept any value
        schema[field.name] = annotation
    return schema


def check_flags(flags: Mapping[str, Any], schema: FlagSchema, *, source: str) -> None:
    """Raise ConfigError for the first unknown flag or ill-typed value in `flags`."""
    for name, value in flags.items():
        if name not in schema:
            near = difflib.get_close_matches(name, list(schema), n=3, cutoff=0.6)
            hint = f"; nearest valid names: {', '.join(near)}" if near else ""
            raise ConfigError(f"{source}: unknown engine flag '{name}'{hint}")
        if not value_matches(value, schema[name]):
            raise ConfigError(
                f"{source}: engine flag '{name}' must be {describe(schema[name])}, but got {value!r} "
                f"({type(value).__name__})"
            )


def value_matches(value: Any, annotation: Any) -> bool:
    """Whether a config value fits an annotation; unknown shapes are accepted (vLLM checks them again)."""
    if annotation is Any:
        return True
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        return any(value_matches(value, arg) for arg in typing.get_args(annotation))
    if origin is Literal:
        return value in typing.get_args(annotation)
    if annotation is type(None):
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if annotation is str:
        return isinstance(value, str)
    if origin in (list, tuple, set) or annotation in (list, tuple, set):
        return isinstance(value, list | tuple)
    if origin is dict or annotation is dict:
        return isinstance(value, Mapping)
    return True


def describe(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        return " or ".join(describe(arg) for arg in typing.get_args(annotation))
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", str(annotation))
