"""Timed trace replay (workload.trace): Mooncake's JSONL and a plain CSV/JSONL become requests that keep their
lengths, their shared prefix blocks and their arrival times; bad input is refused with the line it is on."""

from __future__ import annotations

import json

import pytest

from tests.helpers import compose_cfg
from throttle_sweep.engines import FakeEngine
from throttle_sweep.errors import ConfigError
from throttle_sweep.measurement.workload import WorkloadSpec, drive, make_requests


def mooncake(tmp_path, rows, name="t.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def row(ms, n_in, n_out, ids):
    return {"timestamp": ms, "input_length": n_in, "output_length": n_out, "hash_ids": ids}


def spec_for(path, **kw):
    return WorkloadSpec(**{"loop": "open", "trace": path, "trace_block_size": 4, **kw})


def test_mooncake_requests_keep_their_lengths_arrivals_and_shared_blocks(tmp_path):
    path = mooncake(tmp_path, [row(0, 10, 3, [0, 1, 2]), row(250, 7, 5, [0, 1]), row(1000, 6, 2, [0, 3])])
    reqs = make_requests(spec_for(path))
    assert [(r.prompt_len, r.output_len, r.arrival_s) for r in reqs] == [(10, 3, 0.0), (7, 5, 0.25), (6, 2, 1.0)]
    a, b, c = (r.prompt_token_ids for r in reqs)
    assert a[:4] == b[:4] == c[:4]  # hash id 0: one block of 4 tokens, the same for every request listing it
    assert a[4:7] == b[4:7]  # hash id 1 in full in a, and its first 3 tokens as b's partial last block
    assert c[4:6] != a[4:6]  # hash id 3 is not hash id 1
    assert reqs == make_requests(spec_for(path))  # the same every replicate


def test_lines_as_mooncakes_published_trace_writes_them_replay_with_its_512_token_blocks(tmp_path):
    # the first lines of Mooncake's mooncake_trace.jsonl, as the projects that replay it quote them
    path = mooncake(tmp_path, [row(0, 6755, 500, list(range(14))), row(0, 7319, 490, [0, *range(14, 28)]),
                               row(3052, 7234, 794, [0, *range(28, 42)]), row(3052, 2287, 316, [0, 42, 43, 44, 45])])
    spec = WorkloadSpec(loop="open", trace=path)  # trace_block_size: 512, Mooncake's
    spec.check(max_model_len=None)
    reqs = make_requests(spec)
    assert [(r.prompt_len, r.output_len, r.arrival_s) for r in reqs] == [
        (6755, 500, 0.0), (7319, 490, 0.0), (7234, 794, 3.052), (2287, 316, 3.052)]
    first = reqs[0].prompt_token_ids[:512]
    assert all(r.prompt_token_ids[:512] == first for r in reqs)  # hash id 0: one shared 512-token block
    assert reqs[1].prompt_token_ids[512:1024] != reqs[2].prompt_token_ids[512:1024]


def test_hash_ids_that_cover_less_than_the_prompt_are_followed_by_tokens_of_its_own(tmp_path):
    path = mooncake(tmp_path, [row(0, 9, 1, [5]), row(0, 9, 1, [5]), row(0, 3, 1, [])])
    a, b, c = (r.prompt_token_ids for r in make_requests(spec_for(path)))
    assert len(a) == len(b) == 9 and len(c) == 3
    assert a[:4] == b[:4] and a[4:] != b[4:]


def test_speed_window_and_cap_select_and_scale_the_arrivals(tmp_path):
    path = mooncake(tmp_path, [row(ms, 4, 2, [i]) for i, ms in enumerate([0, 1000, 2000, 2500, 3000, 4000])])
    reqs = make_requests(spec_for(path, trace_start_s=1.0, trace_span_s=2.0, trace_speed=2.0))
    # the window [1 s, 3 s) of the trace: its first request arrives at once, the rest twice as fast
    assert [r.arrival_s for r in reqs] == [0.0, 0.5, 0.75]
    capped = make_requests(spec_for(path, trace_start_s=1.0, trace_max_requests=2))
    assert [r.arrival_s for r in capped] == [0.0, 1.0]


@pytest.mark.parametrize("name, text", [
    ("t.csv", "arrival_s,prompt_tokens,output_tokens\n0,5,2\n0.5,7,3\n"),
    ("t.jsonl", '{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 2}\n'
                '{"arrival_s": 0.5, "prompt_tokens": 7, "output_tokens": 3}\n'),
])
def test_a_plain_trace_gives_arrival_seconds_and_lengths(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    reqs = make_requests(spec_for(str(path)))
    assert [(r.prompt_len, r.output_len, r.arrival_s) for r in reqs] == [(5, 2, 0.0), (7, 3, 0.5)]
    assert reqs[0].prompt_token_ids[:5] != reqs[1].prompt_token_ids[:5]  # nothing shared


def test_the_open_loop_submits_each_request_at_its_trace_arrival(tmp_path):
    path = mooncake(tmp_path, [row(ms, 8, 4, [0, 1]) for ms in (0, 0, 0, 300, 310, 900)])
    reqs = make_requests(spec_for(path))
    result = drive(FakeEngine().start({}), reqs, loop="open", concurrency=1)
    assert [t.scheduled_s - result.started_s for t in result.timings] == pytest.approx([0, 0, 0, 0.3, 0.31, 0.9])
    assert all(t.submitted_s >= t.scheduled_s - 1e-9 for t in result.timings)


@pytest.mark.parametrize("line, message", [
    ("{not json", r"t.jsonl:2: not valid JSON"),
    ('{"timestamp": 5, "input_length": 4}', r"t.jsonl:2: .*'output_length'"),
    ('{"timestamp": 5, "input_length": 0, "output_length": 2, "hash_ids": []}', r"t.jsonl:2: .*input_length.*0"),
    ('{"timestamp": -1, "input_length": 4, "output_length": 2, "hash_ids": [0]}', r"t.jsonl:2: .*timestamp.*-1"),
    ('{"timestamp": 5, "input_length": 4, "output_length": 2, "hash_ids": ["a"]}', r"t.jsonl:2: .*hash_ids"),
    ('{"timestamp": 5, "input_length": 4, "output_length": 2, "hash_ids": [0, 1]}',
     r"t.jsonl:2: 2 hash_ids .* 4 prompt tokens hold 1 block.*trace_block_size=4"),
    ('{"arrival_s": 5, "prompt_tokens": 4, "output_tokens": 2}', r"t.jsonl:2: .*Mooncake.*line 1"),
])
def test_a_malformed_line_is_named_with_its_number_and_what_is_wrong(tmp_path, line, message):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(row(0, 4, 2, [0])) + "\n" + line + "\n")
    with pytest.raises(ConfigError, match=message):
        spec_for(str(path)).check(max_model_len=1024)


def test_a_malformed_csv_row_is_named_with_its_line(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,5,2\n0.5,seven,3\n")
    with pytest.raises(ConfigError, match=r"t.csv:3: .*prompt_tokens.*'seven'"):
        spec_for(str(path)).check(max_model_len=1024)


def test_timestamps_out_of_order_are_refused_with_both_lines(tmp_path):
    path = mooncake(tmp_path, [row(0, 4, 2, [0]), row(3052, 4, 2, [1]), row(3000, 4, 2, [2])])
    with pytest.raises(ConfigError, match=r"t.jsonl:3: timestamp 3000 ms .* before line 2's 3052 ms"):
        spec_for(path).check(max_model_len=1024)


def test_an_empty_window_is_refused_with_the_traces_span(tmp_path):
    path = mooncake(tmp_path, [row(0, 4, 2, [0]), row(2000, 4, 2, [1])])
    with pytest.raises(ConfigError, match=r"workload.trace_start_s=5.*no request.*0 s to 2 s"):
        spec_for(path, trace_start_s=5.0).check(max_model_len=1024)


def test_lengths_beyond_max_model_len_are_refused_with_the_line(tmp_path):
    path = mooncake(tmp_path, [row(0, 4, 2, [0]), row(10, 1000, 30, [])])
    with pytest.raises(ConfigError, match=r"t.jsonl:2: .*1000 prompt \+ 30 output = 1030 tokens.*max_model_len=1024"):
        spec_for(path).check(max_model_len=1024)


@pytest.mark.parametrize("changes, key", [
    ({"trace_speed": 0}, "trace_speed"),
    ({"trace_start_s": -1.0}, "trace_start_s"),
    ({"trace_span_s": 0.0}, "trace_span_s"),
    ({"trace_max_requests": 0}, "trace_max_requests"),
    ({"trace_block_size": 0}, "trace_block_size"),
    ({"loop": "closed"}, "loop"),
    ({"trace": "/nonexistent.jsonl"}, "trace"),
])
def test_bad_trace_options_name_the_key(tmp_path, changes, key):
    path = mooncake(tmp_path, [row(0, 4, 2, [0])])
    with pytest.raises(ConfigError, match=rf"workload\.{key}"):
        spec_for(path, **changes).check(max_model_len=1024)


def test_workload_trace_composes_and_counts_the_requests_it_replays(tmp_path):
    from throttle_sweep.settings.sections import workload_from

    path = mooncake(tmp_path, [row(ms, 4, 2, [0]) for ms in (0, 10, 20)])
    spec = workload_from(compose_cfg("workload=trace", f"workload.trace={path}", "workload.trace_block_size=4"))
    assert (spec.loop, spec.trace, spec.num_requests) == ("open", path, 3)
    with pytest.raises(ConfigError, match=r"workload=trace needs workload.trace=PATH"):
        workload_from(compose_cfg("workload=trace"))
    with pytest.raises(ConfigError, match=r"workload.num_requests.*workload.trace_max_requests"):
        workload_from(compose_cfg("workload=trace", f"workload.trace={path}", "workload.num_requests=2"))


def test_capacity_searches_the_traces_speed_up_and_says_how_many_times_faster_it_still_meets_the_slo(tmp_path):
    from rich.console import Console

    from throttle_sweep.commands import capacity as capacity_cmd
    from throttle_sweep.store.records import read_records

    times = [round(i * 200 + 150 * (i % 3 == 0)) for i in range(120)]  # 5 req/s on average, some pairs close
    path = mooncake(tmp_path, [row(ms, 24, 8, [0, 1]) for ms in times])
    console = Console(record=True, width=200)
    cfg = compose_cfg("mode=capacity", "run=cap", "backend=fake", "workload=trace", f"workload.trace={path}",
                      "workload.trace_block_size=16", "slo.p95_ttft_s=0.2", "slo.p95_tpot_s=0.05", "plots=false",
                      "capacity.knee_rates=3", "capacity.knee_replicates=2", tmp_path=tmp_path)
    assert capacity_cmd.run(cfg, console) == 0, console.export_text()
    said = console.export_text()
    trace_rps = 119 / ((times[-1] - times[0]) / 1000)  # the trace's mean rate at speed 1
    records = read_records(tmp_path / "cap" / "replicates.jsonl")
    assert records[0]["workload"]["rate"] == pytest.approx(trace_rps)  # the search starts at the trace's own pace
    for r in records:  # each run is the trace, sped up to the rate searched: its arrivals, scaled
        speed = r["workload"]["trace_speed"]
        assert speed == pytest.approx(r["workload"]["rate"] / trace_rps)
        assert [a for a, _, _, _ in r["requests_s"]] == pytest.approx([(t - times[0]) / 1000 / speed for t in times], abs=1e-6)
    summary = json.loads((tmp_path / "cap" / "summary.json").read_text())
    assert f"this trace, sped up {summary['capacity_rps'] / trace_rps:.3g} times, still meets the SLO" in said


def test_the_goodput_sweep_searches_a_traces_speed_up_too(tmp_path):
    from throttle_sweep.settings.goodput import load_goodput

    path = mooncake(tmp_path, [row(ms, 4, 2, [0]) for ms in range(0, 3000, 100)])
    cfg = compose_cfg("mode=sweep", "+space=batching", "study.objective=goodput", "backend=fake", "workload=trace",
                      f"workload.trace={path}", "workload.trace_block_size=4", "slo.p95_ttft_s=1", tmp_path=tmp_path)
    capacity = load_goodput(cfg).capacity
    assert capacity.at(20.0)["trace_speed"] == pytest.approx(20.0 / (29 / 2.9))


def test_a_trace_arriving_all_at_once_has_no_pace_to_speed_up(tmp_path):
    from throttle_sweep.settings.capacity import load_capacity

    path = mooncake(tmp_path, [row(0, 4, 2, [0])] * 30)
    cfg = compose_cfg("mode=capacity", "backend=fake", "workload=trace", f"workload.trace={path}",
                      "workload.trace_block_size=4", "slo.p95_ttft_s=1", tmp_path=tmp_path)
    with pytest.raises(ConfigError, match=r"all 30 requests .* arrive at 0 s.*no pace to speed up"):
        load_capacity(cfg)


def test_the_shipped_trace_is_the_scripts_and_has_bursts_and_shared_prefixes_within_the_tiny_model(tmp_path,
                                                                                                   monkeypatch):
    import runpy
    import sys
    from collections import Counter
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    shipped = root / "examples" / "mooncake-synthetic.jsonl"
    # the script as its command line runs it, in this thread (a Python start-up costs more than the script)
    monkeypatch.setattr(sys, "argv", ["make_trace.py", str(tmp_path / "t.jsonl")])
    runpy.run_path(str(root / "scripts" / "make_trace.py"), run_name="__main__")
    assert (tmp_path / "t.jsonl").read_text() == shipped.read_text()
    spec = WorkloadSpec(loop="open", trace=str(shipped), trace_block_size=128)
    spec.check(max_model_len=1024)  # every request fits the embedded tiny model
    lines = [json.loads(line) for line in shipped.read_text().splitlines()]
    times = [line["timestamp"] for line in lines]
    busiest = max(sum(t <= u < t + 200 for u in times) for t in times)
    assert busiest >= 6 > 5 * len(times) * 200 / times[-1]  # bursts: 6 in 200 ms, over 5 times the mean rate
    uses = Counter(h for line in lines for h in line["hash_ids"])
    assert sum(n for n in uses.values() if n > 1) > len(lines)  # more than one shared block a request
    reqs = make_requests(spec)
    assert [r.prompt_len for r in reqs] == [line["input_length"] for line in lines]
