"""A sweep killed with SIGKILL mid-way, then the same command again: a real process, its engine processes
ended with it, and a resume that loses nothing and measures nothing twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import optuna
import pytest

from tests.unit.test_sweep import ROOT, SPACE, WHOLE, WORK, truth
from throttle_sweep.store.records import read_records

# the fake's step times at a quarter of their defaults (the same surface, the same boundary): the killed process
# runs in real time, and at the defaults its trial case took 44 s
QUICK = ["fake.step_overhead_s=0.001", "fake.per_seq_s=0.0001", "fake.per_prefill_token_s=0.0000075"]


@pytest.mark.parametrize("when", ["probing", "trial"])
def test_sigkill_mid_trial_then_resume_loses_nothing_and_repeats_nothing(tmp_path, when):
    """A real process, killed with SIGKILL while probing the boundary or in the second trial; the same command
    again finishes the sweep."""
    args = [sys.executable, "-m", "throttle_sweep", "backend=fake", *WORK, *SPACE, "study.name=k",
            f"results_dir={tmp_path}", "study.n_trials=5", "compare.replicates=2", "study.confirm_replicates=2",
            "study.confirm_top=1", "plots=false", *QUICK]
    records = tmp_path / "k" / "replicates.jsonl"
    proc = subprocess.Popen([*args, "fake.realtime=true", "fake.start_s=0.2"], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)

    def reached() -> bool:  # probing: 4 probes done; trial: the second trial's first replicate done
        lines = records.read_text().splitlines() if records.exists() else []
        stages = [json.loads(line)["stage"] for line in lines if line.endswith("}")]
        return len(stages) >= 4 if when == "probing" else stages.count("search") >= WHOLE + 1

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not reached():
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = read_records(records)
    probes = sum(r["stage"] == "probe" for r in before)
    assert (probes >= 4 and probes == len(before)) if when == "probing" else WHOLE < len(before) - probes < 5 * WHOLE
    subprocess.run(args, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = read_records(records)
    assert after[: len(before)] == before  # nothing already measured was lost or rewritten
    slots = Counter((r["comparison"], r["position"]) for r in after)
    assert max(slots.values()) == 1, "a replicate was measured twice"
    study = optuna.load_study(study_name="k", storage=f"sqlite:///{tmp_path / 'k' / 'study.db'}")
    done = [t for t in study.trials if t.state.is_finished() and "duplicate_of" not in t.user_attrs
            and t.user_attrs.get("source") in (None, "reference")]  # (the reference: answered by its probes)
    assert len(done) == 5 and all(t.state == optuna.trial.TrialState.COMPLETE for t in done)
    # the boundary the resumed run found is the one the probes find in one go
    (found,) = study.user_attrs["boundaries"]
    edge = max(n for n, (c, p) in truth().items() if p == 0)
    assert (found["last_clean"], found["first_preempting"]) == (edge, edge + 1)
    assert len([t for t in study.trials if t.user_attrs.get("source") == "probe"]) == len(
        {r["comparison"] for r in after if r["stage"] == "probe" and r["arm"] == "candidate"
         and (r["preemptions"] or 0) > 0 and r["key"].endswith("#1")})  # each preempting probe told once
    assert not [t for t in study.trials if t.state in (optuna.trial.TrialState.WAITING, optuna.trial.TrialState.RUNNING)]
    # every comparison started before the kill belongs to a COMPLETE trial: as its comparison, whole, or, if the
    # kill left it partial, as one it discarded and measured again from scratch (never continued in a new process)
    counts = Counter(r["comparison"] for r in after)
    used = {t.user_attrs["comparison"] for t in done if t.user_attrs.get("source") != "reference"}
    discarded = {c for t in done for c in t.user_attrs.get("discarded_comparisons", [])}
    for comparison in {r["comparison"] for r in before if r["stage"] == "search"}:
        assert (comparison in used and counts[comparison] == WHOLE) or (comparison in discarded and counts[comparison] < WHOLE)
    assert all(counts[c] == WHOLE for c in used)
    assert study.user_attrs["winner"] is not None
