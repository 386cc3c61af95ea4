"""The pool contract (tests/pool_contract.py) on this machine's slots: one, measured in the driver's thread
when it waits, and two, each on a thread of its own. Each slot's engines run in their own processes."""

from __future__ import annotations

import pytest

from tests.pool_contract import PoolContract


class TestLocalPool(PoolContract):
    @pytest.fixture(params=[1, 2], ids=["one slot", "two slots"])
    def pool_overrides(self, request) -> list[str]:
        return [f"slots={request.param}"]
