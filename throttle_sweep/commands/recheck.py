"""mode=recheck study.name=NAME (or recheck.best=PATH): re-certify a deployed export after an upgrade.

The exported winner is measured again against the baseline it was chosen against, interleaved as mode=compare
measures (its machinery, its verdict), with the recorded workload, in a folder of its own. Exit 0: still
CHEAPER; 1: not any more (the one-line verdict names the regression); 2: the setup differs (settings/recheck.py).
The versions the study ran with are set beside the ones the new replicates record."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig
from rich.console import Console

from throttle_sweep.commands.compare import measure_comparison
from throttle_sweep.report.comparison import page
from throttle_sweep.report.html_page import Section
from throttle_sweep.settings.recheck import RecheckRun, load_recheck
from throttle_sweep.stats.analysis import Analysis
from throttle_sweep.stats.schedule import BASELINE
from throttle_sweep.stats.verdict import CHEAPER

VERSIONS = (("vLLM", "vllm_version"), ("torch", "torch_version"), ("driver", "driver_version"),
            ("device", "device"))


def run(cfg: DictConfig, console: Console) -> int:
    r = load_recheck(cfg)  # every check, setup differences included, before any engine starts
    say = lambda line: console.print(line, highlight=False)  # noqa: E731
    for note in r.compare.notes:
        say(f"[yellow]note:[/] {note}")
    ratio, low, high = r.claimed
    say(f"recheck {r.best}: the deployed {flags_words(r.under_test)} against the baseline "
        f"{flags_words(r.compare.arms[BASELINE], keys=r.under_test)}, which the study "
        f"{r.study!r} confirmed at ratio {ratio:.3f} [{low:.3f}, {high:.3f}]; recorded on "
        f"{versions_words(r.measured_with)}")
    result = measure_comparison(r.compare, r.config, console,
                                context={"recheck": {"study": r.study, "best": str(r.best)}}, report_line=False)
    if isinstance(result, int):
        return result
    versions = "versions: " + "; ".join(f"{label} {shown(then)} then, {shown(now)} now"
                                        for label, then, now in side_by_side(r.measured_with, now_environment(result)))
    say(versions)
    holds, line = verdict_line(r, result)
    say(line)
    picture = r.compare.out / "replicates.png"
    report = page(r.compare.out, result, r.compare.thresholds, r.compare.price, title="Recheck", answer=line,
                  before=[Section("Recheck", text=[line, versions])],
                  pictures=[picture] if r.compare.plots and picture.exists() else [])
    say(f"report: {report}")
    return 0 if holds else 1


def verdict_line(r: RecheckRun, analysis: Analysis) -> tuple[bool, str]:
    """(whether the saving holds, the one line a pipeline gates on)."""
    ratio, low, high = r.claimed
    claimed = f"the study confirmed ratio {ratio:.3f} [{low:.3f}, {high:.3f}]"
    deployed = flags_words(r.under_test)
    est = analysis.estimate
    if est is None:
        why = analysis.notes[0] if analysis.notes else "no estimate"
        if len(analysis.notes) > 1:
            why += f" (and {len(analysis.notes) - 1} more notes above)"
        return False, (f"recheck: NO LONGER HOLDS: the deployed {deployed} measured no ratio to the baseline "
                       f"({analysis.verdict}: {why}), where {claimed}")
    measured = (f"ratio {est.ratio:.3f} [{est.ci_low:.3f}, {est.ci_high:.3f}] {analysis.verdict} "
                f"({est.percent[0]:+.1f}% cost)")
    if analysis.verdict == CHEAPER:
        return True, (f"recheck: HOLDS: the deployed {deployed} is still cheaper than the baseline: {measured}, "
                      f"where {claimed}")
    return False, (f"recheck: NO LONGER HOLDS: the deployed {deployed} is not shown cheaper than the baseline any "
                   f"more: {measured}, where {claimed}")


def flags_words(flags: Mapping[str, Any], *, keys: Mapping[str, Any] | None = None) -> str:
    """`max_num_seqs=7 max_num_batched_tokens=1792`: the flags (of `keys` only, if given); unset: vLLM's default."""
    names = sorted(keys if keys is not None else flags)
    return " ".join(f"{k}={flags[k] if flags.get(k) is not None else 'default'}" for k in names)


def now_environment(analysis: Analysis) -> dict[str, Any]:
    """What the new replicates ran with (each record carries it)."""
    for record in analysis.records:
        if record.get("environment"):
            return dict(record["environment"])
    return {}


def side_by_side(then: Mapping[str, Any] | None, now: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    return [(label, (then or {}).get(key), now.get(key)) for label, key in VERSIONS]


def versions_words(environment: Mapping[str, Any] | None) -> str:
    if not environment:
        return "versions not recorded"
    return ", ".join(f"{label} {shown(environment.get(key))}" for label, key in VERSIONS)


def shown(value: Any) -> str:
    return "-" if value in (None, "") else str(value)
