"""The unit tier runs in-thread: the fake engine is measured in the test's own thread (engines.thread_host.
InThreadHost), with no engine process to start. A fake that ends or hangs its process on purpose
(`exit_when`, `hang_when`) keeps a process of its own; what only real processes show is in tests/process."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def engines_in_thread(monkeypatch):
    from throttle_sweep.cluster.host import EngineHost
    from throttle_sweep.cluster.slot import WarmSlot
    from throttle_sweep.cluster.thread_host import InThreadHost
    from throttle_sweep.engines.fake import FakeEngine

    def make_host(engine, spec, price, *, name):
        if isinstance(engine, FakeEngine) and not (engine.knobs.exit_when or engine.knobs.hang_when):
            return InThreadHost(engine, spec, price, name=name)
        return EngineHost(engine, spec, price, name=name)

    monkeypatch.setattr(WarmSlot, "make_host", staticmethod(make_host))


@pytest.fixture(autouse=True, scope="session")
def studies_without_fsync():
    """A test's SQLite study is not made durable after every attribute (the engine runs it stands for take
    milliseconds, not minutes): what a crash would keep is tested in tests/process, with fsync on."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    def no_sync(connection, _record):
        if type(connection).__module__.startswith("sqlite3"):
            cursor = connection.cursor()
            cursor.execute("PRAGMA synchronous=OFF")
            cursor.close()

    event.listen(Engine, "connect", no_sync)
    yield
    event.remove(Engine, "connect", no_sync)
