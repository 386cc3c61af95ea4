"""What a sweep found: the trial table, the preemption boundary, the confirmed winner, report.md and plots."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from throttle_sweep.measurement.cost import Price
from throttle_sweep.report import html_page
from throttle_sweep.stats.analysis import BASIS_LABEL
from throttle_sweep.store.records import is_ok
from throttle_sweep.sweep.boundary import describe, ordered
from throttle_sweep.sweep.driver import SweepResult
from throttle_sweep.sweep.refusals import refusal_lines
from throttle_sweep.sweep.trials import cost, feasible, told_reference
from throttle_sweep.sweep.winner import WINNER_RULE, Confirmation, arm_of, joint_fit_of


def trial_rows(study: optuna.Study) -> list[dict[str, Any]]:
    rows = []
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get("interrupted") or t.state == TrialState.WAITING:
            continue  # closed by an interruption and asked again, or enqueued but never reached
        a = t.user_attrs
        status = "ok" if t.state == TrialState.COMPLETE else t.state.name.lower()
        rows.append({"trial": t.number, "params": t.params, "usd_per_mtok": a.get("usd_per_mtok"),
                     "j_per_output_token": a.get("j_per_output_token"),
                     "ratio": a.get("ratio"), "ci": a.get("ci"), "verdict": a.get("verdict"),
                     "preemptions": a.get("preemptions"), "feasible": feasible(t), "status": status,
                     "reason": a.get("reason"), "duplicate_of": a.get("duplicate_of"),
                     "source": a.get("source"), "same_schedule_as": a.get("same_schedule_as"),
                     "stopped": a.get("stopped"), "alpha": a.get("alpha_per_look"),
                     "looks": a.get("looks"),
                     "ran_on": ",".join(a.get("ran_on") or [])})
    return rows


def boundary(study: optuna.Study) -> list[str]:
    """The boundaries the probes found (exact, with the KV capacity's prediction beside), or else where
    preemption starts as read from the trials' replicates."""
    found = study.user_attrs.get("boundaries")
    if found:
        return [describe(b, b.get("predicted_last_clean")) for b in found]
    return boundary_from_trials(study)


def boundary_from_trials(study: optuna.Study) -> list[str]:
    """Where preemption starts along each ordered flag, for each setting of the other flags measured with it.
    The direction is read from the data (more max_num_seqs preempts sooner; more gpu_memory_utilization,
    later); where preempting and clean values interleave, it says there is no clean boundary."""
    done = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE
            and "preemptions" in t.user_attrs and "duplicate_of" not in t.user_attrs]
    flags = sorted({k for t in done for k, d in t.distributions.items() if ordered(d)})
    lines = []
    for flag in flags:
        groups: dict[tuple, list[optuna.trial.FrozenTrial]] = {}
        for t in done:
            if flag in t.params:
                others = tuple(sorted((k, v) for k, v in t.params.items() if k != flag))
                groups.setdefault(others, []).append(t)
        readable = {o: ts for o, ts in groups.items() if len({t.params[flag] for t in ts}) > 1}
        for others, trials in sorted(readable.items(), key=lambda g: str(g[0])):
            given = f" with {fmt_params(dict(others))}" if others else ""
            lines.append(_boundary_line(flag, trials) + given)
        if not readable and groups:
            lines.append(f"no boundary along {flag} can be read: no two trials differ in {flag} alone")
    return lines


def _boundary_line(flag: str, trials: list[optuna.trial.FrozenTrial]) -> str:
    clean = sorted({t.params[flag] for t in trials if t.user_attrs["preemptions"] == 0})
    dirty = sorted({t.params[flag] for t in trials if t.user_attrs["preemptions"] > 0})
    if clean and dirty and max(clean) < min(dirty):  # preempts above a value
        return f"preemption starts between {flag} {max(clean)} (none) and {min(dirty)} (preempted)"
    if clean and dirty and min(clean) > max(dirty):  # preempts below a value
        return f"preemption starts between {flag} {min(clean)} (none) and {max(dirty)} (preempted)"
    if clean and dirty:
        return (f"no clean preemption boundary along {flag}: preempting and clean values interleave (clean: "
                f"{', '.join(map(str, clean))}; preempted: {', '.join(map(str, dirty))})")
    if dirty:
        return f"every measured {flag} preempted ({min(dirty)} to {max(dirty)}): the boundary lies outside the range"
    return f"no preemption at any measured {flag} ({min(clean)} to {max(clean)}): the boundary lies outside the range"


def fmt_params(params: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(params.items()))


def yardstick(study: optuna.Study) -> str:
    """What the search's ratios are to: the reference point (probes.choose_reference) or the baseline."""
    ref = told_reference(study)
    return f"reference {fmt_params(ref.params)}" if ref is not None else "baseline"


def row_cells(r: dict[str, Any], versus: str) -> tuple[str, str, str]:
    """A trial row's cost, ratio and status, as the table shows them for where its answer came from."""
    usd = f"{r['usd_per_mtok']:.4f}" if r["usd_per_mtok"] else "-"
    ratio = f"{r['ratio']:.3f} [{r['ci'][0]:.3f}, {r['ci'][1]:.3f}]" if r["ratio"] and r["ci"] else "-"
    status = r["status"] if r["feasible"] or r["status"] != "ok" else "infeasible"
    reason = r["reason"]
    if r["source"] == "probe":
        probes = "probe" if versus == "baseline" else "probes"
        status = f"infeasible (one probe run; ratio to the {versus.split(' ')[0]}'s {probes})"
        ratio = f"{r['ratio']:.3f} (probe)"
    elif r["source"] == "schedule":
        status = (f"{'' if r['feasible'] else 'infeasible: '}same engine schedule as {r['same_schedule_as']} "
                  "(not measured again)")
        ratio = f"{r['ratio']:.3f} (as {r['same_schedule_as'].removeprefix('the ')})"
    elif r["source"] == "baseline":
        status, ratio = "the baseline's own configuration, vLLM's defaults resolved (not measured as a trial)", \
            f"{r['ratio']:.3f} (as baseline)"
    elif r["source"] == "reference":
        status, ratio = "the search's reference: its ratios are to this point (probed clean twice)", "1 (reference)"
    elif r["source"] == "refused":
        status, ratio, usd = "refused by vLLM (not run)", "-", "-"
    elif r["source"] == "boundary":
        status, ratio, usd, reason = "infeasible (beyond the probed boundary: not run)", "-", "-", None
    elif r["stopped"]:
        status += f" (stopped early: {r['stopped']})"
    if reason:
        status += f": {reason[:80]}"
    return usd, ratio, status


def preemption_allowed(study: optuna.Study, versus: str) -> list[str]:
    """For information: the cheapest point that preempted, if any."""
    trials = study.get_trials(deepcopy=False)
    infeasible = [t for t in trials if t.state == TrialState.COMPLETE and not feasible(t)
                  and t.user_attrs.get("source") != "refused"]  # never run: no cost, no preemption
    if not infeasible:
        return []
    cheapest = min(infeasible, key=cost)
    best = min((t for t in trials if feasible(t)), key=cost, default=None)
    note = ""
    if best is not None and cost(cheapest) < cost(best):
        note = (" - cheaper than the best feasible point: recomputation is cheap on this engine, but "
                "preemption costs tail latency, so it stays excluded")
    return [f"for information, cheapest with preemption allowed: {fmt_params(cheapest.params)} ratio "
            f"{cost(cheapest):.3f}{'' if versus == 'baseline' else ' to the ' + versus} with "
            f"{cheapest.user_attrs['preemptions']} preemptions per replicate{note}"]


def confirmation_line(c: Confirmation) -> str:
    quoted = c.adjusted or c.analysis
    est = quoted.estimate
    line = f"confirm trial {c.source_trial} {fmt_params(c.params)}: "
    if est is None:
        line += quoted.verdict
    else:
        looks = f" x {c.looks} looks" if c.looks > 1 else ""
        line += (f"ratio {est.ratio:.3f} [{est.ci_low:.3f}, {est.ci_high:.3f}] (Bonferroni-adjusted for "
                 f"{c.family} confirmed{looks}), {quoted.verdict}")
        if c.stopped:
            line += f", stopped at {len(c.analysis.records)} runs ({c.stopped})"
        if c.shared:
            others = ", ".join(str(n) for n in c.shared if n != c.source_trial)
            line += f"; baseline runs shared with trial {others}"
    if c.broken:
        line += f"; cannot win: {'; '.join(c.broken)}"
    return line


def tiebreak_line(result: SweepResult) -> str:
    tie = result.tiebreak
    head = (f"tie-break: trials {', '.join(map(str, tie.trials))} (no direct contrast told them apart) ran again "
            f"against each other alone, {tie.replicates} runs each")
    contenders = [c for c in result.confirmations if c.source_trial in tie.trials]
    fitted = joint_fit_of(contenders, tie.observations) if tie.observations else None
    if fitted is None:
        why = f"failed ({tie.failed})" if tie.failed else "no fit"
        return f"{head}: {why}; the confirmation's ranking stands"
    ratios = sorted((math.exp(fitted.effect(arm_of(c))[0]), c.source_trial) for c in contenders)
    return (f"{head}; one fit over these and their confirmation's runs ranks them (ratio to the baseline): "
            + ", ".join(f"trial {n} {r:.3f}" for r, n in ratios) + "; the lowest wins, its claim is its confirmation's")


def lines(result: SweepResult, price: Price, max_preemptions: int) -> list[str]:
    rows = trial_rows(result.study)
    versus = yardstick(result.study)
    base = result.study.user_attrs.get("baseline")
    many = len({r["ran_on"] for r in rows if r["ran_on"]}) > 1  # several slots: say which ran each trial
    energy = any(r["j_per_output_token"] for r in rows)  # the GPUs' energy was measured: a column of J/token
    out = [f"{'trial':>5}  {'flags':<44} {'$/M':>8}  " + (f"{'J/tok':>7}  " if energy else "")
           + f"{'ratio [CI]':<22} {'verdict':<13} {'preempt':>7}  " + (f"{'slot':<26}" if many else "") + "status"]
    repeats = [r for r in rows if r["duplicate_of"] is not None]  # a line of their own, not one each
    for r in rows:
        if r["duplicate_of"] is not None:
            continue
        usd, ratio, status = row_cells(r, versus)
        slot = f"{r['ran_on'] or '-':<26}" if many else ""
        joules = f"{r['j_per_output_token']:>7.3g}  " if r["j_per_output_token"] and usd != "-" else f"{'-':>7}  "
        out.append(f"{r['trial']:>5}  {fmt_params(r['params']):<44} {usd:>8}  {joules if energy else ''}{ratio:<22} "
                   f"{r['verdict'] or '-':<13} {r['preemptions'] if r['preemptions'] is not None else '-':>7}  "
                   f"{slot}{status}")
    if repeats:
        out.append(f"{len(repeats)} more proposal(s) repeated flags already answered: not measured again (their "
                   "trials say duplicate_of in the study)")
    levels = sorted({r["alpha"] for r in rows if r["alpha"]})
    level = "/".join(f"{100 * (1 - a):g}%" for a in levels) or "95%"
    out.append(f"($ per million output tokens, {BASIS_LABEL[result.cost_basis]}, {price.label()}; "
               f"ratio = candidate/{versus}, drift-aware, {level} intervals"
               + (": alpha split over the looks a screen may take)" if any((r["looks"] or 1) > 1 for r in rows)
                  else ")"))
    if versus != "baseline":
        out.append(f"(the search compared candidates against the {versus}, fast and clean; the confirmations "
                   "below measure against the baseline)")
    out.extend(boundary(result.study))
    out.extend(refusal_lines(result.study))
    if result.pareto:
        out.append("Pareto front of feasible trials (cost ratio vs the candidate's p95 end-to-end latency):")
        out += [f"  trial {t.number:>3} {fmt_params(t.params):<40} ratio {cost(t):.3f} "
                f"[{t.user_attrs['ci'][0]:.3f}, {t.user_attrs['ci'][1]:.3f}]  p95 E2E {t.values[1]:.3f} s"
                for t in result.pareto]
    out.extend(preemption_allowed(result.study, versus))
    out.extend(confirmation_line(c) for c in result.confirmations)
    if result.confirmations:
        out.append(WINNER_RULE)
    if result.tiebreak is not None:
        out.append(tiebreak_line(result))
    if result.tied:
        out.append("tied with the winner (no direct contrast tells them apart): " + ", ".join(
            f"trial {c.source_trial} {fmt_params(c.params)}" for c in result.tied))
    if result.winner is not None:
        est = (result.winner.adjusted or result.winner.analysis).estimate
        cand = [cost for _, cost in result.winner.analysis.costs("candidate")]
        out.append(f"winner (every constraint kept; max {max_preemptions} preemptions): "
                   f"{fmt_params(result.winner.params)}: "
                   f"{100 * (est.ratio - 1):+.1f}% cost (CI {100 * (est.ci_low - 1):+.1f}% to "
                   f"{100 * (est.ci_high - 1):+.1f}%) vs {baseline_words(base)}, ${min(cand):.4f}-${max(cand):.4f}/M "
                   "output tokens in confirmation")
        if (sure := result.certainty) is not None:
            fits = " and the tie-break's" if result.tiebreak is not None and result.tiebreak.observations else ""
            out.append(f"how sure: the cheapest of the {sure.rivals + 1} confirmed in {100 * sure.best:.0f}% of draws "
                       f"from the confirmation's fits{fits}, within the {100 * sure.margin:g}% margin of the cheapest "
                       f"in {100 * sure.within:.0f}% (a flat prior on each ratio)")
        same = [t for t in result.study.get_trials(deepcopy=False)
                if t.user_attrs.get("same_schedule_as") == f"trial {result.winner.source_trial}"]
        if same:
            out.append("the same configuration as the winner (the same engine schedule, scheduling knobs apart; "
                       "measured once): " + ", ".join(fmt_params(t.params) for t in same))
    elif (why := no_answer(result)) is not None:
        out.append(why)
    else:
        untuned = " vLLM as it runs untuned" if base and all(base.get(k) is None for k in BATCH) else ""
        # a saving beyond the noise that may lie inside the margin is not a claim, but not nothing either
        small = [c for c in result.confirmations if not c.broken and (est := (c.adjusted or c.analysis).estimate)
                 is not None and est.ci_high < 1]
        out.append(f"no candidate was confirmed cheaper than {baseline_words(base)} by more than the margin"
                   + ("; beyond the noise, but not shown beyond the margin: " + ", ".join(
                       f"trial {c.source_trial} {fmt_params(c.params)}" for c in small) if small
                      else f": none beat{untuned}" if untuned else ""))
    return out


BATCH = ("max_num_seqs", "max_num_batched_tokens")


def baseline_words(baseline: Mapping[str, Any] | None) -> str:
    """The baseline by its batch flags, saying which are vLLM's own defaults (what an untuned server runs)."""
    if baseline is None:
        return "the baseline"
    given = " ".join(f"{k}={baseline[k]}" for k in BATCH if baseline.get(k) is not None)
    left = [k for k in BATCH if baseline.get(k) is None]
    many = len(left) > 1
    defaults = (f"{', '.join(left)}: vLLM's default{'s' if many else ''}, as `vllm serve` resolves "
                f"{'them' if many else 'it'}")
    return "the baseline" + (f" {given}" if given else "") + (f" ({defaults})" if left else "")


def no_answer(result: SweepResult) -> str | None:
    """Why the sweep has no answer at all: its search stopped on its budget before any comparison was measured
    (the probes alone decide nothing), so no saving is claimed nor ruled out. None when it has one."""
    compared = any(r.get("stage") in ("search", "confirm") and is_ok(r) for r in result.records)
    again = "raise study.timeout_s or study.budget_usd (or unset them) and run the same command again: it resumes"
    if result.stopped_by is None or result.confirmations:
        return None
    if result.confirm_cut:
        return (f"stopped before an answer: the budget ran out before any candidate was confirmed "
                f"({result.stopped_by}), so no saving is claimed or ruled out; {again}")
    if compared:
        return None
    return (f"stopped before an answer: the search's budget ran out before any comparison was measured "
            f"({result.stopped_by}), so no candidate was compared with the baseline and nothing is claimed or "
            f"ruled out; {again}")


def write_report(out: Path, result: SweepResult, price: Price, max_preemptions: int, *, plots: bool,
                 latency_limits: Mapping[str, float | None] | None = None) -> Path:
    text = ["# Sweep report", "", "```", *lines(result, price, max_preemptions), "```", ""]
    if plots:
        from throttle_sweep.sweep import tradeoff_picture  # matplotlib only when pictures are drawn
        from throttle_sweep.sweep.picture import draw

        try:
            text += draw(out, result, max_preemptions)
            text += tradeoff_picture.draw(out, result, max_preemptions, latency_limits or {})
        except Exception as exc:  # a picture must not cost the sweep its report and its export
            text.append(f"(pictures not drawn: {type(exc).__name__}: {exc})")
    path = out / "report.md"
    path.write_text("\n".join(text) + "\n")
    pictures = [out / name for name in re.findall(r"\]\(([^)]+\.png)\)", "\n".join(text))]
    page(out, result, price, max_preemptions, pictures)
    return path


ANSWERS = ("winner (", "stopped before an answer", "no candidate was confirmed")  # the lines that answer the sweep


def page(out: Path, result: SweepResult, price: Price, max_preemptions: int, pictures: list[Path]) -> Path:
    """report.html: the answer, the trials as a table, the printout's other lines, the pictures."""
    told = lines(result, price, max_preemptions)
    versus = yardstick(result.study)
    rows = [r for r in trial_rows(result.study) if r["duplicate_of"] is None]
    cells = []
    for r in rows:
        usd, ratio, status = row_cells(r, versus)
        cells.append((r["trial"], fmt_params(r["params"]), usd, ratio, r["verdict"], r["preemptions"], status))
    trials = html_page.Table(("trial", "flags", "$/M", "ratio [CI]", "verdict", "preemptions", "status"), cells)
    sections = [html_page.Section("Trials", tables=[trials]),
                html_page.Section("The sweep", text=told[1 + len(rows):])]  # its table is the one above
    if pictures:
        sections.append(html_page.Section("Pictures", pictures=pictures))
    answer = next((line for line in told if line.startswith(ANSWERS)), told[-1])
    return html_page.write(out, f"sweep {result.study.study_name}", answer, sections)

