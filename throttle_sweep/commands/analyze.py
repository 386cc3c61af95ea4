"""mode=analyze input=PATH [comparison=NAME]: recompute comparisons from raw records, with no engine.

Any file the tool writes can be given: a sweep's records hold probes, search trials and confirmations, a
compare run's one comparison (and any part an interrupted run abandoned), a measure run's single runs. The
file's contents are listed first; every whole comparison is recomputed, or only the one named."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig
from rich.console import Console

from throttle_sweep.errors import ConfigError
from throttle_sweep.measurement.cost import Price
from throttle_sweep.report.comparison import lines, write
from throttle_sweep.settings.analyze import load_analyze
from throttle_sweep.stats.analysis import analyse, analyse_joint, check_positions, load_input
from throttle_sweep.store.inventory import CALIBRATION, CAPACITY, COMPARISON, GOODPUT, MEASURE, PROBE, Entry, inventory
from throttle_sweep.store.records import is_ok


def run(cfg: DictConfig, console: Console) -> int:
    a = load_analyze(cfg)  # every check before any file is read
    path, thresholds = a.input, a.thresholds
    entries = inventory(load_input(path), stem=path.stem)
    say = lambda text: console.print(text, highlight=False)  # noqa: E731
    if len(entries) > 1 or entries[0].kind != COMPARISON or entries[0].partial:
        for line in listing(entries, path):
            say(line)
    chosen = choose(entries, a.comparison, path)
    if not chosen and any(e.kind in GOODPUT for e in entries):  # said in the listing: nothing is recomputed
        return 1
    for entry in chosen:
        first = entry.records[0]
        price = (Price(first["usd_per_gpu_hour"], first["gpus"], first.get("usd_per_kwh"))
                 if "usd_per_gpu_hour" in first else None)
        theirs = "schema_version" not in first  # a user's CSV: bad data is an error, not a withheld verdict
        if theirs:
            check_positions(entry.records, str(path))
        analysis = analyse(entry.records, thresholds, token_tolerance=a.token_tolerance, strict=theirs, cost=a.cost)
        if entry.joint is not None:  # one candidate of a joint confirmation: one fit over all its runs
            analysis = analyse_joint(entry.joint, thresholds, token_tolerance=a.token_tolerance,
                                     cost=a.cost).get(entry.trial, analysis)
        if entry.partial:
            analysis.verdict = f"PARTIAL, not a verdict ({analysis.verdict} on the part measured)"
            analysis.notes.insert(0, f"this comparison is partial: {entry.partial}")
        if len(entries) > 1:
            say(f"[bold]comparison {entry.name}[/]" + (f" ({entry.stage} {entry.key})" if entry.key else ""))
        for line in lines(analysis, thresholds, price):
            say(line)
        paths = write(a.out_root / "analysis" / entry.name, analysis, thresholds, price, plot=a.plots)
        say(f"summary: {paths['md']}")
        say(f"report: {paths['html']}")
    return 0


def listing(entries: list[Entry], path: Path) -> list[str]:
    """What the file holds, one line each; single runs (probes, measurements) are not comparisons."""
    out = [f"{path} holds:"]
    probes = [e for e in entries if e.kind == PROBE]
    if probes:
        counts = ", ".join(f"{e.key.removeprefix('probe ')} {sum(r.get('preemptions') or 0 for r in e.records)}"
                           for e in probes)
        out.append(f"  {len(probes)} probes, single runs that find the preemption boundary, not comparisons "
                   f"(preemptions: {counts})")
    for e in entries:
        if e.kind == COMPARISON:
            state = e.partial or ("whole" if e.stage is not None else f"{e.runs} runs")
            out.append(f"  comparison {e.name}  {e.stage or 'costs'} {e.key or ''}  {e.runs} runs: {state}")
        elif e.kind == CALIBRATION:
            runs = ", ".join(f"{r['workload']['num_requests']} requests in {r['wall_s']:.1f} s"
                             if is_ok(r) else str(r.get("status")) for r in e.records)
            out.append(f"  the calibration run that sized the work by time (workload.replicate_s): {runs}; not "
                       "a comparison")
        elif e.kind == CAPACITY:
            rates = [r["workload"]["rate"] for r in e.records]
            out.append(f"  {len(e.records)} runs of mode=capacity at {min(rates):.4g} to {max(rates):.4g} requests/s "
                       "(its summary.json says the capacity); not a comparison")
        elif e.kind in GOODPUT:
            rates = [r["workload"]["rate"] for r in e.records]
            out.append(f"  {len(e.records)} runs of a goodput sweep (study.objective=goodput: rate searches and "
                       f"confirmations at {min(rates):.4g} to {max(rates):.4g} requests/s): goodput records, which "
                       f"mode=analyze does not recompute (it recomputes cost comparisons). The sweep's answer is in "
                       f"{path.parent / 'summary.json'}; its command, run again, recomputes it from these records "
                       "without measuring anything again")
        elif e.kind == MEASURE:
            costs = ", ".join(f"${r['usd_per_mtok']:.4g}" if r.get("usd_per_mtok") else str(r.get("status"))
                              for r in e.records)
            out.append(f"  {e.runs} single run(s) of mode=measure ($ per million output tokens: {costs}); "
                       "not a comparison: mode=compare measures one")
    return out


def choose(entries: list[Entry], wanted: str | None, path: Path) -> list[Entry]:
    """The comparison named (by id, id prefix or the sweep's key), or every whole comparison."""
    comparisons = [e for e in entries if e.kind == COMPARISON]
    if wanted is None:
        return [e for e in comparisons if not e.partial]
    found = [e for e in comparisons if e.matches(str(wanted))]
    if not found:
        names = ", ".join(e.name + (f" ({e.key})" if e.key else "") for e in comparisons) or "none"
        raise ConfigError(f"comparison={wanted!r}: {path} holds no such comparison; it holds: {names}")
    return found
