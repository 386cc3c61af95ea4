"""The cost sweep's latency and Pareto pictures (plots=true), drawn from a real fake-engine sweep with a p95 TTFT
limit and read back from the drawn artists: every measured run's p95 TTFT and TPOT against its output tokens/s
per GPU (a closed loop has no arrival rate: the throughput it reached is the load it carried), the limits, the
winner's runs marked; tokens/s per GPU against per user with the front of the runs that kept every limit and
the winner starred. A run whose stream gave no gaps (no TPOT p95) is left out of the TPOT panel."""

from __future__ import annotations

import copy
import statistics
from dataclasses import replace

import pytest
from rich.console import Console

from tests.helpers import compose_cfg
from throttle_sweep.commands import sweep as sweep_cmd
from throttle_sweep.report import figures, pareto
from throttle_sweep.sweep import picture, tradeoff_picture

KV = 48 * 16 * 1024  # the fake: 48 blocks of 16 tokens; 32 requests of 16+48 tokens preempt above 12 at once
LIMIT = 1.0  # p95 TTFT (s): 12 sequences at once keep it, 8 and 9 do not, nor the baseline's 1
ARGS = ("backend=fake", "workload.num_requests=32", "workload.prompt_len=16", "workload.output_len=48",
        "workload.concurrency=32", "workload.warmup_requests=0", "engine.block_size=16",
        f"engine.kv_cache_memory_bytes={KV}", "fake.noise_sd=0.02", "+space=batching", "space.max_num_seqs.low=1",
        "space.max_num_seqs.high=32", "space.max_num_seqs.log=false", "~space.max_num_batched_tokens",
        "study.name=pic", "study.n_trials=4", "compare.replicates=2", "study.confirm_replicates=2", "plots=true",
        f"study.max_p95_ttft_s={LIMIT}")


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """One sweep; every figure it wrote (by file name) and the result they were drawn from."""
    folder, drawn, given = tmp_path_factory.mktemp("tradeoff"), {}, {}
    real_save, real_draw = figures.save, tradeoff_picture.draw

    def keep(fig, path):
        drawn[path.name] = fig
        real_save(fig, path)

    def remember(*args):
        given["args"] = args
        return real_draw(*args)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(figures, "save", keep)
        mp.setattr(tradeoff_picture, "draw", remember)
        assert sweep_cmd.run(compose_cfg(*ARGS, tmp_path=folder), Console(quiet=True)) == 0
    out, result, max_preemptions, limits = given["args"]
    assert result.winner is not None and limits["p95_ttft_s"] == LIMIT
    runs = [r for r in result.records if picture.measured(r, result.cost_basis)]
    winner_flags = result.winner.analysis.replicates("candidate")[0]["flags"]
    return folder / "pic", drawn, given["args"], runs, winner_flags


def kept(record, max_preemptions=0):
    return record["preemptions"] <= max_preemptions and record["latency_s"]["ttft"]["p95"] <= LIMIT


def rounded(point):
    return tuple(round(float(v), 6) for v in point)


def offsets(ax, skip=()):
    return sorted(rounded(xy) for c in ax.collections if c not in skip for xy in c.get_offsets())


def test_the_pictures_are_written_and_shown_in_the_report(swept):
    out, *_ = swept
    text = (out / "report.md").read_text()
    for name in ("latency_vs_throughput.png", "pareto.png"):
        assert (out / name).stat().st_size > 10_000 and f"]({name})" in text


def test_p95_latencies_against_tokens_per_gpu_with_the_limit_and_the_winners_runs(swept):
    _, drawn, _, runs, winner_flags = swept
    top, bottom = drawn["latency_vs_throughput.png"].axes
    for ax, metric in ((top, "ttft"), (bottom, "tpot")):
        expected = sorted(rounded((pareto.tokens_per_gpu(r), r["latency_s"][metric]["p95"])) for r in runs)
        assert offsets(ax) == expected  # every measured run, once
        winner = [c for c in ax.collections if c.get_gid() == "runs the winner max_num_seqs=12"]
        assert winner[0].get_label() == "the winner max_num_seqs=12"
        assert sorted(rounded(xy) for c in winner for xy in c.get_offsets()) == sorted(
            rounded((pareto.tokens_per_gpu(r), r["latency_s"][metric]["p95"])) for r in runs
            if r["flags"] == winner_flags)
    [limit] = [ln for ln in top.get_lines() if ln.get_label().startswith("p95 TTFT limit")]
    assert set(limit.get_ydata()) == {LIMIT} and "study.max_p95_ttft_s" in limit.get_label()
    assert not [ln for ln in bottom.get_lines() if "limit" in ln.get_label()]  # no TPOT limit was set
    assert bottom.get_xlabel() == pareto.PER_GPU


def test_the_pareto_front_of_the_runs_that_kept_the_limits_and_the_winner(swept):
    _, drawn, _, runs, winner_flags = swept
    [ax] = drawn["pareto.png"].axes
    [star] = [c for c in ax.collections if c.get_label().startswith("winner max_num_seqs=12")]
    xy = lambda r: (pareto.tokens_per_user(r), pareto.tokens_per_gpu(r))  # noqa: E731
    assert offsets(ax, skip=(star,)) == sorted(rounded(xy(r)) for r in runs)
    mine = [xy(r) for r in runs if r["flags"] == winner_flags]
    assert rounded(star.get_offsets()[0]) == rounded((statistics.median(x for x, _ in mine),
                                                       statistics.median(y for _, y in mine)))
    [front] = [ln for ln in ax.get_lines() if ln.get_label().startswith("Pareto front")]
    line = list(zip(front.get_xdata(), front.get_ydata(), strict=True))
    good = [xy(r) for r in runs if kept(r)]
    assert line and set(line) <= set(good)  # only runs that kept every limit; the baseline's broke TTFT
    assert not any(kx >= x and ky >= y and (kx, ky) != (x, y) for x, y in line for kx, ky in good)
    assert all(any(x >= kx and y >= ky for x, y in line) for kx, ky in good)


def test_a_run_without_a_tpot_p95_is_left_out_of_the_tpot_panel(swept, tmp_path):
    _, _, (_, result, max_preemptions, limits), runs, _ = swept
    records = copy.deepcopy(result.records)
    gapless = next(r for r in records if picture.measured(r, result.cost_basis))
    gapless["latency_s"]["tpot"]["p95"] = gapless["latency_s"]["itl"]["p95"] = None
    drawn = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(figures, "save", lambda fig, path: drawn.__setitem__(path.name, fig))
        md = tradeoff_picture.draw(tmp_path, replace(result, records=records), max_preemptions, limits)
    top, bottom = drawn["latency_vs_throughput.png"].axes
    assert len(offsets(bottom)) == len(offsets(top)) - 1 == len(runs) - 1
    assert "![p95 latencies against tokens/s per GPU](latency_vs_throughput.png)" in md

