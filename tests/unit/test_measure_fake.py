"""measure_replicate and the measure command's preflight, on the fake engine."""

from __future__ import annotations

import pytest

from tests.helpers import compose_cfg
from throttle_sweep.commands import measure as measure_cmd
from throttle_sweep.engines import FakeEngine, FakeKnobs
from throttle_sweep.engines.fake import FAKE_FLAG_SCHEMA
from throttle_sweep.engines.flags import check_flags
from throttle_sweep.errors import ConfigError
from throttle_sweep.measurement.cost import Price
from throttle_sweep.measurement.replicate import measure_replicate, one_line
from throttle_sweep.measurement.workload import WorkloadSpec
from throttle_sweep.store.records import read_records

SPEC = WorkloadSpec(num_requests=32, prompt_len=32, output_len=64, concurrency=8)


def measure(flags, knobs=None, spec=SPEC):
    return measure_replicate(FakeEngine(knobs), flags, spec, Price(), run_id="t", arm="baseline", position=0)


def test_fixed_work_and_cost_from_wall_time():
    record = measure({"max_num_seqs": 8})
    assert record["status"] == "ok"
    assert record["output_tokens"] == 32 * 64 and record["requests_completed"] == 32
    assert record["usd_per_mtok"] == pytest.approx(1.39 * record["wall_s"] / 3600 / (32 * 64 / 1e6))
    assert 0 < record["peak_kv_cache_usage"] <= 1
    assert record["latency_s"]["ttft"]["p50"] <= record["latency_s"]["e2e"]["p50"]


def test_more_sequences_in_flight_is_cheaper_until_the_cache_runs_out():
    one, eight = measure({"max_num_seqs": 1}), measure({"max_num_seqs": 8})
    assert eight["usd_per_mtok"] < 0.5 * one["usd_per_mtok"]
    assert one["preemptions"] == eight["preemptions"] == 0
    tiny_cache = measure({"max_num_seqs": 8, "kv_cache_memory_bytes": 24 * 16 * 1024, "block_size": 16})
    assert tiny_cache["preemptions"] > 0 and tiny_cache["output_tokens"] == eight["output_tokens"]


def test_engine_that_fails_to_start_gives_a_failed_record():
    record = measure({"max_num_seqs": 64}, FakeKnobs(fail_start_when={"max_num_seqs": 32}))
    assert record["status"] == "failed" and record["failed_at"] == "start"
    assert "max_num_seqs=64" in record["reason"]
    assert one_line(record, Price()).startswith("FAILED (start): ")


def test_a_run_whose_streams_gave_no_gaps_between_tokens_prints_its_line_without_them():
    """A server that sends each request's tokens in one or two chunks (vLLM coalesces them under load; seen in
    CI on the API server) leaves no inter-token gaps: no ITL and no TPOT, said as such, not a crash."""
    from throttle_sweep.measurement.replicate import p95_text, percentiles

    record = measure({"max_num_seqs": 8})
    record["latency_s"] = {**record["latency_s"], "itl": percentiles([]), "tpot": percentiles([])}
    line = one_line(record, Price())
    assert "p95 TPOT=- ms" in line and "p95 ITL=- ms" in line and "p95 TTFT=" in line
    # the capacity's run lines keep their columns (capacity/runs.py)
    assert p95_text(record["latency_s"], "tpot", "7.2f") == "      -"
    assert p95_text(record["latency_s"], "ttft", "8.1f") == f"{record['latency_s']['ttft']['p95'] * 1e3:8.1f}"


def test_engine_that_dies_mid_run_gives_a_failed_record():
    record = measure({"max_num_seqs": 8}, FakeKnobs(crash_after_steps=5))
    assert record["status"] == "failed" and record["failed_at"] == "run"
    assert "crashed after 5 steps" in record["reason"]


def test_unknown_flag_names_the_nearest_valid_ones():
    with pytest.raises(ConfigError, match=r"engine: unknown engine flag 'max_num_seq'; nearest valid names: "
                                          r"max_num_seqs"):
        check_flags({"max_num_seq": 8}, FAKE_FLAG_SCHEMA, source="engine")


@pytest.mark.parametrize("flag, value, expected", [
    ("max_num_seqs", "8", "must be int or null"),
    ("max_num_seqs", 8.5, "must be int or null"),
    ("enforce_eager", 1, "must be bool"),
    ("kv_cache_dtype", "fp4", "must be one of 'auto'"),
])
def test_wrong_type_is_named(flag, value, expected):
    with pytest.raises(ConfigError, match=rf"engine flag '{flag}' {expected}"):
        check_flags({flag: value}, FAKE_FLAG_SCHEMA, source="engine")


@pytest.mark.parametrize("override, message", [
    ("+engine.max_num_seq=4", "unknown engine flag 'max_num_seq'"),
    ("engine.max_num_seqs=0", "engine.max_num_seqs must be a positive integer"),
    ("workload.num_requests=-1", "workload.num_requests must be a positive integer"),
    ("workload.output_len=2000", "beyond max_model_len=1024"),
    ("cost.usd_per_gpu_hour=0", "cost.usd_per_gpu_hour must be > 0"),
    ("engine.model=/no/such/model", "engine.model: no such model folder"),
])
def test_measure_command_refuses_bad_input_before_any_engine_starts(tmp_path, override, message, monkeypatch):
    started = []
    monkeypatch.setattr(FakeEngine, "start", lambda self, flags: started.append(flags))
    cfg = compose_cfg("backend=fake", override, tmp_path=tmp_path)
    with pytest.raises(ConfigError, match=message):
        measure_cmd.run(cfg, console=None)
    assert started == []


def test_measure_command_writes_a_record(tmp_path, capsys):
    from rich.console import Console

    cfg = compose_cfg("backend=fake", "run=one", "engine.max_num_seqs=8", tmp_path=tmp_path)
    assert measure_cmd.run(cfg, Console()) == 0
    (record,) = read_records(tmp_path / "one" / "replicates.jsonl")
    assert record["flags"]["max_num_seqs"] == 8 and record["status"] == "ok"
    assert "$" in capsys.readouterr().out


def test_the_fake_splits_a_long_prompt_across_steps_with_chunked_prefill_and_refuses_it_without():
    spec = WorkloadSpec(num_requests=4, prompt_len=64, output_len=8, concurrency=4, warmup_requests=0)
    chunked = measure({"max_num_seqs": 4, "max_num_batched_tokens": 32}, spec=spec)
    assert chunked["status"] == "ok" and chunked["output_tokens"] == 32
    whole = measure({"max_num_seqs": 4, "max_num_batched_tokens": 32, "enable_chunked_prefill": False}, spec=spec)
    assert whole["status"] == "failed" and "max_num_batched_tokens with chunked prefill off" in whole["reason"]


def test_the_fake_uses_vllm_cpus_block_size_unless_told():
    assert FakeEngine().start({}).block_size == 128 and FakeEngine().start({"block_size": 16}).block_size == 16


def test_work_shorter_than_an_engine_start_says_nothing_since_the_judged_cost_leaves_the_start_out(tmp_path):
    """The judged cost is the measured work's (the start is machine time, counted in the budget, not in the
    cost per token), so a start longer than the work does not change how to read the answer: no note, as on
    the defaults. Work too short for the timer to resolve does change it, and is named with what to raise."""
    from rich.console import Console

    from throttle_sweep.measurement.replicate import short_work_note

    console = Console(record=True, width=400)
    cfg = compose_cfg("backend=fake", "run=short", "fake.start_s=5", "workload.num_requests=8", tmp_path=tmp_path)
    measure_cmd.run(cfg, console)
    assert "note:" not in console.export_text()
    ok = {"status": "ok", "wall_s": 6.0, "engine_start_s": 5.0}
    assert short_work_note([ok]) is None and short_work_note([{**ok, "wall_s": 1.0}]) is None
    assert short_work_note([{**ok, "status": "failed", "wall_s": 1e-7}]) is None
    note = short_work_note([ok, {**ok, "wall_s": 1e-7, "engine_start_s": 0.0}])
    assert note is not None and "ticks of the timer" in note and "raise workload.num_requests" in note


@pytest.mark.parametrize(("max_num_seqs", "warmup_requests", "expected"), [(2, None, 2), (16, None, 8), (None, None, 8),
                                                                           (2, 5, 5)])
def test_the_default_warm_up_is_one_full_batch_of_the_engine_not_of_the_workload(max_num_seqs, warmup_requests,
                                                                                  expected):
    """An engine never runs more than max_num_seqs at once, so that many short requests warm every batch size
    it will see; at max_num_seqs=1 the workload's 8 in flight would be 8 warm-up requests run one by one."""
    spec = WorkloadSpec(num_requests=16, prompt_len=16, output_len=16, concurrency=8, warmup_requests=warmup_requests)
    flags = {"max_num_seqs": max_num_seqs} if max_num_seqs else {}
    assert measure(flags, spec=spec)["warmup_requests"] == expected
