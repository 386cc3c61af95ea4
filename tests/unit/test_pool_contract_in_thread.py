"""The pool contract (tests/pool_contract.py) in the fast tier: this machine's pool with its slots measuring
in-thread on the fake engine (one slot, and two on threads of their own), and the test double FakeOneSlot that
most sweep tests run on, so that a double that drifts from what the driver relies on fails here. The same
contract with each slot's engines in their own processes is in tests/process, on Ray in tests/integration."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers import FakeOneSlot, compose_cfg
from tests.pool_contract import WORK, PoolContract
from throttle_sweep.cluster.pool import Pool
from throttle_sweep.engines import FakeKnobs


class TestInThreadPool(PoolContract):
    @pytest.fixture(params=[1, 2], ids=["one slot", "two slots"])
    def pool_overrides(self, request) -> list[str]:
        return [f"slots={request.param}"]


class TestFakeOneSlot(PoolContract):
    @pytest.fixture
    def made(self, tmp_path) -> Iterator[tuple[Pool, dict[str, Any]]]:
        from throttle_sweep.settings.sweep import load_sweep

        run = load_sweep(compose_cfg(*WORK, tmp_path=tmp_path))
        pool = FakeOneSlot(run.spec, knobs=FakeKnobs(start_s=0.1, fail_start_when={"max_num_seqs": 4}))
        yield pool, dict(run.base)
        pool.close()
