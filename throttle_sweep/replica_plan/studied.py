"""What a finished study says one replica serves, for mode=plan: the capacity and its interval, the GPUs a
replica holds and their price, read from the summary.json that mode=capacity (capacity/report.py) or a goodput
sweep (sweep/goodput/report.py) wrote. A folder that holds no capacity is refused, saying what it holds."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from throttle_sweep.capacity.rates import ALWAYS_MET, FOUND, NEVER_MET
from throttle_sweep.errors import ConfigError
from throttle_sweep.measurement.cost import Price
from throttle_sweep.sweep.goodput.report import fmt_params


@dataclass(frozen=True)
class Served:
    """One configuration's confirmed capacity a replica, and what a replica costs."""
    label: str
    rate: float  # the estimate (req/s); where `at_least`, the highest rate its knee runs kept: a lower bound
    low: float | None  # the 95% interval; None: open on that side (low None: no rate held beyond doubt)
    high: float | None
    gpus: int  # a replica's
    usd_per_gpu_hour: float  # assumed, as the study recorded it
    at_least: bool = False
    params: dict[str, Any] = field(default_factory=dict)

    def words(self) -> str:
        what = f"{self.label} ({fmt_params(self.params)})" if self.params else self.label
        return f"{what}: {self.capacity_words()}"

    def capacity_words(self) -> str:
        low, high = (f"{x:.3g}" if x is not None else "-" for x in (self.low, self.high))
        return (f"capacity {'at least ' if self.at_least else ''}{self.rate:.3g} req/s [{low}, {high}] a replica, "
                f"{self.gpus} GPU{'s' if self.gpus != 1 else ''} at ${self.usd_per_gpu_hour:g}/GPU-hour (assumed)")


@dataclass(frozen=True)
class Study:
    name: str
    folder: Path
    kind: str  # capacity | goodput sweep
    served: Served  # what the plan is for: the capacity, or the sweep's winner
    notes: tuple[str, ...] = ()  # what the reader should know of the choice
    types: dict[str, Served] = field(default_factory=dict)  # per GPU type priced: its cheapest confirmed


def read_study(name: str, folder: Path, config: str | None = None) -> Study:
    """The study's capacity to plan with; `config`: a goodput sweep's confirmed configuration by its label
    (`plan.config`), else its winner."""
    summary = summary_of(name, folder)
    if "confirmed" in summary:
        return goodput_study(name, folder, summary, config)
    if "bracket" in summary and "status" in summary:
        if config is not None:
            raise ConfigError(f"plan.config={config!r}: a capacity study measured one configuration; leave "
                              "plan.config off (it chooses among a goodput sweep's confirmed ones)")
        return Study(name, folder, "capacity", capacity_served(name, folder, summary))
    raise ConfigError(f"study.name={name!r}: {folder / 'summary.json'} is not a capacity or goodput study's summary "
                      f"(its keys: {', '.join(sorted(summary)[:8])}); mode=plan reads what mode=capacity or a goodput "
                      "sweep (study.objective=goodput) wrote")


def summary_of(name: str, folder: Path) -> dict[str, Any]:
    path = folder / "summary.json"
    if not folder.is_dir():
        raise ConfigError(f"study.name={name!r}: no such study ({folder} does not exist)")
    saved = saved_config(folder)
    objective = (saved.get("study") or {}).get("objective")
    if not path.is_file() and ((folder / "study.db").is_file() or (saved.get("space") and objective == "cost")):
        raise ConfigError(f"study.name={name!r} is a cost sweep: it measures the cost of fixed work, not a capacity, "
                          "so it has none to plan with; mode=plan reads a capacity study (mode=capacity) or a goodput "
                          "sweep (study.objective=goodput)")
    if not path.is_file():
        unfinished = saved.get("mode") == "capacity" or objective == "goodput"
        raise ConfigError(f"study.name={name!r}: {folder} has no summary.json"
                          + (": the study has not finished; run its command again to finish it" if unfinished else
                             ": not a finished capacity or goodput study"))
    try:
        summary = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"study.name={name!r}: cannot read {path} ({exc})") from None
    if not isinstance(summary, dict):
        raise ConfigError(f"study.name={name!r}: {path} is not a study's summary (a JSON object)")
    return summary


def saved_config(folder: Path) -> dict[str, Any]:
    saved = folder / "config.yaml"
    return OmegaConf.to_container(OmegaConf.load(saved), resolve=True) if saved.is_file() else {}  # type: ignore


def capacity_served(name: str, folder: Path, summary: Mapping[str, Any]) -> Served:
    rate = summary.get("capacity_rps")
    if rate is None:
        why = {FOUND: "its knee runs did not cross the SLO's attainment",
               NEVER_MET: "no rate kept its SLO, down to capacity.min_rate",
               ALWAYS_MET: "its SLO held up to capacity.max_rate: measure it again with a higher one"
               }.get(summary["status"], f"status {summary['status']!r}")
        raise ConfigError(f"study.name={name!r} has no confirmed capacity ({why}; see its summary.json): nothing "
                          "to plan with")
    low, high = summary.get("capacity_ci") or (None, None)
    price = price_of(folder, summary)
    return Served("its configuration", rate, low, high, price.gpus, price.usd_per_gpu_hour,
                  bool(summary.get("capacity_at_least")))


def price_of(folder: Path, summary: Mapping[str, Any]) -> Price:
    """The price a capacity study recorded; a summary from before it was recorded there: its config.yaml's
    cost, charged for the engine's flags as the study was."""
    if summary.get("usd_per_gpu_hour") is not None:
        return Price(summary["usd_per_gpu_hour"], summary["gpus_per_replica"])
    saved = saved_config(folder)
    cost = saved.get("cost") or {}
    base = Price(cost.get("usd_per_gpu_hour", Price.usd_per_gpu_hour), cost.get("gpus", Price.gpus))
    return base.charged(saved.get("engine") or {})


def goodput_study(name: str, folder: Path, summary: Mapping[str, Any], config: str | None = None) -> Study:
    """The configuration named, or the winner; with none, the cheapest estimate the sweep kept, or else the
    cheapest confirmed configuration with a capacity (said so); per GPU type, its cheapest."""
    types = {t: served_of(v["cheapest"]) for t, v in (summary.get("gpu_types") or {}).items() if v.get("cheapest")}
    found = [c for c in summary["confirmed"] if c.get("capacity_rps") is not None]
    if config is not None:
        entry = next((c for c in summary["confirmed"] if c["config"] == config), None)
        if entry is None:
            raise ConfigError(f"plan.config={config!r}: study {name!r} confirmed no such configuration; it confirmed: "
                              + (", ".join(c["config"] for c in summary["confirmed"]) or "none"))
        if entry.get("capacity_rps") is None:
            raise ConfigError(f"plan.config={config!r}: its confirmation found no capacity (see "
                              f"{folder / 'summary.json'}); those with one: "
                              + (", ".join(c["config"] for c in found) or "none"))
        notes = (f"note: {config}, chosen by plan.config",)
        return Study(name, folder, "goodput sweep", served_of(entry), notes, types)
    entry, notes = summary.get("winner"), []
    if entry is None and summary.get("cheapest_not_shown"):
        entry = summary["cheapest_not_shown"]
        notes.append(f"note: the sweep showed no configuration cheaper than its baseline beyond doubt (no winner); "
                     f"this plan is for its cheapest estimate, {entry['config']}")
    if entry is None and found:
        entry = min(found, key=lambda c: c.get("usd_per_mtok_at_capacity") or math.inf)
        others = [c["config"] for c in found if c is not entry]
        notes.append(f"note: the sweep found no winner; this plan is for the cheapest confirmed configuration with a "
                     f"capacity, {entry['config']}" + (f" (plan.config=LABEL chooses another: {', '.join(others)})"
                                                       if others else " (the only one)"))
    if entry is None:
        raise ConfigError(f"study.name={name!r} has no confirmed capacity: no configuration's confirmation found one "
                          f"(see {folder / 'summary.json'}): nothing to plan with")
    return Study(name, folder, "goodput sweep", served_of(entry), tuple(notes), types)


def served_of(entry: Mapping[str, Any]) -> Served:
    """A goodput sweep's confirmed entry (sweep/goodput/report.costed_summary)."""
    low, high = entry["capacity_ci"]
    return Served(entry["config"], entry["capacity_rps"], low, high, entry["gpus_per_replica"],
                  entry["usd_per_gpu_hour"], bool(entry.get("capacity_at_least")), dict(entry.get("params") or {}))
