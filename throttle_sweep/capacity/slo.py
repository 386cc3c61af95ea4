"""A latency SLO and a run's attainment of it: the share of its requests whose time to first token and time
per output token both stay within the limits (DistServe's goodput definition). Which requests of a run
count (its steady state) is steady.py's."""

from __future__ import annotations

import math
from dataclasses import dataclass

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
