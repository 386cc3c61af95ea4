"""What a sweep shows while it runs: a live display on a terminal (an overall bar and ETA, a line per slot,
the best feasible point so far), plain lines anywhere else."""

from __future__ import annotations

import pytest
from rich.console import Console

from tests.helpers import compose_cfg
from throttle_sweep.commands import sweep as sweep_cmd
from throttle_sweep.report.progress import LiveProgress, Progress, progress_for

SWEEP = ["backend=fake", "+space=batching", "~space.max_num_batched_tokens", "space.max_num_seqs.high=8",
         "study.n_trials=3", "study.sampler=grid", "compare.replicates=2", "study.confirm_top=1",
         "study.confirm_replicates=2", "workload.num_requests=8", "workload.output_len=16", "plots=false"]


def test_a_terminal_gets_the_live_display(tmp_path):
    console = Console(force_terminal=True, record=True, width=300)
    assert sweep_cmd.run(compose_cfg(*SWEEP, "study.name=live", tmp_path=tmp_path), console) == 0
    shown = console.export_text()
    assert "best feasible so far: {'max_num_seqs': " in shown  # the display's last frame
    assert "slot 0: confirm" in shown and "━" in shown and "ETA" in shown
    assert "trial 0 {'max_num_seqs'" in shown  # messages still scroll above it


def test_anything_else_gets_plain_lines(tmp_path):
    console = Console(force_terminal=False, record=True, width=300)
    assert sweep_cmd.run(compose_cfg(*SWEEP, "study.name=plain", tmp_path=tmp_path), console) == 0
    shown = console.export_text()
    assert "replicate 1/" in shown and "elapsed" in shown and "best feasible so far" not in shown
    assert "━" not in shown


def test_the_display_follows_the_console():
    assert type(progress_for(Console(force_terminal=False), 4)) is Progress
    live = progress_for(Console(force_terminal=True, record=True), 4)
    try:
        assert isinstance(live, LiveProgress)
        live.step("search trial-1: candidate replicate at position 1/4 on slot 1", slot="1")
        live.best("{'max_num_seqs': 4}")
        assert live.slots == {"1": "search trial-1: candidate replicate at position 1/4"}
        assert live.shown_best == "{'max_num_seqs': 4}"
    finally:
        live.stop()


class Watched:
    """A SweepProgress that keeps what it is told."""

    def __init__(self):
        self.notes, self.planned, self.expected, self.started, self.finished_runs = [], 0, 0, 0, 0
        self.totals = []

    def note(self, message):
        self.notes.append(message)

    def best(self, point):
        pass

    def step(self, description, slot=None):
        self.started += 1
        self.totals.append(self.planned + self.expected)

    def finished(self):
        self.finished_runs += 1

    def plan(self, runs):
        self.planned += runs

    def expect(self, runs):
        self.expected = runs


def test_the_total_follows_what_runs_and_ends_at_the_count(tmp_path, monkeypatch):
    """Probes count (they are runs), comparisons stopped early give their unused runs back, and what was
    estimated but never started (a later confirmation round, trials answered by the probes) is dropped."""
    seen, step = [], Progress.step

    def watched(self, description, slot=None):
        seen.append((self.count + 1, self.planned + self.expected))  # the total before the display's clamp
        step(self, description, slot)

    monkeypatch.setattr(Progress, "step", watched)
    console = Console(force_terminal=False, record=True, width=300)
    assert sweep_cmd.run(compose_cfg(*SWEEP, "study.name=count", tmp_path=tmp_path), console) == 0
    counted = [line for line in console.export_text().splitlines() if line.startswith("replicate ")]
    runs = sum(1 for _ in (tmp_path / "count" / "replicates.jsonl").open())
    assert len(counted) == runs and counted[-1].startswith(f"replicate {runs}/{runs} ")
    for i, line in enumerate(counted, 1):
        count, total = line.split()[1].split("/")
        assert int(count) == i and int(total.lstrip("~")) >= i
    assert len(seen) == runs and all(total >= count for count, total in seen), seen


def test_a_confirmation_started_again_from_scratch_says_so():
    from tests.unit.test_joint_confirmation import OneSlot, confirming, new_study
    from throttle_sweep.sweep import driver

    study, records = new_study(), []
    with pytest.raises(KeyboardInterrupt):
        confirming(OneSlot(stop_after=4 + 4 + 7), records=records, study=study)
    watched = Watched()
    real = driver.Sweep.__init__

    def watching(self, *args, **kwargs):
        real(self, *args, **{**kwargs, "progress": watched})

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(driver.Sweep, "__init__", watching)
        confirming(OneSlot(), records=records, study=study)
    said = [n for n in watched.notes if "an earlier run left it partial" in n]
    assert len(said) == 1 and "(7 of 12 runs, kept in the records); it starts again from scratch as " in said[0]
    assert watched.started == watched.finished_runs == 12 == watched.planned  # the joint schedule, whole, once


def test_a_comparison_has_no_best_point_in_its_display(tmp_path):
    from throttle_sweep.commands import compare as compare_cmd

    console = Console(force_terminal=True, record=True, width=300)
    cfg = compose_cfg("backend=fake", "workload.num_requests=8", "workload.output_len=16", "plots=false", "run=c",
                      tmp_path=tmp_path)
    assert compare_cmd.run(cfg, console) == 0
    shown = console.export_text()
    assert "replicate 8/8" in shown and "best feasible" not in shown
