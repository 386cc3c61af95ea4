"""Fixed work sized by time (workload.replicate_s): one run of the baseline at the configured size, once per
study, sets how many requests every replicate runs."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, replace

import pytest
from rich.console import Console

from tests.helpers import compose_cfg
from throttle_sweep.commands import compare as compare_cmd
from throttle_sweep.commands import sweep as sweep_cmd
from throttle_sweep.errors import ConfigError
from throttle_sweep.measurement import calibration
from throttle_sweep.measurement.workload import WorkloadSpec
from throttle_sweep.settings.sections import workload_from
from throttle_sweep.store.records import read_records


def test_the_size_scales_the_calibration_run_to_the_target_time_and_keeps_every_request_in_flight():
    spec = WorkloadSpec(num_requests=100, concurrency=16, replicate_s=45.0)
    assert calibration.sized_requests(spec, wall_s=10.0) == 450
    assert calibration.sized_requests(spec, wall_s=1000.0) == 16  # never fewer than are kept in flight
    assert calibration.sized_requests(spec, wall_s=45.0) == 100


def test_the_sentence_says_how_long_a_replicate_will_take_and_why_when_the_requests_in_flight_set_its_size():
    spec = WorkloadSpec(num_requests=2048, concurrency=2048, replicate_s=45.0)
    slow = {"wall_s": 220.8, "engine_start_s": 50.0}
    words = calibration.sentence(spec, calibration.sized(spec, slow), slow, again=False)
    assert "every replicate runs 2048 requests (about 221 s at the baseline: never fewer than the 2048 the loop " \
           "keeps in flight, so longer than workload.replicate_s=45 s)" in words
    fast = {"wall_s": 10.0}
    words = calibration.sentence(spec, calibration.sized(spec, fast), fast, again=False)
    assert "every replicate runs 9216 requests (about 45 s at the baseline, workload.replicate_s)" in words


@pytest.mark.parametrize("override, words", [
    ("workload.replicate_s=0", "workload.replicate_s must be a positive number of seconds"),
    ("workload.replicate_s=-3", "workload.replicate_s must be a positive number of seconds"),
    ("workload.replicate_s=inf", "workload.replicate_s must be a positive number of seconds"),
    ("workload.replicate_s=30 workload.num_requests=8", "workload.replicate_s needs workload.num_requests >= "),
    ("workload=open_loop", "workload.replicate_s sizes closed-loop work"),
])
def test_a_replicate_time_that_cannot_size_the_work_is_refused_by_name(override, words, tmp_path):
    extra = ["workload.replicate_s=30"] if override == "workload=open_loop" else []
    cfg = compose_cfg("backend=fake", *override.split(), *extra, tmp_path=tmp_path)
    with pytest.raises(ConfigError, match=words):
        workload_from(cfg).check(max_model_len=None)


SWEEP = ["backend=fake", "+experiment=demo", "slots=1", "plots=false", "study.n_trials=2", "study.confirm_top=1",
         "compare.replicates=2", "study.confirm_replicates=2", "workload.replicate_s=20"]


def test_a_sweep_sized_by_time_calibrates_once_and_every_replicate_runs_the_sized_work(tmp_path):
    console = Console(record=True, width=300)
    assert sweep_cmd.run(compose_cfg(*SWEEP, "study.name=timed", tmp_path=tmp_path), console) == 0
    records = read_records(tmp_path / "timed" / "replicates.jsonl")
    calibrations = [r for r in records if r.get("stage") == "calibration"]
    assert len(calibrations) == 1 and calibrations[0]["status"] == "ok"
    cal = calibrations[0]
    assert cal["workload"]["num_requests"] == 16 and cal["flags"]["max_num_seqs"] == 1  # the baseline, as configured
    sized = max(16, math.ceil(16 * 20 / cal["wall_s"]))
    # a probe runs two waves of its own batch (sweep/kv_capacity.py), every other run the sized work
    probes = [r for r in records if r.get("workload_changed")]
    assert probes and all(r["workload"]["num_requests"] == 2 * r["flags"]["max_num_seqs"] for r in probes)
    rest = [r for r in records if r.get("stage") != "calibration" and not r.get("workload_changed")]
    assert rest and {r["workload"]["num_requests"] for r in rest} == {sized} and sized > 16
    baseline_walls = [r["wall_s"] for r in rest if r["flags"] == cal["flags"] and r["status"] == "ok"]
    assert baseline_walls and all(15 < w < 25 for w in baseline_walls)  # a baseline replicate lasts about 20 s
    assert f"{sized} requests" in console.export_text()
    # the same command again: the size is read back, not measured again (the denominator never moves)
    console = Console(record=True, width=300)
    assert sweep_cmd.run(compose_cfg(*SWEEP, "study.name=timed", tmp_path=tmp_path), console) == 0
    again = read_records(tmp_path / "timed" / "replicates.jsonl")
    assert [r for r in again if r.get("stage") == "calibration"] == calibrations
    assert {r["workload"]["num_requests"] for r in again
            if r.get("stage") != "calibration" and not r.get("workload_changed")} == {sized}


def test_a_comparison_sized_by_time_runs_the_sized_work_on_both_arms(tmp_path):
    console = Console(record=True, width=300)
    cfg = compose_cfg("backend=fake", "mode=compare", "compare.replicates=2", "plots=false", "run=timed",
                      "workload.replicate_s=20", tmp_path=tmp_path)
    assert compare_cmd.run(cfg, console) == 0
    records = read_records(tmp_path / "timed" / "replicates.jsonl")
    cal = [r for r in records if r.get("stage") == "calibration"]
    assert len(cal) == 1 and cal[0]["arm"] == "baseline"
    measured = [r for r in records if r.get("stage") != "calibration"]
    assert len(measured) == 4 and len({r["workload"]["num_requests"] for r in measured}) == 1
    assert measured[0]["workload"]["num_requests"] > cal[0]["workload"]["num_requests"]


def test_a_calibration_of_other_baseline_flags_is_not_read_back(tmp_path):
    """A run stopped after its calibration, resumed with another baseline: the old size is not that baseline's."""
    spec = WorkloadSpec(num_requests=16, concurrency=16, replicate_s=20.0)
    record = {"stage": "calibration", "status": "ok", "wall_s": 4.0, "workload": asdict(spec),
              "flags": {"max_num_seqs": 1}, "backend": "fake"}
    assert calibration.found([record], spec, {"max_num_seqs": 1}) == record
    assert calibration.found([record], spec, {"max_num_seqs": 2}) is None
    assert calibration.found([record], replace(spec, replicate_s=30.0), {"max_num_seqs": 1}) is None


def test_a_study_refuses_a_size_that_differs_from_the_one_it_measured_with(tmp_path):
    """The records file lost (the study kept elsewhere, study.storage): a new calibration may size the work
    differently, and the study's ratios would then be of two works. Refused by name."""
    assert sweep_cmd.run(compose_cfg(*SWEEP, "study.name=kept", tmp_path=tmp_path), Console(quiet=True)) == 0
    path = tmp_path / "kept" / "replicates.jsonl"
    records = read_records(path)
    path.write_text("".join(json.dumps({**r, "wall_s": r["wall_s"] * 2}) + "\n" if r.get("stage") == "calibration"
                            else json.dumps(r) + "\n" for r in records))
    with pytest.raises(ConfigError, match="calibrated_num_requests"):
        sweep_cmd.run(compose_cfg(*SWEEP, "study.name=kept", tmp_path=tmp_path), Console(quiet=True))


def test_analyze_lists_the_calibration_run_and_analyses_only_the_comparison(tmp_path):
    from throttle_sweep.commands import analyze as analyze_cmd

    cfg = compose_cfg("backend=fake", "mode=compare", "compare.replicates=2", "plots=false", "run=timed",
                      "workload.replicate_s=20", tmp_path=tmp_path)
    assert compare_cmd.run(cfg, Console(quiet=True)) == 0
    console = Console(record=True, width=300)
    path = tmp_path / "timed" / "replicates.jsonl"
    assert analyze_cmd.run(compose_cfg("mode=analyze", f"input={path}", "plots=false", tmp_path=tmp_path),
                           console) == 0
    shown = console.export_text()
    assert shown.count("summary: ") == 1 and "calibration run" in shown and "comparison timed" not in shown


def test_a_baseline_that_fails_its_calibration_stops_before_anything_else_and_the_run_is_kept(tmp_path):
    console = Console(record=True, width=300)
    cfg = compose_cfg(*SWEEP, "study.name=broken", "+fake.fail_start_when.max_num_seqs=0", tmp_path=tmp_path)
    assert sweep_cmd.run(cfg, console) == 3
    [record] = read_records(tmp_path / "broken" / "replicates.jsonl")
    assert record["stage"] == "calibration" and record["status"] == "failed"
    shown = console.export_text()
    assert "calibration run failed" in shown and "workload.replicate_s" in shown
    console = Console(record=True, width=300)
    cfg = compose_cfg("backend=fake", "mode=compare", "compare.replicates=2", "plots=false", "run=broken",
                      "workload.replicate_s=20", "+fake.fail_start_when.max_num_seqs=0", tmp_path=tmp_path)
    assert compare_cmd.run(cfg, console) == 1 and "calibration run failed" in console.export_text()
