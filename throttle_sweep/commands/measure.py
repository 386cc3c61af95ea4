"""mode=measure: one configuration, measured once."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from rich.console import Console

from throttle_sweep.measurement.replicate import closing_notes, measure_replicate, one_line
from throttle_sweep.report.html_page import Section, Table, facts, flag_words, write
from throttle_sweep.settings.notes import concurrency_note, kv_size_note
from throttle_sweep.settings.sections import (
    engine_from,
    plain,
    price_from,
    run_dir,
    single_arm,
    workload_from,
)
from throttle_sweep.store.lock import hold
from throttle_sweep.store.provenance import claim_run_folder
from throttle_sweep.store.records import RecordLog, is_ok


def run(cfg: DictConfig, console: Console) -> int:
    price, spec, engine = price_from(cfg), workload_from(cfg), engine_from(cfg)
    flags = single_arm(cfg, engine, spec)
    timed = None if spec.replicate_s is None else (
        f"workload.replicate_s sizes the work of a comparison or a sweep; one measurement runs "
        f"workload.num_requests ({spec.num_requests})")
    for note in (concurrency_note(flags, spec, source="engine"), kv_size_note(flags, source="engine"), timed):
        if note is not None:
            console.print(f"[yellow]note:[/] {note}", highlight=False)
    out = run_dir(cfg)
    with hold(out, what=f"run {out.name!r}"):  # one writer per results folder
        claim_run_folder(out, plain(cfg), "measure")
        OmegaConf.save(cfg, out / "config.yaml")
        log = RecordLog(out / "replicates.jsonl", say=partial(console.print, highlight=False))
        console.print(f"measuring {flags} on {engine.name} ...")
        record = measure_replicate(engine, flags, spec, price, run_id=out.name, arm="measure",
                                   position=len(log.records))
        log.append(record)
    console.print(one_line(record, price))
    for note in closing_notes([record]):
        console.print(f"[yellow]note:[/] {note}", highlight=False)
    console.print(f"record: {log.path}")
    console.print(f"report: {page(out, record, one_line(record, price), engine.name)}")
    return 0 if is_ok(record) else 1


RUN_FACTS = ("status", "output_tokens_per_s", "usd_per_mtok", "usd_per_mtok_total", "cost_basis", "preemptions",
             "peak_kv_cache_usage", "requests_completed", "requests_failed", "output_tokens", "wall_s",
             "engine_start_s", "started_at")


def page(out: Path, record: dict[str, Any], told: str, engine: str) -> Path:
    """report.html: the one line, the run's numbers, its latency percentiles and the flags it ran with."""
    latency = record.get("latency_s") or {}
    sections = [Section("The run", text=told.splitlines(), tables=[facts(record, keys=RUN_FACTS)])]
    if latency:
        sections.append(Section("Latency (seconds)", tables=[Table(
            ("", "p50", "p95", "p99", "requests"),
            [(kind, v.get("p50"), v.get("p95"), v.get("p99"), v.get("n")) for kind, v in latency.items()
             if isinstance(v, dict)])]))
    sections.append(Section("Flags", tables=[facts(record.get("flags") or {})]))
    return write(out, f"measure of {flag_words(record.get('flags') or {})} on {engine}", told.splitlines()[0],
                 sections)
