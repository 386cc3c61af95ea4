"""Small builders shared by tests."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict

from throttle_sweep.__main__ import CONF_DIR
from throttle_sweep.config import register


def compose_cfg(*overrides: str, tmp_path: Path | None = None):
    register()
    extra = [f"results_dir={tmp_path}"] if tmp_path is not None else []
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose(config_name="config", overrides=[*extra, *overrides], return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)  # as under @hydra.main: commands read the chosen group options
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg
