"""A latency SLO and a run's attainment of it: the share of its requests whose time to first token and time
per output token both stay within the limits (DistServe's goodput definition). Requests that arrive while
the queue is still filling from empty (the first `settle_share` of the arrival schedule) are not counted:
capacity is a steady-state property."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from throttle_sweep.errors import ConfigError


@dataclass(frozen=True)
class Slo:
    p95_ttft_s: float | None = None
    p95_tpot_s: float | None = None
    attainment: float = 0.9  # the share of requests that must meet both limits

    def check(self) -> None:
        if self.p95_ttft_s is None and self.p95_tpot_s is None:
            raise ConfigError("mode=capacity needs a latency SLO: set slo.p95_ttft_s and/or slo.p95_tpot_s "
                              "(seconds)")
        for key in ("p95_ttft_s", "p95_tpot_s"):
            value = getattr(self, key)
            if value is not None and not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ConfigError(f"slo.{key} must be a positive number of seconds, but got {value!r}")
        if not (isinstance(self.attainment, int | float) and 0 < self.attainment < 1):
            raise ConfigError(f"slo.attainment is the share of requests that must meet the SLO, above 0 and below "
                              f"1, but got {self.attainment!r}")

    def words(self) -> str:
        limits = [f"TTFT <= {self.p95_ttft_s * 1e3:g} ms" if self.p95_ttft_s is not None else None,
                  f"TPOT <= {self.p95_tpot_s * 1e3:g} ms" if self.p95_tpot_s is not None else None]
        return f"{' and '.join(x for x in limits if x)} for {self.attainment:.0%} of requests"

    def met(self, ttft: float | None, tpot: float | None) -> bool:
        if ttft is None:  # it never produced a token
            return False
        return (self.p95_ttft_s is None or ttft <= self.p95_ttft_s) and (
            self.p95_tpot_s is None or tpot is None or tpot <= self.p95_tpot_s)


def attainment(record: Mapping[str, Any], slo: Slo, settle_share: float) -> tuple[int, int] | None:
    """(requests that met the SLO, requests counted) of an open-loop run's record: those that arrived after the
    first `settle_share` of its schedule; a request that did not finish counts, as not met. None when the
    record keeps no per-request latencies (a failed run, or one of an older version)."""
    rows = record.get("requests_s")
    if not rows:
        return None
    last = max(row[0] for row in rows)
    counted = [row for row in rows if row[0] >= settle_share * last]
    return sum(slo.met(row[1], row[2]) for row in counted), len(counted)
