"""What a replicate's numbers mean, on the fake engine's virtual clock where every step time is known:
cost free of the wave artefact, latency from the scheduled arrival, ITL as vLLM defines it, fixed work checked
against the spec."""

from __future__ import annotations

import dataclasses
import statistics

import pytest
from rich.console import Console

from tests.helpers import compose_cfg
from throttle_sweep.commands import compare as compare_cmd
from throttle_sweep.commands import measure as measure_cmd
from throttle_sweep.commands import sweep as sweep_cmd
from throttle_sweep.engines import FakeEngine, FakeKnobs
from throttle_sweep.errors import ConfigError
from throttle_sweep.measurement.cost import Price
from throttle_sweep.measurement.replicate import behind_schedule, measure_replicate
from throttle_sweep.measurement.workload import WorkloadSpec, drive, make_requests

WAVES = WorkloadSpec(num_requests=64, prompt_len=64, output_len=128, concurrency=64, warmup_requests=0)


def measure(flags, spec=WAVES, knobs=None, engine=None):
    return measure_replicate(engine or FakeEngine(knobs), {"max_model_len": 1024, **flags}, spec, Price(),
                             run_id="t", arm="x", position=0, environment={})


def test_the_fixed_work_cost_follows_waves_but_the_steady_cost_follows_the_engine():
    """64 requests of 128 tokens: N=32 and N=48 both take two waves, so the whole replicate costs the same,
    though every step at 48 serves 50% more sequences. The steady cost (while all 64 are in flight) does not
    see the waves: it covers the steps that began with the engine full (N in flight) and falls with N, as
    the fake's step time per sequence does."""
    runs = {n: measure({"max_num_seqs": n}) for n in (16, 21, 32, 48, 63, 64)}
    fixed = {n: r["usd_per_mtok"] for n, r in runs.items()}
    steady = {n: r["steady"]["usd_per_mtok"] for n, r in runs.items()}
    assert fixed[48] == pytest.approx(fixed[32], rel=0.02) and fixed[21] == pytest.approx(fixed[16], rel=0.02)
    assert steady[16] > steady[21] > steady[32] > steady[48] > steady[63] > steady[64]
    knobs = FakeKnobs()
    for n, cost in steady.items():  # exactly the per-token cost of one full step of n sequences, plus prefill
        per_token = (knobs.step_overhead_s + knobs.per_seq_s * n) / n
        assert cost == pytest.approx(1.39 / 3600 * per_token * 1e6, rel=0.05), n
    assert runs[64]["steady"]["drain_share"] == runs[32]["steady"]["drain_share"] == pytest.approx(0.0, abs=1e-9)
    assert runs[48]["steady"]["drain_share"] > 0.3  # the second wave holds 16: the engine is not full
    assert runs[48]["steady"]["output_tokens"] == 48 * 128 and runs[21]["steady"]["output_tokens"] == 63 * 128


ROOMY = ["engine.kv_cache_memory_bytes=67108864", "workload.prompt_len=64", "workload.output_len=128"]  # no preemption


def test_a_compare_judges_the_steady_cost_and_says_so(tmp_path):
    cfg = compose_cfg("backend=fake", "mode=compare", "run=c", "baseline.max_num_seqs=32", "candidate.max_num_seqs=48",
                      "workload.num_requests=64", "workload.concurrency=64", "workload.warmup_requests=0", *ROOMY,
                      "compare.replicates=2", "plots=false", tmp_path=tmp_path)
    console = Console(record=True, width=200)
    assert compare_cmd.run(cfg, console) == 0
    text = console.export_text()
    assert "steady state" in text and "verdict: CHEAPER" in text  # the fixed-work cost would call it a tie
    cfg = compose_cfg("backend=fake", "mode=compare", "run=f", "baseline.max_num_seqs=32", "candidate.max_num_seqs=48",
                      "workload.num_requests=64", "workload.concurrency=64", "workload.warmup_requests=0", *ROOMY,
                      "compare.replicates=2", "compare.cost=fixed_work", "plots=false", tmp_path=tmp_path)
    console = Console(record=True, width=200)
    assert compare_cmd.run(cfg, console) == 0
    text = console.export_text()
    assert "whole fixed work" in text and "verdict: NO DIFFERENCE" in text


OPEN = WorkloadSpec(num_requests=40, prompt_len=256, output_len=16, loop="open", rate=100.0, concurrency=8,
                    warmup_requests=0)
SLOW_PREFILL = FakeKnobs(step_overhead_s=0.004, per_prefill_token_s=0.0002)  # a 256-token prefill: 51 ms


def test_open_loop_latency_counts_from_the_scheduled_arrival_not_from_when_the_driver_added_it():
    session = FakeEngine(SLOW_PREFILL).start({"max_model_len": 1024})
    result = drive(session, make_requests(OPEN), loop="open", concurrency=8)
    from_arrival = [t.first_token_s - t.scheduled_s for t in result.timings]
    from_add = [t.first_token_s - t.submitted_s for t in result.timings]
    late = [t.submitted_s - t.scheduled_s for t in result.timings]
    assert max(late) > 0.02 and min(late) >= 0  # added only between steps: up to a long step late
    record = measure({}, spec=OPEN, knobs=SLOW_PREFILL)
    assert record["latency_s"]["ttft"]["p50"] == pytest.approx(statistics.median(from_arrival), rel=1e-6)
    assert record["latency_s"]["ttft"]["p50"] > statistics.median(from_add) + 0.005
    assert record["lateness_s"]["p99"] == pytest.approx(sorted(late)[-1], rel=0.2)
    assert any("reached the engine late" in note for note in record["notes"])
    assert record["cost_basis"] == "offered_load" and "steady" not in record


def test_itl_pools_every_gap_so_prefill_stalls_show_and_tpot_is_reported_beside_it():
    record = measure({}, spec=dataclasses.replace(OPEN, rate=10.0), knobs=SLOW_PREFILL)
    lat = record["latency_s"]
    assert lat["itl"]["n"] == 40 * 15 and lat["tpot"]["n"] == 40 and lat["e2e"]["n"] == 40
    # a decode step is 4 ms plus 0.4 ms per sequence; a step that also prefills a newcomer takes 51 ms more:
    # a stall inside a request's stream, which its mean time per token (TPOT) averages away
    assert lat["itl"]["p95"] > 0.05 > 0.04 > lat["tpot"]["p95"]


class CutShort(FakeEngine):
    """A fake whose request req-3 stops 5 tokens early, as vLLM does at max_model_len."""

    def start(self, flags):
        session = super().start(flags)
        add = session.add

        def cut(request):
            add(request)
            if request.id == "req-3":
                session.waiting[-1]["out"] -= 5

        session.add = cut
        return session


def test_a_request_that_did_not_produce_exactly_its_output_length_fails_the_replicate():
    record = measure({"max_num_seqs": 8}, spec=WorkloadSpec(num_requests=8, output_len=32, warmup_requests=0),
                     engine=CutShort())
    assert record["status"] == "failed" and record["requests_wrong_length"] == 1
    assert "req-3: 27 of 32 tokens" in record["reason"]


def test_warm_up_is_one_full_batch_of_short_requests():
    spec = WorkloadSpec(num_requests=64, output_len=128, concurrency=24)
    warmup = make_requests(spec, warmup=True)
    assert len(warmup) == 24 and {r.output_len for r in warmup} == {16}


@pytest.mark.parametrize("command", ["compare", "sweep"])
def test_open_loop_cost_is_not_judged_unless_asked_for_by_name(tmp_path, monkeypatch, command):
    monkeypatch.setattr(FakeEngine, "start", lambda *a: pytest.fail("engine started"))
    extra = ["+space=batching"] if command == "sweep" else ["mode=compare"]
    cfg = compose_cfg("backend=fake", "workload=open_loop", *extra, tmp_path=tmp_path)
    run = sweep_cmd.run if command == "sweep" else compare_cmd.run
    with pytest.raises(ConfigError, match="workload.loop=open with compare.cost=steady: an open loop's cost"):
        run(cfg, Console(quiet=True))


def test_measure_and_compare_say_when_max_num_seqs_is_above_the_concurrency(tmp_path):
    console = Console(record=True, width=300)
    cfg = compose_cfg("backend=fake", "engine.max_num_seqs=32", "workload.concurrency=8", "workload.num_requests=8",
                      "workload.output_len=8", tmp_path=tmp_path)
    assert measure_cmd.run(cfg, console) == 0
    assert "engine.max_num_seqs=32 is above the 8 requests" in console.export_text()
    cfg = compose_cfg("backend=fake", "mode=compare", "candidate.max_num_seqs=32", "workload.concurrency=8",
                      "workload.num_requests=8", "workload.output_len=8", "compare.replicates=2", "plots=false",
                      tmp_path=tmp_path)
    assert compare_cmd.run(cfg, console) == 0
    assert "candidate.max_num_seqs=32 is above the 8 requests" in console.export_text()


def test_open_loop_records_keep_every_requests_latencies_and_how_far_the_driver_fell_behind():
    record = measure({}, spec=OPEN, knobs=SLOW_PREFILL)
    rows = record["requests_s"]
    assert len(rows) == 40 and rows == sorted(rows, key=lambda r: r[0])
    assert statistics.median(r[1] for r in rows) == pytest.approx(record["latency_s"]["ttft"]["p50"], rel=1e-4)
    # and each one's lateness: its TTFT from when it was sent is the difference (as other clients count it)
    assert statistics.median(r[3] for r in rows) == pytest.approx(record["lateness_s"]["p50"], rel=1e-4, abs=1e-6)
    assert all(0 <= r[3] <= r[1] for r in rows)
    # late only by waiting for the step under way: the engine's doing, not the driver's
    assert record["lateness_s"]["p99"] > 0.02 and record["lateness_s"]["beyond_steps_p99"] < 0.001


def test_a_driver_stalled_between_steps_is_behind_its_schedule():
    class Stalling(FakeEngine):
        def start(self, flags):
            session = super().start(flags)
            add = session.add

            def slow_add(request):  # the client spends 30 ms handing every request over
                add(request)
                session.clock += 0.03
            session.add = slow_add
            return session

    session = Stalling(SLOW_PREFILL).start({"max_model_len": 1024})
    result = drive(session, make_requests(OPEN), loop="open", concurrency=8)
    assert behind_schedule(result) > 0.02


@pytest.mark.timeout(20)
def test_an_open_loop_on_a_clock_that_does_not_start_at_zero_submits_every_request():
    """Waiting until a request is due sets the virtual clock to start + arrival; (start + arrival) - start
    can round below arrival, which left the driver waiting for that same instant for ever."""
    session = FakeEngine(SLOW_PREFILL).start({"max_model_len": 1024})
    session.clock = 1.7  # as after a warm-up run
    result = drive(session, make_requests(dataclasses.replace(OPEN, rate=5.0, num_requests=20)), loop="open",
                   concurrency=8)
    assert all(t.finished_s is not None for t in result.timings)
