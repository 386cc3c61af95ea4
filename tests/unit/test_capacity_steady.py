"""The steady state of an open-loop run, from its own requests (#46 item 1): MSER-5 drops a warm-up only
where the run started better than it went on (an empty queue filling), and the trend test fires only on a
queue that grows through the run."""

from __future__ import annotations

import numpy as np

from throttle_sweep.capacity.slo import Slo
from throttle_sweep.capacity.steady import counted, mser, steady_state, trend, undecided

RNG = np.random.default_rng(3)


def stationary(n: int, rng: np.random.Generator = RNG) -> np.ndarray:
    """An AR(1) latency (neighbours share the queue) around 0.5 of its limit."""
    x, out = 0.0, []
    for e in rng.normal(0, 0.1, n):
        x = 0.6 * x + e
        out.append(0.5 + x)
    return np.array(out)


def test_mser_drops_the_transient_of_a_queue_filling_from_empty():
    series = stationary(400)
    series[:60] = np.linspace(0.0, 0.5, 60) + RNG.normal(0, 0.02, 60)  # the first 60 requests wait less
    cut = mser(series)
    assert cut % 5 == 0 and 40 <= cut <= 80


def test_mser_keeps_nearly_all_of_a_stationary_series():
    cuts = [mser(stationary(400, np.random.default_rng(seed))) for seed in range(20)]
    assert np.median(cuts) <= 5 and max(cuts) <= 40  # at most a tenth, where chance made the start look low


def test_mser_keeps_a_burst_at_the_start_a_queue_from_empty_cannot_start_worse_than_it_goes_on():
    series = stationary(400)
    series[10:50] += 1.5  # a burst of arrivals early in the run: part of the steady state, not a warm-up
    assert mser(series) == 0


def test_the_trend_test_fires_on_a_growing_queue_and_not_on_a_stationary_one():
    fired = [trend(stationary(400, np.random.default_rng(seed))).fires for seed in range(200)]
    assert sum(fired) <= 6  # one-sided at 0.01: about 2 in 200
    growing = stationary(400) + np.linspace(0, 1.0, 400)  # every request waits longer than the last
    found = trend(growing)
    assert found.fires and found.second > found.first


def test_steady_state_counts_after_the_warm_up_and_reads_each_half():
    slo = Slo(p95_ttft_s=1.0, attainment=0.9)
    rows = [[i * 0.1, 0.01, None] for i in range(50)]  # the empty queue: instant first tokens
    rows += [[5 + i * 0.1, float(0.5 + 0.6 * (i % 10 == 0)), None] for i in range(400)]  # 1 in 10 misses
    s = steady_state({"requests_s": rows}, slo)
    assert 45 <= s.warmup <= 55 and s.warmup_s == rows[s.warmup][0]
    assert s.counted == len(rows) - s.warmup and s.met == s.counted - sum(r[1] > 1 for r in rows[s.warmup:])
    assert not s.trend.fires and s.second_counted == s.counted // 2
    assert steady_state({"status": "failed"}, slo) is None


def test_a_run_whose_queue_grew_yet_kept_the_slo_is_run_again_twice_as_long_and_read_by_its_second_half(tmp_path):
    """On the fake engine above what max_num_seqs=8 sustains (9.5 req/s), with a loose TTFT limit (3 s): the
    first 20 s run keeps the SLO as a whole while its queue grows, so it cannot decide; the run twice as long
    shows the queue cannot hold the rate."""
    from tests.helpers import compose_cfg
    from throttle_sweep.capacity.runs import measure_rate, met_of
    from throttle_sweep.cluster.slot import WarmSlot
    from throttle_sweep.settings.capacity import load_capacity
    from throttle_sweep.store.records import RecordLog

    r = load_capacity(compose_cfg("mode=capacity", "backend=fake", "workload=open_loop", "workload.num_requests=50",
                                  "engine.max_num_seqs=8", "slo.p95_ttft_s=3", "capacity.run_s=20", "run=g",
                                  tmp_path=tmp_path))
    r.out.mkdir(parents=True)
    log, said = RecordLog(r.out / "replicates.jsonl", say=print), []
    slot = WarmSlot(r.engine, r.settings.spec, r.price, run_id="g", **r.warm)
    try:
        record = measure_rate(slot, r.flags, 9.5, {"stage": "capacity", "search_stage": "knee"}, log, r.settings,
                              "capacity", said.append)
    finally:
        slot.close()
    first, second = log.records
    assert "kept the SLO as a whole" in first["void"] and "runs again twice as long" in said[0]
    met, n = met_of(first, r.settings)
    assert met >= 0.9 * n  # read whole, it held: the void run was not a failure
    assert record is second and second["lengthened"] == first["void"] and not second.get("void")
    assert len(second["requests_s"]) == 2 * len(first["requests_s"])
    met, n = met_of(second, r.settings)
    assert met < 0.9 * n and n == len(second["requests_s"]) // 4  # its second half (after a warm-up of half)


def test_latency_that_grew_far_within_its_limit_is_no_trend_of_the_slo():
    """Seen on the real engine: TTFT rose from 1.9% to 2.2% of its limit through a run, beyond doubt; every
    request met the SLO in both halves, so the rate's attainment has no trend and the run stands."""
    slo = Slo(p95_ttft_s=0.5, attainment=0.9)
    rows = [[i * 0.05, 0.0095 + 0.0015 * i / 400 + 0.0002 * (i % 3), None] for i in range(400)]
    s = steady_state({"requests_s": rows}, slo)
    assert s.trend.fires and not s.trending  # the latency test fires; attainment did not fall
    met, n, _ = counted({"requests_s": rows}, slo)
    assert undecided({"requests_s": rows}, slo) is None and met == n == s.counted  # all after the warm-up


def test_a_capacity_says_its_runs_length_warm_ups_and_trends():
    from throttle_sweep.capacity.report import runs_words

    said = runs_words({"run_s": 30, "warmup_s": [2.1, 4.8], "trend_runs": 2, "lengthened_runs": 1})
    assert said == ("; runs of at least 30 s, warm-up 2.1-4.8 s chosen per run (MSER-5); 2 with latency growing "
                    "through the run, each counted by its second half; 1 run again twice as long, the first too "
                    "short to tell")
    assert runs_words({"run_s": 30, "warmup_s": [0.0, 0.0], "trend_runs": 0, "lengthened_runs": 0}) == \
        "; runs of at least 30 s, warm-up 0.0-0.0 s chosen per run (MSER-5)"
