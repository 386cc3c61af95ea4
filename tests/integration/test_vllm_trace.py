"""The shipped Mooncake trace replayed on the real vLLM CPU engine (mode=measure): every request arrives at its
timestamp (scaled by the speed-up), keeps its lengths, and its shared hash-id blocks hit vLLM's prefix cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from tests.helpers import compose_cfg
from throttle_sweep.commands import measure as measure_cmd
from throttle_sweep.store.records import read_records

pytestmark = pytest.mark.integration

TRACE = Path(__file__).resolve().parents[2] / "examples" / "mooncake-synthetic.jsonl"


def test_the_shipped_trace_replays_at_its_timestamps_on_the_cpu_engine(tmp_path):
    cfg = compose_cfg("mode=measure", "run=tr", "workload=trace", f"workload.trace={TRACE}",
                      "workload.trace_block_size=128", "workload.trace_speed=2", "workload.warmup_requests=2",
                      tmp_path=tmp_path)
    assert measure_cmd.run(cfg, Console(quiet=True)) == 0
    (record,) = read_records(tmp_path / "tr" / "replicates.jsonl")
    lines = [json.loads(line) for line in TRACE.read_text().splitlines()]
    assert record["status"] == "ok" and record["requests_completed"] == len(lines) == 50
    assert record["input_tokens"] == sum(line["input_length"] for line in lines)
    assert record["output_tokens"] == sum(line["output_length"] for line in lines)
    # each request was due at its timestamp, twice as fast, and reached the engine within a step of it
    due = [arrival for arrival, _, _, _ in record["requests_s"]]
    assert due == pytest.approx([line["timestamp"] / 1000 / 2 for line in lines], abs=1e-6)
    late = [lateness for _, _, _, lateness in record["requests_s"]]
    assert min(late) >= 0 and max(late) < 0.25  # measured here: at most 4 ms (p50 0.8 ms); 25 ms at speed 1
    assert record["wall_s"] >= lines[-1]["timestamp"] / 1000 / 2
    # the trace's shared system prompts and sessions: most prompt tokens come from vLLM's prefix cache
    assert record["prefix_cache"]["hit_rate"] > 0.4
