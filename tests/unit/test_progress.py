"""What a sweep shows while it runs: a live display on a terminal (an overall bar and ETA, a line per slot,
the best feasible point so far), plain lines anywhere else."""

from __future__ import annotations

from rich.console import Console

from tests.helpers import compose_cfg
from throttle_sweep.commands import sweep as sweep_cmd
from throttle_sweep.progress import LiveProgress, Progress, progress_for

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
        live.step("search trial-1: candidate replicate at position 1/4 on slot 1")
        live.note("trial 1 {'max_num_seqs': 4}: ratio 0.5 [0.4, 0.6] CHEAPER, feasible; best so far: {'max_num_seqs': 4}")
        assert live.slots == {"1": "search trial-1: candidate replicate at position 1/4"}
        assert live.best == "{'max_num_seqs': 4}"
    finally:
        live.stop()
