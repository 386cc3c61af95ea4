"""Bad input that used to end in a raw traceback gets a clear error naming the setting, before any engine
starts: an unwritable results folder, a study storage URL that cannot be opened."""

from __future__ import annotations

import pytest
from rich.console import Console

from tests.helpers import compose_cfg
from throttle_sweep.cluster.slot import WarmSlot
from throttle_sweep.commands import compare as compare_cmd
from throttle_sweep.commands import measure as measure_cmd
from throttle_sweep.commands import sweep as sweep_cmd
from throttle_sweep.engines import FakeEngine
from throttle_sweep.errors import ConfigError


@pytest.fixture(autouse=True)
def no_engine(monkeypatch):
    monkeypatch.setattr(FakeEngine, "start", lambda *a: pytest.fail("an engine started"))
    monkeypatch.setattr(WarmSlot, "make_host", staticmethod(lambda *a, **k: pytest.fail("an engine started")))


@pytest.mark.parametrize("command", [measure_cmd, compare_cmd])
def test_an_unwritable_results_folder_is_named(command, tmp_path):
    cfg = compose_cfg("backend=fake", "results_dir=/proc/throttle-sweep-nowhere")
    with pytest.raises(ConfigError, match=r"cannot write the results folder /proc/throttle-sweep-nowhere/.*results_dir"):
        command.run(cfg, Console(quiet=True))


@pytest.mark.parametrize(("storage", "reason"), [
    ("sqlite:////proc/throttle-sweep-nowhere/study.db", "OperationalError: unable to open database file"),
    ("postgresql://nobody@127.0.0.1:1/none", "ImportError"),  # no driver for it installed here
])
def test_a_study_storage_that_cannot_be_opened_is_named(tmp_path, storage, reason):
    cfg = compose_cfg("backend=fake", "+space=batching", f"study.storage={storage}", tmp_path=tmp_path)
    with pytest.raises(ConfigError, match=rf"study.storage='{storage}' cannot be opened \({reason}"):
        sweep_cmd.run(cfg, Console(quiet=True))
