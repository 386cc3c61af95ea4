"""How much GPU time a sweep's records stand for: each engine's start and warm-up once, every run's own time.
On the GPU twin these are the simulated seconds a GPU would have spent, which is what a user would pay for;
the plan is said once the calibration and the baseline's probe have run, so their share is the time before it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GpuTime:
    total_s: float
    before_plan_s: float

    def text(self, device: str) -> str:
        return (f"GPU time on the twin ({device}, predicted, not measured): {self.total_s / 60:.1f} GPU-minutes in "
                f"all, {self.before_plan_s / 60:.1f} before the plan")


def gpu_time(records: Iterable[Mapping[str, Any]]) -> GpuTime:
    total = before = 0.0
    seen: set[str] = set()
    for record in records:
        life = record.get("engine_lifetime") or {}
        spent = float(record.get("wall_s") or 0.0)
        if life.get("id") not in seen:  # an engine's start and warm-up are paid once, by its first run
            seen.add(life.get("id"))
            spent += float(life.get("start_s") or record.get("engine_start_s") or 0.0)
            spent += float(life.get("warmup_s") or 0.0)
        total += spent
        if record.get("stage") == "calibration" or (record.get("stage") == "probe" and record.get("arm") == "baseline"):
            before += spent
    return GpuTime(total, before)
