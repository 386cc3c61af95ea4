"""capacity.png from a real fake-engine capacity run, read from the Figure's artists: a title that says what
was measured, the knee runs (the only ones in the answer) told apart from the bracket's and bisection's, the
pooled share per knee rate, and the capacity with both ends of its interval."""

from __future__ import annotations

import pytest
from rich.console import Console

from tests.helpers import compose_cfg
from throttle_sweep.commands import capacity as capacity_cmd
from throttle_sweep.report import figures

SLO = ("slo.p95_ttft_s=0.2", "slo.p95_tpot_s=0.05")
SMALL = ("backend=fake", "workload.num_requests=100", "capacity.run_s=20", "capacity.knee_rates=4",
         "capacity.knee_replicates=4")


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("cap")
    figs = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(figures, "save", lambda fig, path: (figs.append(fig), fig.savefig(path, dpi=60)))
        console = Console(record=True, width=200)
        code = capacity_cmd.run(compose_cfg("mode=capacity", "run=cap", *SMALL, *SLO, "fake.noise_sd=0.02",
                                            tmp_path=tmp_path), console)
    assert code == 0 and len(figs) == 1
    import json

    return figs[0], json.loads((tmp_path / "cap" / "summary.json").read_text())


def labels(ax):
    return [h.get_label() for h in ax.get_legend_handles_labels()[0]] + \
        [t for t in ax.get_legend_handles_labels()[1]]


def test_the_picture_has_a_title_naming_the_slo(drawn):
    fig, _ = drawn
    title = fig.axes[0].get_title() or fig.get_suptitle()
    assert "capacity" in title and "TTFT" in title and "90%" in title


def test_knee_runs_are_drawn_apart_from_the_bracket_and_bisection_runs(drawn):
    fig, summary = drawn
    top = fig.axes[0]
    legend = labels(top)
    assert any("knee run" in x for x in legend) and any("bracket" in x for x in legend), legend
    knee_runs = sum(lv["runs"] for lv in summary["rates"])
    knee = next(c for c in top.collections if "knee run" in c.get_label())
    assert len(knee.get_offsets()) == knee_runs
    pooled = next(ln for ln in top.get_lines() if "pooled" in ln.get_label())
    assert list(pooled.get_xdata()) == [lv["rate"] for lv in summary["rates"]]
    assert list(pooled.get_ydata()) == pytest.approx([lv["attainment"] for lv in summary["rates"]])


def test_the_capacity_and_both_ends_of_its_interval_are_marked(drawn):
    fig, summary = drawn
    low, high = summary["capacity_ci"]
    assert low is not None and high is not None, summary["capacity_ci"]
    xs = {round(ln.get_xdata()[0], 9) for ax in fig.axes for ln in ax.get_lines()
          if len(set(ln.get_xdata())) == 1}
    assert {round(summary["capacity_rps"], 9), round(low, 9), round(high, 9)} <= xs, xs
