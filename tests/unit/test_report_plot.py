"""The sweep's picture says the answer at a glance: every measured run's cost per million tokens across the
whole range, the runs that preempted marked, the boundary as a line between the last clean and the first
preempting value, the baseline's cost, and the winner with its confirmed interval. Rendered from a real
(fake-engine) sweep and read back from the drawn axes."""

from __future__ import annotations

import statistics

import optuna
from rich.console import Console

from tests.helpers import compose_cfg
from throttle_sweep.commands import sweep as sweep_cmd
from throttle_sweep.store.records import read_records
from throttle_sweep.sweep import picture

KV = 48 * 16 * 1024  # the fake: 48 blocks of 16 tokens; 32 requests of 16+48 tokens preempt above 12 at once
WORK = ["workload.num_requests=32", "workload.prompt_len=16", "workload.output_len=48", "workload.concurrency=32",
        "workload.warmup_requests=0", "engine.block_size=16", f"engine.kv_cache_memory_bytes={KV}", "fake.noise_sd=0.02"]


def test_the_cost_picture_shows_every_run_the_boundary_line_the_baseline_and_the_winners_interval(
        tmp_path, monkeypatch):
    drawn = {}

    def keep(ax, result, flag, max_preemptions):
        real(ax, result, flag, max_preemptions)
        drawn[flag] = (ax, result)

    real = picture.draw_cost
    monkeypatch.setattr(picture, "draw_cost", keep)
    cfg = compose_cfg("backend=fake", *WORK, "+space=batching", "space.max_num_seqs.low=1",
                      "space.max_num_seqs.high=32", "space.max_num_seqs.log=false", "~space.max_num_batched_tokens",
                      "study.name=pic", "study.n_trials=4", "compare.replicates=2", "study.confirm_replicates=2",
                      "plots=true", tmp_path=tmp_path)
    assert sweep_cmd.run(cfg, Console(quiet=True)) == 0
    out = tmp_path / "pic"
    assert (out / "cost_vs_max_num_seqs.png").stat().st_size > 10_000 and (out / "history.png").exists()
    assert "![cost vs max_num_seqs](cost_vs_max_num_seqs.png)" in (out / "report.md").read_text()
    study = optuna.load_study(study_name="pic", storage=f"sqlite:///{out / 'study.db'}")
    [b] = study.user_attrs["boundaries"]
    records = [r for r in read_records(out / "replicates.jsonl") if r["status"] == "ok" and not r.get("warmup")]

    ax, result = drawn["max_num_seqs"]
    legend = {t.get_text() for t in ax.get_legend().get_texts()}
    clean = next(c for c in ax.collections if c.get_label() == "a run, no preemption")
    dirty = next(c for c in ax.collections if c.get_label() == "a run with > 0 preemptions")
    # every measured run is a point: the probes beyond the boundary too, marked as preempting
    assert len(clean.get_offsets()) + len(dirty.get_offsets()) == len(records)
    assert {x for x, _ in dirty.get_offsets()} == {r["flags"]["max_num_seqs"] for r in records if r["preemptions"]}
    assert max(x for x, _ in clean.get_offsets()) == b["last_clean"]
    # the boundary is one line between the last clean and the first preempting value
    line = next(ln for ln in ax.get_lines() if ln.get_label().startswith("preemption starts"))
    assert line.get_xdata()[0] == (b["last_clean"] + b["first_preempting"]) / 2
    assert line.get_label() == f"preemption starts between {b['last_clean']} and {b['first_preempting']}"
    # the winner, at its value, with its confirmed ratio interval drawn at the level of the baseline runs it was
    # confirmed against, which is drawn too: the star sits below that line by exactly the confirmed ratio
    winner = result.winner
    assert winner is not None
    y, lo, hi = picture.winner_interval(winner)
    est = winner.adjusted.estimate
    level = next(ln for ln in ax.get_lines() if ln.get_label() == "the baseline in the winner's confirmation")
    assert lo < y < hi and abs(y / level.get_ydata()[0] - est.ratio) < 1e-9
    assert abs(lo / y - est.ci_low / est.ratio) < 1e-9 and abs(hi / y - est.ci_high / est.ratio) < 1e-9
    [star] = [c for c in ax.containers if c.get_label().startswith("winner max_num_seqs=")]
    assert star[0].get_xdata()[0] == winner.params["max_num_seqs"]
    assert ax.get_ylabel() == "$ / M output tokens (steady state)" and "the baseline in the winner's confirmation" in legend
    low, high = ax.get_xlim()
    shown = [t for t in ax.get_xticks() if low <= t <= high]
    assert shown and all(float(t).is_integer() for t in shown)  # no half-integer ticks on an integer flag
    ones = [r["steady"]["usd_per_mtok"] for r in records if r["flags"] == study.user_attrs["baseline"]
            and r["stage"] == "confirm"]
    assert abs(level.get_ydata()[0] / statistics.geometric_mean(ones) - 1) < 1e-9  # the baseline's own runs


def test_a_categorical_flag_is_placed_by_name_and_a_run_without_a_steady_window_is_left_out():
    from throttle_sweep.sweep.picture import runs_along

    records = [{"status": "ok", "usd_per_mtok": 1.0, "steady": {"usd_per_mtok": 0.9}, "preemptions": 0,
                "flags": {"enable_prefix_caching": True}},
               {"status": "ok", "usd_per_mtok": 1.1, "steady": None, "preemptions": 0,
                "flags": {"enable_prefix_caching": False}},
               {"status": "ok", "usd_per_mtok": 1.2, "steady": {"usd_per_mtok": 1.1}, "preemptions": 2,
                "flags": {"enable_prefix_caching": False}},
               {"status": "failed", "usd_per_mtok": None, "flags": {"enable_prefix_caching": True}}]
    runs = runs_along(records, "enable_prefix_caching", "steady", 0)
    assert [(r.x, r.usd_per_mtok, r.preempting) for r in runs] == [("True", 0.9, False), ("False", 1.1, True)]
