"""Hydra entry point: `python -m throttle_sweep [mode=...] [+space=NAME] [key=value ...]`, or the
`throttle-sweep` console script, which is the same."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig
from rich.console import Console
from rich.markup import escape

from throttle_sweep.cli import compose_or_explain
from throttle_sweep.errors import ThrottleSweepError
from throttle_sweep.settings.schema import CONF_DIR, register

MODES = ("measure", "compare", "analyze", "sweep", "export", "capacity", "recheck", "plan")


def dispatch(cfg: DictConfig, console: Console) -> int:
    if cfg.space is not None and cfg.mode == "measure":
        cfg.mode = "sweep"  # `+space=NAME` alone means: sweep that space
    if cfg.mode not in MODES:
        raise ThrottleSweepError(f"mode must be one of {', '.join(MODES)}, but got {cfg.mode!r}")
    from importlib import import_module

    command = import_module(f"throttle_sweep.commands.{cfg.mode}")
    return command.run(cfg, console)


def fail(exc: ThrottleSweepError) -> None:
    """The tool's own one-line error (exit 2); a message's brackets are text, not markup."""
    Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
    sys.exit(2)


@hydra.main(version_base=None, config_path=CONF_DIR, config_name="config")
def run(cfg: DictConfig) -> None:
    console = Console(soft_wrap=True)
    try:
        code = dispatch(cfg, console)
    except ThrottleSweepError as exc:
        fail(exc)
    sys.exit(code)


def main() -> None:
    """The command line is composed and checked first, so a config that does not compose gets our error."""
    try:
        compose_or_explain(sys.argv[1:], CONF_DIR)
    except ThrottleSweepError as exc:
        fail(exc)
    run()


register()

if __name__ == "__main__":
    main()
