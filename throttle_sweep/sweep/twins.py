"""One configuration, one answer: flags whose recorded engine schedule is another configuration's (they
differ only in knobs that change nothing the engine did, sweep/schedules.py) are told that one's answer,
never measured and never confirmed apart from it."""

from __future__ import annotations

import optuna

from throttle_sweep.stats.schedule import BASELINE
from throttle_sweep.sweep.runner import Runner
from throttle_sweep.sweep.state import StudyView
from throttle_sweep.sweep.trials import SCHEDULE_ATTRS, constraint_attrs, p95, set_constraints


def tell_same_schedule(runner: Runner, view: StudyView, trial: optuna.trial.Trial,
                       twin: optuna.trial.FrozenTrial | str) -> None:
    """Tell the trial its twin's answer: a measured trial's, or the baseline's (a ratio of 1 to the baseline;
    to a reference, its probe over the reference's probes)."""
    s = view.settings
    if twin == BASELINE:
        record = view.findings.baseline_probe  # there is one: StudyView.schedule_twin names the baseline only then
        preempt = record.get("preemptions") or 0
        tails = {f"p95_{m}_s": p95(record, m) for m in ("ttft", "tpot", "itl", "e2e")}
        yardstick, own = view.yardstick_cost(), view.probe_cost(record)
        ratio = own / yardstick if view.findings.reference is not None and own and yardstick else 1.0
        attrs = {"ratio": ratio, "preemptions": preempt, "usd_per_mtok": own, **tails,
                 **constraint_attrs(preempt, tails["p95_ttft_s"], tails["p95_tpot_s"], tails["p95_itl_s"], s)}
        values, name = [ratio, tails["p95_e2e_s"]], "the baseline"
    else:
        attrs = {k: twin.user_attrs[k] for k in SCHEDULE_ATTRS if k in twin.user_attrs}
        values, name = list(twin.values), f"trial {twin.number}"
    attrs.update(source="schedule", status="ok", same_schedule_as=name,
                 notes=[f"the same step-by-step engine schedule as {name}, which differs only in scheduling "
                        "knobs: one configuration, measured once"])
    said = f"the same engine schedule as {name} (not measured again)"
    if twin == BASELINE and view.is_baseline(trial.params):  # the very flags the baseline's run resolved
        attrs.update(source="baseline", notes=["the baseline's own configuration (the flags it leaves to vLLM "
                                               "resolve to these): its answer, not measured as a trial"])
        said = "the baseline's own configuration, as vLLM resolved its defaults (not measured as a trial)"
    for key, value in attrs.items():
        trial.set_user_attr(key, value)
    set_constraints(trial, attrs)
    view.study.tell(trial, values if s.multi_objective else values[0])
    runner.say(f"trial {trial.number} {trial.params}: {said}")
