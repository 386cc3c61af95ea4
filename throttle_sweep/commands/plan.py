"""mode=plan study.name=NAME plan.demand=PATH: the replicas, GPU-hours and dollars a day of demand needs, from
a finished capacity study or goodput sweep (replica_plan/day.py). It measures nothing: it reads the study, and
writes plan.json, plan.png and plan.html beside it."""

from __future__ import annotations

import json
from functools import partial

from omegaconf import DictConfig
from rich.console import Console

from throttle_sweep.replica_plan.day import plan_day, plan_json, totals
from throttle_sweep.replica_plan.report import capacity_notes, day_lines, page, plot, table, type_lines
from throttle_sweep.settings.plan import load_plan


def run(cfg: DictConfig, console: Console) -> int:
    r = load_plan(cfg)  # the study and the demand, read and checked
    study, buckets = r.study, r.buckets
    say = partial(console.print, highlight=False)
    plan = plan_day(buckets, study.served)
    rates = [b.rps for b in buckets]
    said = [f"plan for study {study.name!r} ({study.kind}): {study.served.words()}",
            f"demand: {r.demand}, {len(buckets)} buckets over {plan.hours:.3g} h: {min(rates):.3g} to "
            f"{max(rates):.3g} req/s, mean {plan.mean_rps:.3g}", *study.notes, *capacity_notes(study.served)]
    for line in [*said, *table(plan), *day_lines(plan)]:
        say(line)
    typed = {t: plan_day(buckets, served) for t, served in study.types.items()}
    for line in type_lines(typed):
        say(line)
    result = {**plan_json(plan, r.demand), "study": study.name, "kind": study.kind,
              **({"gpu_types": {t: {"config": p.served.label, "params": p.served.params,
                                    "usd_per_gpu_hour": p.served.usd_per_gpu_hour, **totals(p)}
                                for t, p in typed.items()}} if typed else {})}
    (study.folder / "plan.json").write_text(json.dumps(result, indent=2) + "\n")
    if r.plots:
        plot(plan, study.folder / "plan.png", f"study {study.name!r} ({study.kind}), {study.served.label}: demand "
             f"against the capacity its replicas provision\n{study.served.capacity_words()}")
        say(f"picture: {study.folder / 'plan.png'} (demand against capacity over the day)")
    say(f"plan: {study.folder / 'plan.json'}")
    pictures = [study.folder / "plan.png"] if r.plots else []
    say(f"report: {page(study.folder, f'plan for study {study.name}', said, plan, typed, pictures)}")
    return 0
