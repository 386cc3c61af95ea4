"""What a replicate cost. The GPU price is configuration, labelled as assumed wherever it is shown; with a price
of energy (cost.usd_per_kwh) the energy the GPUs used in the same window is added (energy.py measures it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from throttle_sweep.engines.flags import engine_gpus
from throttle_sweep.errors import ConfigError


@dataclass(frozen=True)
class Price:
    usd_per_gpu_hour: float = 1.39
    gpus: int = 1
    usd_per_kwh: float | None = None  # None: the price is the GPU-hours alone

    def check(self, source: str = "cost") -> None:
        if not self.usd_per_gpu_hour > 0:
            raise ConfigError(f"{source}.usd_per_gpu_hour must be > 0, but got {self.usd_per_gpu_hour!r}")
        if not isinstance(self.gpus, int) or self.gpus <= 0:
            raise ConfigError(f"{source}.gpus must be a positive integer, but got {self.gpus!r}")
        if self.usd_per_kwh is not None and not (isinstance(self.usd_per_kwh, int | float) and self.usd_per_kwh > 0):
            raise ConfigError(f"{source}.usd_per_kwh must be > 0 (or null: no energy price), but got "
                              f"{self.usd_per_kwh!r}")

    def label(self) -> str:
        energy = "" if self.usd_per_kwh is None else f", plus the measured energy at ${self.usd_per_kwh:g}/kWh"
        return f"at an assumed ${self.usd_per_gpu_hour:g}/GPU-hour x {self.gpus} GPU{energy}"

    def charged(self, flags: Mapping[str, Any]) -> Price:
        """The price of an engine with these flags: every GPU it holds, and at least `gpus` (a floor: a node
        rented whole is paid whole)."""
        return replace(self, gpus=max(self.gpus, engine_gpus(flags)))




JOULES_PER_KWH = 3.6e6


def usd_per_mtok(price: Price, wall_s: float, tokens: int, energy_j: float | None = None) -> float | None:
    """(usd_per_gpu_hour * gpus * wall_s / 3600 + energy_j / 3.6e6 * usd_per_kwh) / (tokens / 1e6), the energy
    term only with a price of energy; None when no token was produced, or energy is priced and not measured."""
    if tokens <= 0 or (price.usd_per_kwh is not None and energy_j is None):
        return None
    usd = price.usd_per_gpu_hour * price.gpus * wall_s / 3600.0
    if price.usd_per_kwh is not None:
        usd += energy_j / JOULES_PER_KWH * price.usd_per_kwh
    return usd / (tokens / 1e6)


def usd_per_mtok_at(price: Price, tokens_per_s: float) -> float | None:
    """The same cost for an engine producing `tokens_per_s` (a capacity's goodput: rate x the SLO's share x
    output tokens a request); None when it produces none."""
    return usd_per_mtok(price, 1.0, tokens_per_s) if tokens_per_s > 0 else None
