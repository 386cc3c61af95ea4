"""Every mode that writes a results folder writes report.html beside its other files, and the page's answer is
the mode's answer as the terminal said it; on the fake engine, as each mode's own tests run it (the goodput
sweep's in test_goodput_sweep.py, on the sweep its tests share)."""

from __future__ import annotations

import html
import json
import re

from rich.console import Console

from tests.helpers import compose_cfg
from tests.unit.test_recheck import fake_study
from tests.unit.test_replica_plan import HOURLY, capacity_study, demand_csv
from tests.unit.test_sweep import SPACE, WORK
from throttle_sweep.commands import analyze as analyze_cmd
from throttle_sweep.commands import capacity as capacity_cmd
from throttle_sweep.commands import compare as compare_cmd
from throttle_sweep.commands import measure as measure_cmd
from throttle_sweep.commands import plan as plan_cmd
from throttle_sweep.commands import recheck as recheck_cmd
from throttle_sweep.commands import sweep as sweep_cmd


def said_and_answer(run, cfg, folder, name="report.html") -> tuple[int, str, str, str]:
    """(exit code, what the terminal said, the report's answer, the whole report as text); `folder` may be a
    function of the results folder found after the run."""
    console = Console(record=True, width=400, soft_wrap=True)
    code = run(cfg, console)
    return (code, console.export_text(), *report_of((folder() if callable(folder) else folder) / name))


def report_of(path) -> tuple[str, str]:
    page = path.read_text()
    return html.unescape(re.search(r'<p class="answer">(.*?)</p>', page, re.S).group(1)), html.unescape(page)


def test_measure(tmp_path):
    cfg = compose_cfg("backend=fake", "run=one", "workload.num_requests=16", tmp_path=tmp_path)
    code, said, answer, _ = said_and_answer(measure_cmd.run, cfg, tmp_path / "one")
    assert code == 0 and "output tok/s" in answer and "/M output tokens" in answer and answer in said


def test_a_measurement_that_failed_says_so_in_its_report(tmp_path):
    cfg = compose_cfg("backend=fake", "run=crash", "workload.num_requests=16", "fake.crash_after_steps=3",
                      tmp_path=tmp_path)
    code, said, answer, _ = said_and_answer(measure_cmd.run, cfg, tmp_path / "crash")
    assert code == 1 and answer.startswith("FAILED") and "crash_after_steps" in answer and answer in said


def test_compare_and_analyze_of_its_records(tmp_path):
    cfg = compose_cfg("backend=fake", "fake.noise_sd=0.02", "workload.num_requests=24", "workload.output_len=32",
                      "run=c", "plots=true", tmp_path=tmp_path)
    code, said, answer, page = said_and_answer(compare_cmd.run, cfg, tmp_path / "c")
    verdict = json.loads((tmp_path / "c" / "summary.json").read_text())["verdict"]
    assert code == 0 and answer.startswith(f"verdict: {verdict}; change ") and all(
        part in said for part in answer.split("; "))
    assert 'alt="replicates.png"' in page and "data:image/png;base64," in page
    cfg = compose_cfg(f"input={tmp_path / 'c' / 'replicates.jsonl'}", "mode=analyze", "run=again", "plots=false",
                      tmp_path=tmp_path)
    code, said, answer, _ = said_and_answer(analyze_cmd.run, cfg, lambda: next((tmp_path / "again" / "analysis")
                                                                              .iterdir()))
    assert code == 0 and answer.startswith(f"verdict: {verdict}") and all(part in said for part in answer.split("; "))


def test_capacity(tmp_path):
    cfg = compose_cfg("mode=capacity", "run=cap", "backend=fake", "workload.num_requests=100", "capacity.run_s=20",
                      "capacity.knee_rates=4", "slo.p95_ttft_s=0.2", "slo.p95_tpot_s=0.05", "plots=false",
                      tmp_path=tmp_path)
    code, said, answer, page = said_and_answer(capacity_cmd.run, cfg, tmp_path / "cap")
    capacity = json.loads((tmp_path / "cap" / "summary.json").read_text())["capacity_rps"]
    assert code == 0 and answer.startswith(f"capacity: {capacity:.3g} req/s") and answer in said
    assert "<th>verdict" in page  # the knee's rates, a row each


def test_cost_sweep(tmp_path):
    cfg = compose_cfg("backend=fake", *WORK, *SPACE, "study.name=s", "study.n_trials=3", "compare.replicates=2",
                      "study.confirm_replicates=2", "plots=false", tmp_path=tmp_path)
    code, said, answer, _ = said_and_answer(sweep_cmd.run, cfg, tmp_path / "s")
    assert code == 0 and answer.startswith(("winner", "no candidate")) and answer in said


def test_plan_beside_the_study_it_plans_without_replacing_the_studys_report(tmp_path):
    study = capacity_study(tmp_path / "cap", 12.0, 10.0, 15.0)
    (study / "report.html").write_text("the study's own")
    cfg = compose_cfg("mode=plan", "study.name=cap", f"plan.demand={demand_csv(tmp_path / 'd.csv', HOURLY)}",
                      "plots=false", tmp_path=tmp_path)
    code, said, answer, page = said_and_answer(plan_cmd.run, cfg, study, name="plan.html")
    assert code == 0 and answer.startswith("the day (") and "$12.00" in answer and answer in said
    assert "<th>replicas" in page and (study / "report.html").read_text() == "the study's own"


def test_recheck(tmp_path):
    out = fake_study(tmp_path)
    cfg = compose_cfg("mode=recheck", "fake.noise_sd=0.02", "study.name=s", tmp_path=tmp_path)
    code, said, answer, _ = said_and_answer(recheck_cmd.run, cfg, lambda: next(out.glob("recheck-*")))
    assert code == 0 and answer.startswith("recheck: HOLDS") and answer in said
