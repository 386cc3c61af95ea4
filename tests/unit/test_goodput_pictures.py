"""The goodput sweep's pictures (plots=true), drawn from a real fake-engine sweep and read back from the drawn
artists: where each configuration's attainment breaks (its capacity starred at the SLO's share), p95 TTFT
and TPOT against the rate, one line per configuration with the SLO's limits and each capacity marked, and
tokens/s per GPU against tokens/s per user with the front and the winner. A run whose stream gave no gaps (no
TPOT p95) is left out of the TPOT panel, not a crash."""

from __future__ import annotations

import copy
import json
import statistics
from dataclasses import replace

import pytest
from rich.console import Console

from tests.helpers import compose_cfg
from throttle_sweep.capacity.runs import met_of
from throttle_sweep.commands import sweep as sweep_cmd
from throttle_sweep.report import figures, pareto
from throttle_sweep.store.records import read_records
from throttle_sweep.sweep.goodput import plot as sweep_plot

SMALL = ("backend=fake", "+space=batching", "study.objective=goodput", "workload=open_loop",
         "workload.num_requests=200", "workload.output_len=32", "capacity.run_s=20", "capacity.knee_rates=4",
         "slo.p95_ttft_s=0.2", "slo.p95_tpot_s=0.05", "space.max_num_seqs.high=16",
         "space.max_num_batched_tokens.choices=[2048]", "study.n_trials=3", "fake.noise_sd=0.02", "plots=true",
         "study.name=g", "workload.target_rps=40")


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """One sweep; every figure it wrote (by file name) and what the pictures were drawn from."""
    folder, drawn, given = tmp_path_factory.mktemp("pictures"), {}, {}
    real_save, real_draw = figures.save, sweep_plot.draw

    def keep(fig, path):
        drawn[path.name] = fig
        real_save(fig, path)

    def remember(*args):
        given["args"] = args
        return real_draw(*args)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(figures, "save", keep)
        mp.setattr(sweep_plot, "draw", remember)
        console = Console(record=True, width=250)
        code = sweep_cmd.run(compose_cfg(*SMALL, tmp_path=folder), console)
    said = console.export_text()
    assert code == 0, said
    out = folder / "g"
    records = [r for r in read_records(out / "replicates.jsonl") if r["status"] == "ok" and not r.get("void")]
    return out, said, drawn, given["args"], records, json.loads((out / "summary.json").read_text())


def capacities(summary):
    """{configuration: (its capacity, confirmed)}: the confirmation's where it ran, else the screen's."""
    screen = {s["config"]: (s["capacity_rps"], False) for s in summary["screen"] if s["capacity_rps"]}
    return screen | {c["config"]: (c["capacity_rps"], True) for c in summary["confirmed"] if c["capacity_rps"]}


def by_config(records):
    out = {}
    for r in records:
        out.setdefault(r["config"], []).append(r)
    return out


def xy(record):
    return pareto.tokens_per_user(record), pareto.tokens_per_gpu(record)


def rounded(point):
    return tuple(round(float(v), 6) for v in point)


def test_the_pictures_are_written_and_the_falling_cost_line_is_gone(swept):
    out, said, drawn, *_ = swept
    for name in ("attainment_vs_rate.png", "latency_vs_rate.png", "pareto.png"):
        assert (out / name).stat().st_size > 10_000 and f"picture: {out / name}" in said
    assert not (out / "cost_vs_rate.png").exists()


def test_attainment_shows_where_each_configuration_breaks(swept):
    _, _, drawn, _, records, summary = swept
    [ax] = drawn["attainment_vs_rate.png"].axes
    runs = by_config(records)
    for config, mine in runs.items():
        [line] = [ln for ln in ax.get_lines() if ln.get_label().split(":")[0] == config]
        assert list(line.get_xdata()) == sorted({r["workload"]["rate"] for r in mine})
        assert all(0 <= y <= 1 for y in line.get_ydata())
    target = next(ln for ln in ax.get_lines() if ln.get_label().startswith("the SLO's share"))
    assert set(target.get_ydata()) == {summary["slo"]["attainment"]}
    # each capacity is a point on the target line, at its own rate: the configurations are told apart
    for config, (rate, _) in capacities(summary).items():
        [mark] = [c for c in ax.collections if c.get_gid() == f"capacity {config}"]
        assert tuple(mark.get_offsets()[0]) == pytest.approx((rate, summary["slo"]["attainment"]))
    winner = summary["winner"]["config"]
    [star] = [c for c in ax.collections if c.get_gid() == f"capacity {winner}"]
    assert star.get_label().startswith(f"winner {winner}")


def test_p95_latencies_against_the_rate_one_line_per_configuration_limits_and_capacities(swept):
    _, _, drawn, _, records, summary = swept
    top, bottom = drawn["latency_vs_rate.png"].axes
    for ax, metric, limit in ((top, "ttft", 0.2), (bottom, "tpot", 0.05)):
        for config, mine in by_config(records).items():
            [line] = [ln for ln in ax.get_lines() if ln.get_label().split(":")[0] == config]
            rates = sorted({r["workload"]["rate"] for r in mine})
            assert list(line.get_xdata()) == rates
            assert list(line.get_ydata()) == pytest.approx(
                [statistics.median(r["latency_s"][metric]["p95"] for r in mine if r["workload"]["rate"] == x)
                 for x in rates])
        [drawn_limit] = [ln for ln in ax.get_lines() if ln.get_label().startswith(f"{metric.upper()} limit")]
        assert set(drawn_limit.get_ydata()) == {limit} and "90% of requests" in drawn_limit.get_label()
        for config, (rate, _) in capacities(summary).items():
            [mark] = [ln for ln in ax.get_lines() if ln.get_gid() == f"capacity {config}"]
            assert list(mark.get_xdata()) == pytest.approx([rate, rate])


def test_the_pareto_front_of_tokens_per_gpu_against_tokens_per_user_with_the_winner(swept):
    _, _, drawn, (_, _, _, _, settings), records, summary = swept
    [ax] = drawn["pareto.png"].axes
    winner = summary["winner"]["config"]
    [star] = [c for c in ax.collections if c.get_label().startswith(f"winner {winner}")]
    points = sorted(rounded(xy) for c in ax.collections if c is not star for xy in c.get_offsets())
    assert points == sorted(rounded(xy(r)) for r in records)  # every usable run is a point
    # the front runs through the runs that kept the SLO: none of them beats a point of it on both axes, and
    # each of them is matched or beaten by one
    kept = [xy(r) for r in records
            if (met := met_of(r, settings))[0] >= settings.slo.attainment * met[1]]
    [front] = [ln for ln in ax.get_lines() if ln.get_label().startswith("Pareto front")]
    line = list(zip(front.get_xdata(), front.get_ydata(), strict=True))
    assert len(line) >= 2 and set(line) <= set(kept) and list(front.get_xdata()) == sorted(front.get_xdata())
    assert not any(kx >= x and ky >= y and (kx, ky) != (x, y) for x, y in line for kx, ky in kept)
    assert all(any(x >= kx and y >= ky for x, y in line) for kx, ky in kept)
    assert rounded(star.get_offsets()[0]) in {rounded(xy(r)) for r in records if r["config"] == winner}
    assert ax.get_xlabel() == pareto.PER_USER and ax.get_ylabel() == pareto.PER_GPU


def test_a_run_without_a_tpot_p95_is_left_out_of_the_tpot_panel(swept, tmp_path):
    _, _, _, (out, contenders, costed, winner, settings), _, _ = swept
    contenders = copy.deepcopy(contenders)
    gapless = next(c for c in contenders if c.label == winner)
    gapless.records[0]["latency_s"]["tpot"]["p95"] = None
    gapless.records[0]["latency_s"]["itl"]["p95"] = None
    drawn = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(figures, "save", lambda fig, path: drawn.__setitem__(path.name, fig))
        sweep_plot.draw(tmp_path, contenders, costed, winner, settings)
    top, bottom = drawn["latency_vs_rate.png"].axes
    ttft, tpot = ([c for c in ax.collections if c.get_gid() == f"runs {winner}"][0] for ax in (top, bottom))
    assert len(tpot.get_offsets()) == len(ttft.get_offsets()) - 1


def test_an_slo_on_ttft_alone_draws_no_tpot_limit(swept, tmp_path):
    _, _, _, (out, contenders, costed, winner, settings), _, _ = swept
    ttft_only = replace(settings, slo=replace(settings.slo, p95_tpot_s=None))
    drawn = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(figures, "save", lambda fig, path: drawn.__setitem__(path.name, fig))
        sweep_plot.draw(tmp_path, contenders, costed, winner, ttft_only)
    top, bottom = drawn["latency_vs_rate.png"].axes
    assert [ln.get_label() for ln in top.get_lines() if "limit" in ln.get_label()]
    assert not [ln for ln in bottom.get_lines() if "limit" in ln.get_label()] and bottom.get_legend() is None
