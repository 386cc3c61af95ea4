"""The winner as files a user can serve with: a vLLM config YAML for `vllm serve --config`, the equivalent
command line, a JSON file, and a Hydra override file that reproduces the measurement."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

MEASUREMENT_ONLY = {"disable_log_stats"}  # set for measuring, not a serving choice


def serve_flags(engine_flags: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in engine_flags.items() if k not in MEASUREMENT_ONLY and v is not None}


def export_best(out: Path, *, engine_flags: Mapping[str, Any], params: Mapping[str, Any],
                summary: Mapping[str, Any], hydra_overrides: list[str]) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    flags = serve_flags(engine_flags)
    paths = {"yaml": out / "vllm_config.yaml", "cmd": out / "vllm_serve.sh", "json": out / "best.json",
             "hydra": out / "overrides.yaml"}
    # `vllm serve` reads the file with its top-level parser, which knows no --no-FLAG options and drops a
    # `false` (vLLM 0.32), but passes a `true` on as --KEY: a flag the winner turned off is `no-FLAG: true`
    config = {(f"no-{k}" if v is False else k).replace("_", "-"): (True if v is False else v) for k, v in flags.items()}
    paths["yaml"].write_text("# vllm serve --config vllm_config.yaml  (throttle_sweep's confirmed winner)\n"
                             + yaml.safe_dump(config, sort_keys=True))
    paths["cmd"].write_text("#!/usr/bin/env bash\n" + serve_command(flags) + "\n")
    paths["cmd"].chmod(0o755)
    paths["json"].write_text(json.dumps({"params": dict(params), "engine_flags": flags, **summary}, indent=2,
                                        sort_keys=True, default=str) + "\n")
    paths["hydra"].write_text("# python -m throttle_sweep mode=measure $(grep -v '^#' overrides.yaml)\n"
                              + "\n".join(hydra_overrides) + "\n")
    return paths


def serve_command(flags: Mapping[str, Any]) -> str:
    """`vllm serve MODEL --flag value ...`; booleans as --flag / --no-flag, as vLLM's parser takes them."""
    rest = {k: v for k, v in flags.items() if k != "model"}
    parts = ["vllm", "serve", shlex.quote(str(flags.get("model", "MODEL")))]
    for key, value in sorted(rest.items()):
        option = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            parts.append(option if value else "--no-" + key.replace("_", "-"))
        else:
            parts += [option, shlex.quote(json.dumps(value) if isinstance(value, dict | list) else str(value))]
    return " ".join(parts)
