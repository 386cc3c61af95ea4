"""From replicate records to a comparison: checks of the denominator, then the drift-aware estimate.

The same function serves `mode=compare` (records it just measured) and `mode=analyze` (records read back,
or anyone's minimal CSV/JSONL of arm, order, usd_per_mtok), so the two always print the same numbers.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from throttle_sweep.errors import ConfigError, RecordError
from throttle_sweep.stats.schedule import BASELINE, CANDIDATE
from throttle_sweep.stats.verdict import WITHHELD, Estimate, Observation, Prior, Thresholds, estimate, estimate_joint
from throttle_sweep.store.records import check_record, is_ok

COST_BASES = ("steady", "fixed_work", "offered_load")
BASIS_LABEL = {"steady": "steady state", "fixed_work": "whole fixed work", "offered_load": "at the offered load",
               "as recorded": "as recorded"}


@dataclass
class Analysis:
    verdict: str
    estimate: Estimate | None
    records: list[dict[str, Any]]  # every record, in run order (failed ones included)
    labels: dict[str, str]
    notes: list[str] = field(default_factory=list)
    basis: str = "as recorded"  # which cost per token was judged: steady | fixed_work | offered_load | as recorded

    def cost_of(self, record: Mapping[str, Any]) -> float:
        return judged_cost(record, self.basis)

    def replicates(self, arm: str) -> list[dict[str, Any]]:
        """The arm's measured replicates that succeeded (the warm-up run is not one), in run order."""
        return [r for r in self.records if r["arm"] == arm and _ok(r) and not r.get("warmup")]

    def costs(self, arm: str) -> list[tuple[int, float]]:
        """(position, judged cost) of the arm's measured replicates."""
        return [(r["position"], self.cost_of(r)) for r in self.replicates(arm)]


    def joules(self, arm: str) -> float | None:
        """The arm's mean energy per output token over the judged window (J), where every replicate has one."""
        values = [judged_joules(r, self.basis) for r in self.replicates(arm)]
        return sum(values) / len(values) if values and None not in values else None


def judged_joules(record: Mapping[str, Any], basis: str) -> float | None:
    """Joules per output token over the window whose cost is judged; None where energy was not measured."""
    part = record.get("steady") if basis == "steady" else record
    return (part or {}).get("j_per_output_token")


def judged_cost(record: Mapping[str, Any], basis: str) -> float:
    """The steady-state cost (closed loop, before the drain), or the cost of the whole replicate."""
    return record["steady"]["usd_per_mtok"] if basis == "steady" else record["usd_per_mtok"]


def _ok(record: Mapping[str, Any]) -> bool:
    return is_ok(record) and record.get("usd_per_mtok") is not None


def _basis(ok: Sequence[Mapping[str, Any]], wanted: str) -> tuple[str, str | None]:
    """The basis the records allow for the one wanted, and why not, when they allow none."""
    recorded = {r.get("cost_basis") for r in ok} - {None}
    if len(recorded) > 1:
        return wanted, f"the replicates' costs have different bases ({', '.join(sorted(recorded))})"
    if wanted == "steady":
        with_window = [r.get("steady") is not None for r in ok]
        if all(with_window):
            return "steady", None
        if any(with_window):
            return wanted, "some replicates have a steady-state window and some do not"
        return ("as recorded", None) if not recorded else (wanted, "no replicate has a steady-state window "
                                                                   "(an open loop has none)")
    if recorded and recorded != {wanted}:
        return wanted, f"compare.cost={wanted}, but the replicates measured cost {recorded.pop()}"
    return wanted if recorded else "as recorded", None


def arm_labels(baseline: Mapping[str, Any] | None, candidate: Mapping[str, Any] | None) -> dict[str, str]:
    """Short labels naming only the flags that differ, e.g. max_num_seqs=1 vs max_num_seqs=8."""
    if baseline is None or candidate is None:
        return {BASELINE: BASELINE, CANDIDATE: CANDIDATE}
    keys = sorted(k for k in set(baseline) | set(candidate) if baseline.get(k) != candidate.get(k))
    if not keys:
        return {BASELINE: "baseline (A/A)", CANDIDATE: "candidate (A/A)"}

    def label(flags: Mapping[str, Any]) -> str:
        return " ".join(f"{k}={flags.get(k, 'default')}" for k in keys)

    return {BASELINE: label(baseline), CANDIDATE: label(candidate)}


def _spread(values: Sequence[float]) -> float:
    return (max(values) - min(values)) / max(values) if values and max(values) > 0 else 0.0


def analyse(records: Sequence[Mapping[str, Any]], thresholds: Thresholds, *, token_tolerance: float = 0.0,
            labels: dict[str, str] | None = None, strict: bool = False, cost: str = "steady",
            prior: Prior | None = None) -> Analysis:
    """strict: bad data (one arm, < 2 replicates per arm, bad costs) raises instead of withholding the
    verdict; for input given to analyze, where nothing was measured that a report must keep.
    cost: which cost per token to judge (COST_BASES); records without that basis (a CSV of costs) are
    judged as recorded. prior: the noise pooled over a sweep's other comparisons (stats.estimate)."""
    rows = sorted((dict(r) for r in records), key=lambda r: r["position"])
    if labels is None:
        first = {arm: next((r.get("flags") for r in rows if r["arm"] == arm), None) for arm in (BASELINE, CANDIDATE)}
        labels = arm_labels(first[BASELINE], first[CANDIDATE])
    notes: list[str] = []
    warmups = [r for r in rows if r.get("warmup")]
    rows_measured = [r for r in rows if not r.get("warmup")]
    ok = [r for r in rows_measured if _ok(r)]
    failed = [r for r in rows_measured if not _ok(r)]
    for r in warmups:
        notes.append(f"the warm-up run at position {r['position']} ({r['arm']}) is not analysed")
    for r in failed:
        notes.append(f"replicate at position {r['position']} ({r['arm']}) failed: {r.get('reason')}; excluded")
    for key in ("output_tokens", "requests_completed"):
        values = [r[key] for r in ok if r.get(key) is not None]
        if values and _spread(values) > token_tolerance:
            notes.insert(0, f"verdict withheld: {key} differ across replicates ({min(values)} to {max(values)}, "
                            f"tolerance {token_tolerance:.1%}); cost per token is not comparable")
            return Analysis(WITHHELD, None, rows, labels, notes)
    basis, problem = _basis(ok, cost)
    if problem is not None:
        if strict:
            raise RecordError(f"cannot judge cost on the {cost} basis: {problem}")
        notes.insert(0, f"verdict withheld: {problem}")
        return Analysis(WITHHELD, None, rows, labels, notes, "as recorded")
    preempt = {arm: sum(r.get("preemptions") or 0 for r in ok if r["arm"] == arm) for arm in (BASELINE, CANDIDATE)}
    if (preempt[BASELINE] > 0) != (preempt[CANDIDATE] > 0):
        arm = BASELINE if preempt[BASELINE] else CANDIDATE
        notes.append(f"only the {arm} arm ({labels[arm]}) preempted: {preempt[arm]} preemptions in total")
    try:
        est = estimate([Observation(r["arm"], r["position"], judged_cost(r, basis)) for r in ok], thresholds,
                       prior=prior)
    except ConfigError as exc:
        if strict:
            raise
        notes.insert(0, f"verdict withheld: {exc}")
        return Analysis(WITHHELD, None, rows, labels, notes, basis)
    notes.extend(est.warnings)
    drain = [r["steady"]["drain_share"] for r in ok if r.get("steady")]
    if basis == "steady" and drain and max(drain) > 0.5:
        notes.append(f"up to {100 * max(drain):.0f}% of a replicate's time was the drain (fewer requests left than "
                     "the concurrency), which the steady-state cost leaves out; raise workload.num_requests to "
                     "measure more steady work per replicate")
    return Analysis(est.verdict, est, rows, labels, notes, basis)


def candidate_view(records: Sequence[Mapping[str, Any]], trial: int | None) -> list[dict[str, Any]]:
    """One candidate's comparison inside a joint one (several candidates sharing the baseline's runs, see
    schedule.joint_schedule): the baseline's runs and that candidate's, at the positions they ran. Each pair
    of arms of a joint schedule is balanced on its own, so this is a plain two-arm comparison."""
    return [dict(r) for r in records if r["arm"] == BASELINE or r.get("trial") == trial]


def analyse_joint(records: Sequence[Mapping[str, Any]], thresholds: Thresholds, *, token_tolerance: float = 0.0,
                  cost: str = "steady") -> dict[int, Analysis]:
    """Each candidate of a joint comparison: its view's analysis (the checks of its denominator, its notes),
    with the estimate of one fit over all the comparison's runs (stats.estimate_joint): the same ratio in a
    balanced schedule, the drift from every run, each arm's own noise. A view that gets no estimate of its
    own leaves every view to its own fit."""
    trials = sorted({r["trial"] for r in records if r["arm"] != BASELINE and r.get("trial") is not None})
    views = {trial: analyse(candidate_view(records, trial), thresholds, token_tolerance=token_tolerance,
                            cost=cost) for trial in trials}
    if len(views) < 2 or any(a.estimate is None for a in views.values()):
        return views
    basis = views[trials[0]].basis
    ok = [r for r in records if _ok(r) and not r.get("warmup")]
    label = {trial: f"trial-{trial}" for trial in trials}
    try:
        fitted = estimate_joint([Observation(BASELINE if r["arm"] == BASELINE else label[r["trial"]], r["position"],
                                             judged_cost(r, basis)) for r in ok], thresholds)
    except (ConfigError, KeyError):
        return views
    for trial, analysis in views.items():
        est, own = fitted[label[trial]], analysis.estimate
        analysis.notes = [n for n in analysis.notes if n not in own.warnings] + list(est.warnings)
        analysis.notes.append(f"one fit over the joint schedule's {len(ok)} runs ({len(trials)} candidates, the "
                              f"baseline and the drift), each arm's noise its own: {est.df:g} df (Welch-"
                              f"Satterthwaite), where this candidate's runs and the baseline's alone give {own.df}")
        analysis.estimate, analysis.verdict = est, est.verdict
    return views


def split_joint(records: Sequence[Mapping[str, Any]]) -> list[tuple[int | None, list[dict[str, Any]]]]:
    """A comparison's records as the two-arm comparisons they hold: [(None, all)] for a plain one, one
    (trial, view) per candidate for a joint one (its records say `confirmed_together`)."""
    together = next((r.get("confirmed_together") for r in records if r.get("confirmed_together")), None)
    if not together:
        return [(None, [dict(r) for r in records])]
    return [(trial, candidate_view(records, trial)) for trial in together]


# ---- analyze input: this tool's records, or a minimal CSV / JSONL (arm, order, usd_per_mtok) ----

def load_input(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise ConfigError(f"input: no such file {str(path)!r}")
    if path.suffix.lower() == ".csv":
        with open(path, newline="", encoding="utf-8") as handle:
            rows = [(i, row) for i, row in enumerate(csv.DictReader(handle), 2)]  # line 1 is the header
    else:
        rows = []
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    rows.append((i, json.loads(line)))
                except json.JSONDecodeError as exc:
                    raise RecordError(f"{path}:{i}: not valid JSON ({exc.msg})") from None
    if not rows:
        raise RecordError(f"{path}: no rows")
    return [_normalise(row, f"{path}:{i}") for i, row in rows]


def _normalise(row: Mapping[str, Any], where: str) -> dict[str, Any]:
    if "schema_version" in row:  # one of this tool's replicate records
        check_record(row, where=where)
        return dict(row)
    for key in ("arm", "order", "usd_per_mtok"):
        if row.get(key) in (None, ""):
            raise RecordError(f"{where}: missing '{key}' (rows need arm, order, usd_per_mtok)")
    arm = str(row["arm"]).strip().lower()
    if arm not in (BASELINE, CANDIDATE):
        raise RecordError(f"{where}: arm must be 'baseline' or 'candidate', but got {row['arm']!r}")
    try:
        order = float(row["order"])
        cost = float(row["usd_per_mtok"])
    except (TypeError, ValueError):
        raise RecordError(f"{where}: order and usd_per_mtok must be numbers, but got "
                          f"{row['order']!r} and {row['usd_per_mtok']!r}") from None
    if not cost > 0:
        raise RecordError(f"{where}: usd_per_mtok must be > 0, but got {row['usd_per_mtok']!r}")
    out = {k: v for k, v in row.items() if k not in ("arm", "order", "usd_per_mtok", "warmup")}
    if "warmup" in row:  # a CSV says "false" as text: only a clear yes marks an unmeasured warm-up run
        out["warmup"] = str(row["warmup"]).strip().lower() in ("true", "1", "yes")
    return {**out, "arm": arm, "position": int(order) if order.is_integer() else order, "usd_per_mtok": cost,
            "status": "ok"}


def check_positions(records: Sequence[Mapping[str, Any]], source: str) -> None:
    seen: dict[Any, int] = {}
    for i, r in enumerate(records, 1):
        if r["position"] in seen:
            raise RecordError(f"{source}: row {i} repeats order {r['position']} (first at row {seen[r['position']]}); "
                              "each run position must be unique")
        seen[r["position"]] = i
