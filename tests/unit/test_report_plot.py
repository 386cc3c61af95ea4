"""The cost plot marks where preemption starts and which point won."""

from __future__ import annotations

import optuna

from throttle_sweep.search.report import mark_boundary_and_winner


class Axes:
    """Records what is drawn."""

    def __init__(self):
        self.spans, self.lines = [], []

    def axvspan(self, lo, hi, **kw):
        self.spans.append((lo, hi, kw.get("label")))

    def axvline(self, x, **kw):
        self.lines.append((x, kw.get("label")))


def test_the_boundary_band_and_the_winner_line_are_drawn_on_their_flag():
    study = optuna.create_study()
    study.set_user_attr("boundaries", [
        {"knob": "max_num_seqs", "last_clean": 7, "first_preempting": 8},
        {"knob": "max_num_seqs", "last_clean": 11, "first_preempting": 12},
        {"knob": "max_num_seqs", "last_clean": 16, "first_preempting": None},  # no preemption in range: no band
    ])
    study.set_user_attr("winner", {"params": {"max_num_seqs": 7, "max_num_batched_tokens": 2048}})
    ax = Axes()
    mark_boundary_and_winner(ax, study, "max_num_seqs")
    assert ax.spans == [(7, 8, "preemption starts (probes)"), (11, 12, None)]
    assert ax.lines == [(7, "winner (max_num_seqs=7)")]
    other = Axes()
    mark_boundary_and_winner(other, study, "max_num_batched_tokens")
    assert other.spans == [] and other.lines == [(2048, "winner (max_num_batched_tokens=2048)")]
