from __future__ import annotations

import json

import pytest

from throttle_sweep.engines import FakeEngine
from throttle_sweep.errors import ConfigError
from throttle_sweep.workload import WorkloadSpec, drive, make_requests


def test_requests_are_identical_across_calls_and_differ_by_seed():
    spec = WorkloadSpec(num_requests=20, length_dist="uniform")
    assert make_requests(spec) == make_requests(spec)
    assert make_requests(spec) != make_requests(WorkloadSpec(num_requests=20, length_dist="uniform", seed=1))
    assert make_requests(spec, warmup=True) != make_requests(spec)[:4]


def test_uniform_lengths_stay_in_range():
    spec = WorkloadSpec(num_requests=200, prompt_len=100, output_len=50, length_dist="uniform", length_spread=0.4)
    reqs = make_requests(spec)
    assert all(60 <= r.prompt_len <= 140 and 30 <= r.output_len <= 70 for r in reqs)
    assert len({r.output_len for r in reqs}) > 10


class CountingSession:
    """Wraps a fake session and records how many requests were ever in flight at once."""

    def __init__(self, inner):
        self.inner, self.in_flight, self.max_in_flight = inner, 0, 0

    def add(self, request):
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.inner.add(request)

    def step(self):
        events = self.inner.step()
        self.in_flight -= sum(e.finished for e in events)
        return events

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_closed_loop_keeps_exactly_k_in_flight_and_completes_fixed_work():
    spec = WorkloadSpec(num_requests=30, prompt_len=16, output_len=10, concurrency=8)
    session = CountingSession(FakeEngine().start({"max_num_seqs": 64}))
    result = drive(session, make_requests(spec), loop="closed", concurrency=8)
    assert session.max_in_flight == 8
    assert sum(t.output_tokens for t in result.timings) == 30 * 10
    assert all(t.first_token_s <= t.finished_s for t in result.timings)


def test_open_loop_submits_at_arrival_times():
    spec = WorkloadSpec(num_requests=40, prompt_len=8, output_len=4, loop="open", rate=5.0)
    reqs = make_requests(spec)
    assert reqs[0].arrival_s == 0 and all(a.arrival_s <= b.arrival_s for a, b in zip(reqs, reqs[1:], strict=False))
    result = drive(FakeEngine().start({}), reqs, loop="open", concurrency=1)
    for req, timing in zip(reqs, result.timings, strict=False):
        assert timing.submitted_s - result.started_s >= req.arrival_s - 1e-9
    # the engine is far faster than 5 req/s, so the run lasts about as long as the arrivals
    assert result.wall_s == pytest.approx(reqs[-1].arrival_s, rel=0.1)


def test_jsonl_prompts(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text(json.dumps({"prompt_token_ids": [5, 6, 7], "output_len": 9}) + "\n"
                    + json.dumps({"prompt": "hello"}) + "\n")
    reqs = make_requests(WorkloadSpec(jsonl=str(path), output_len=3))
    assert [(r.prompt_token_ids, r.prompt_text, r.output_len) for r in reqs] == [((5, 6, 7), None, 9),
                                                                                  (None, "hello", 3)]


@pytest.mark.parametrize("line, message", [
    ("{not json", "not valid JSON"),
    ('{"prompt": "a", "prompt_token_ids": [1]}', "exactly one of"),
    ('{"prompt_token_ids": [1], "output_len": 0}', "output_len"),
])
def test_bad_jsonl_names_the_line(tmp_path, line, message):
    path = tmp_path / "w.jsonl"
    path.write_text('{"prompt_token_ids": [1, 2]}\n' + line + "\n")
    with pytest.raises(ConfigError, match=rf"w.jsonl:2: .*{message}"):
        make_requests(WorkloadSpec(jsonl=str(path)))


@pytest.mark.parametrize("changes, key", [
    ({"num_requests": 0}, "num_requests"),
    ({"output_len": -5}, "output_len"),
    ({"concurrency": 0}, "concurrency"),
    ({"loop": "open", "rate": None}, "rate"),
    ({"jsonl": "/nonexistent.jsonl"}, "jsonl"),
])
def test_bad_workload_names_the_key(changes, key):
    with pytest.raises(ConfigError, match=rf"workload\.{key}"):
        WorkloadSpec(**changes).check(max_model_len=1024)


def test_output_beyond_max_model_len_is_refused():
    with pytest.raises(ConfigError, match="beyond max_model_len=128"):
        WorkloadSpec(prompt_len=64, output_len=100).check(max_model_len=128)
