"""mode=plan as a user runs it (#48 item 2): a real capacity study on the fake engine, then the day's plan
from the shipped demand curve, each command in its own process; and a bad demand file refused (exit 2)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from tests.process.test_user_paths import cli, ok, refused

ROOT = Path(__file__).resolve().parents[2]
DAY = ROOT / "examples" / "demand-day.csv"
CAPACITY = ["mode=capacity", "backend=fake", "run=cap", "workload.num_requests=100", "capacity.run_s=20",
            "capacity.knee_rates=4", "slo.p95_ttft_s=0.2", "slo.p95_tpot_s=0.05", "plots=false",
            "cost.usd_per_gpu_hour=2.5"]


def test_a_days_plan_from_a_capacity_study_prints_its_replicas_and_dollars_and_draws_them(tmp_path):
    ok(cli(tmp_path, *CAPACITY))
    said = ok(cli(tmp_path, "mode=plan", "study.name=cap", f"plan.demand={DAY}"))
    study = json.loads((tmp_path / "results" / "cap" / "summary.json").read_text())
    capacity, low = study["capacity_rps"], study["capacity_ci"][0]
    rates = [float(line.split(",")[1]) for line in DAY.read_text().splitlines()[3:]]
    replicas = [math.ceil(r / capacity - 1e-9) for r in rates]
    plan = json.loads((tmp_path / "results" / "cap" / "plan.json").read_text())
    assert [b["replicas"] for b in plan["buckets"]] == replicas
    assert [b["replicas_sure"] for b in plan["buckets"]] == [math.ceil(r / low - 1e-9) for r in rates]
    usd = sum(replicas) * 2.5  # hourly buckets, 1 GPU a replica at the study's $2.5
    assert plan["totals"]["estimate"]["usd"] == usd and f"{sum(replicas):g} GPU-hours, ${usd:,.2f}" in said
    held = max(replicas) * 24 * 2.5
    assert f"the peak's {max(replicas)} replicas all day = {max(replicas) * 24:g} GPU-hours, ${held:,.2f}" in said
    png = tmp_path / "results" / "cap" / "plan.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    (tmp_path / "bad.csv").write_text("start_s,requests_per_s\n0,4\n3600,-1\n")
    words = refused(cli(tmp_path, "mode=plan", "study.name=cap", "plan.demand=bad.csv"))
    assert "bad.csv:3: requests_per_s must be a rate >= 0 (requests/s), but got -1" in words
