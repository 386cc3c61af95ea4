"""mode=compare and mode=analyze on the fake engine: verdicts, reproducibility, resume, bad input."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from tests.helpers import compose_cfg
from throttle_sweep.cluster.slot import WarmSlot
from throttle_sweep.commands import analyze as analyze_cmd
from throttle_sweep.commands import compare as compare_cmd
from throttle_sweep.errors import ConfigError, RecordError
from throttle_sweep.stats.analysis import analyse
from throttle_sweep.stats.verdict import CHEAPER, PRICIER, WITHHELD, Thresholds
from throttle_sweep.store.records import read_records

NOISY = ["backend=fake", "fake.noise_sd=0.02", "fake.drift_per_start=0.05", "workload.num_requests=24",
         "workload.output_len=32"]


def run_compare(tmp_path, *overrides, name="c"):
    cfg = compose_cfg(*NOISY, f"run={name}", *overrides, tmp_path=tmp_path)
    assert compare_cmd.run(cfg, Console(quiet=True)) == 0
    return json.loads((tmp_path / name / "summary.json").read_text())


def test_eight_in_flight_is_cheaper_than_one_despite_drift(tmp_path):
    summary = run_compare(tmp_path)
    assert summary["verdict"] == CHEAPER and summary["ci"][1] < 1
    assert summary["labels"] == {"baseline": "max_num_seqs=1", "candidate": "max_num_seqs=8"}
    assert [r["arm"][0] for r in summary["replicates"]] == list("bccbcbbc")  # abba; the engines warm themselves
    assert (tmp_path / "c" / "replicates.png").stat().st_size > 1000


@pytest.mark.calibration
def test_aa_compares_through_the_whole_command_claim_a_difference_at_about_alpha(tmp_path):
    """40 A/A compares end to end (records, analysis) on a fake with 2% noise and 5% drift per engine start:
    a false verdict either way is expected in 5% of them (2 of 40); more than 5 would be a 1-in-100 event."""
    false = 0
    for seed in range(40):
        summary = run_compare(tmp_path, "baseline.max_num_seqs=4", "candidate.max_num_seqs=4", f"fake.seed={seed}",
                              "compare.replicates=2", "plots=false", name=f"aa{seed}")
        assert summary["labels"]["baseline"] == "baseline (A/A)"
        false += summary["verdict"] in (CHEAPER, PRICIER)
    assert false <= 5, false


def test_analyze_reproduces_compare_exactly(tmp_path):
    compared = run_compare(tmp_path)
    cfg = compose_cfg(f"input={tmp_path / 'c' / 'replicates.jsonl'}", "mode=analyze", "run=again", tmp_path=tmp_path)
    assert analyze_cmd.run(cfg, Console(quiet=True)) == 0
    (folder,) = (tmp_path / "again" / "analysis").iterdir()
    assert json.loads((folder / "summary.json").read_text()) == compared


def test_interrupted_compare_starts_afresh_and_keeps_what_was_measured(tmp_path, monkeypatch):
    real_measure, calls = WarmSlot.measure, []

    def measure(self, *args):
        calls.append(args)
        if len(calls) == 4:
            raise KeyboardInterrupt  # the user stops the run during the 4th replicate
        return real_measure(self, *args)

    monkeypatch.setattr(WarmSlot, "measure", measure)
    cfg = compose_cfg(*NOISY, "run=c", tmp_path=tmp_path)
    assert compare_cmd.run(cfg, Console(quiet=True)) == 130  # a clean stop, said in one line (tests/process)
    before = read_records(tmp_path / "c" / "replicates.jsonl")
    assert len(before) == 3
    monkeypatch.setattr(WarmSlot, "measure", real_measure)
    summary = run_compare(tmp_path)
    records = read_records(tmp_path / "c" / "replicates.jsonl")
    assert records[:3] == before  # nothing lost
    fresh = [r for r in records[3:]]
    assert {r["comparison"] for r in fresh} != {before[0]["comparison"]}  # not continued in another process
    assert sorted(r["position"] for r in fresh) == list(range(len(fresh)))  # a whole comparison, once
    assert summary["verdict"] == CHEAPER and len(summary["replicates"]) == len(fresh)
    summary_again = run_compare(tmp_path)  # complete: reused as it is, nothing measured
    assert len(read_records(tmp_path / "c" / "replicates.jsonl")) == len(records) and summary_again == summary


def test_denominator_moving_withholds_the_verdict():
    recs = [{"arm": a, "position": i, "usd_per_mtok": 1.0 + 0.01 * i, "output_tokens": 1000 + (i == 3) * 50,
             "requests_completed": 8, "status": "ok"} for i, a in enumerate(["baseline", "candidate"] * 3)]
    result = analyse(recs, Thresholds())
    assert result.verdict == WITHHELD and "output_tokens differ" in result.notes[0]
    assert analyse(recs, Thresholds(), token_tolerance=0.1).verdict != WITHHELD


def test_preemption_in_one_arm_only_is_reported():
    recs = [{"arm": a, "position": i, "usd_per_mtok": 1.0 - 0.3 * (a == "candidate") + 0.001 * i,
             "preemptions": 7 * (a == "candidate"), "status": "ok"}
            for i, a in enumerate(["baseline", "candidate"] * 3)]
    result = analyse(recs, Thresholds())
    assert any("only the candidate arm" in n and "21 preemptions" in n for n in result.notes)


def test_failed_replicates_are_excluded_and_named():
    recs = [{"arm": a, "position": i, "usd_per_mtok": 1.0, "status": "ok"}
            for i, a in enumerate(["baseline", "candidate"] * 3)]
    recs[5] = {**recs[5], "status": "failed", "reason": "engine died", "usd_per_mtok": None}
    result = analyse(recs, Thresholds())
    assert result.estimate.n_candidate == 2 and any("position 5" in n and "engine died" in n for n in result.notes)


def write_csv(tmp_path, rows):
    path = tmp_path / "in.csv"
    path.write_text("arm,order,usd_per_mtok\n" + "\n".join(",".join(map(str, r)) for r in rows) + "\n")
    return path


@pytest.mark.parametrize("rows, error, message", [
    ([("baseline", 1, 1.0), ("baseline", 2, 1.1), ("baseline", 3, 1.0)], ConfigError, "at least 2 replicates of the candidate"),
    ([("baseline", 1, 1.0), ("candidate", 2, 1.1), ("baseline", 3, 1.0)], ConfigError, "at least 2 replicates of the candidate"),
    ([("baseline", 1, 1.0), ("candidate", 2, 0), ("baseline", 3, 1.0)], RecordError, "in.csv:3: usd_per_mtok must be > 0"),
    ([("baseline", 1, 1.0), ("control", 2, 1.0)], RecordError, "in.csv:3: arm must be 'baseline' or 'candidate'"),
    ([("baseline", 1, 1.0), ("candidate", 1, 1.0)], RecordError, "row 2 repeats order 1"),
    ([("baseline", "", 1.0)], RecordError, "in.csv:2: missing 'order'"),
    ([("baseline", 1, "")], RecordError, "in.csv:2: missing 'usd_per_mtok'"),
])
def test_analyze_bad_input_names_the_row_and_rule(tmp_path, rows, error, message):
    cfg = compose_cfg("mode=analyze", f"input={write_csv(tmp_path, rows)}", tmp_path=tmp_path)
    with pytest.raises(error, match=message):
        analyze_cmd.run(cfg, Console(quiet=True))


def test_compare_refuses_bad_input_before_measuring(tmp_path, monkeypatch):
    monkeypatch.setattr(WarmSlot, "make_host", staticmethod(lambda *a, **k: pytest.fail("an engine started")))
    for override, message in [("compare.replicates=1", "at least 2 per arm"),
                              ("compare.schedule=zigzag", "compare.schedule must be one of"),
                              ("+candidate.max_num_seq=3", "candidate: unknown engine flag 'max_num_seq'"),
                              ("compare.alpha=0", "compare.alpha must be in")]:
        with pytest.raises(ConfigError, match=message):
            compare_cmd.run(compose_cfg("backend=fake", override, tmp_path=tmp_path), Console(quiet=True))


@pytest.mark.parametrize("replicates", [2, 4])
def test_two_runs_per_arm_are_flagged_before_anything_is_measured(tmp_path, replicates):
    console = Console(record=True, width=400)
    cfg = compose_cfg(*NOISY, "run=two", f"compare.replicates={replicates}", tmp_path=tmp_path)
    assert compare_cmd.run(cfg, console) == 0
    text = console.export_text()
    note = "compare.replicates=2: with 2 runs per arm the drift-aware interval has 1 degree of freedom"
    assert (note in text) == (replicates == 2)
    if replicates == 2:
        assert text.index(note) < text.index("compare ")  # said before the first run


@pytest.mark.parametrize(("policy", "said"), [(["compare.restart=never"], "compare.restart=never: each arm's"),
                                              (["compare.restart=every_k", "compare.restart_every=2"],
                                               "compare.restart_every=2: replicates on one engine"),
                                              (["compare.restart=every_k", "compare.restart_every=1"], None),
                                              ([], None)])
def test_a_restart_policy_that_shares_engines_is_flagged_before_anything_is_measured(tmp_path, policy, said):
    """Engines differ in speed; replicates that share one hide it from the interval: the user is told."""
    console = Console(record=True, width=400)
    cfg = compose_cfg(*NOISY, "run=shared", *policy, tmp_path=tmp_path)
    assert compare_cmd.run(cfg, console) == 0
    text = console.export_text()
    assert ("the interval" in text and "differ in speed" in text) == (said is not None)
    if said is not None:
        assert said in text and text.index(said) < text.index("compare ")  # said before the first run


def test_analyze_refuses_a_run_name_that_is_not_a_folder_before_reading_its_input(tmp_path):
    """run= names a folder under results_dir, as in every other mode: a path that climbs out is refused."""
    cfg = compose_cfg("mode=analyze", f"input={tmp_path / 'missing.csv'}", "run=../elsewhere", tmp_path=tmp_path)
    with pytest.raises(ConfigError, match="run must be a plain folder name"):
        analyze_cmd.run(cfg, Console(quiet=True))
