"""The pool contract (tests/pool_contract.py) on Ray: two actors on a two-node cluster on this machine."""

from __future__ import annotations

import pytest

from tests.integration.test_ray_cluster import cluster  # noqa: F401 - the two-node cluster fixture
from tests.pool_contract import PoolContract

pytestmark = pytest.mark.integration


class TestRayPool(PoolContract):
    @pytest.fixture
    def pool_overrides(self, cluster) -> list[str]:  # noqa: F811 - the fixture imported above
        return ["ray.enabled=true", f"ray.address={cluster.address}", "ray.slots=2"]
