from __future__ import annotations

import json

import pytest

from throttle_sweep.engines import FakeEngine
from throttle_sweep.errors import ConfigError
from throttle_sweep.measurement.workload import WorkloadSpec, drive, make_requests


def test_requests_are_identical_across_calls_and_differ_by_seed():
    spec = WorkloadSpec(num_requests=20, length_dist="uniform")
    assert make_requests(spec) == make_requests(spec)
    assert make_requests(spec) != make_requests(WorkloadSpec(num_requests=20, length_dist="uniform", seed=1))
    assert make_requests(spec, warmup=True) != make_requests(spec)[:4]


def test_a_longer_request_set_starts_with_the_shorter_ones_requests_whichever_was_made_first():
    """Prompts are one stream of draws (kept between calls, so that runs at many rates do not draw them again):
    the first n requests of a set of m > n are the set of n, made in either order, uniform lengths included."""
    import random

    spec = WorkloadSpec(num_requests=50, prompt_len=16, output_len=8, length_dist="uniform", seed=11)
    longer = make_requests(spec)
    shorter = make_requests(WorkloadSpec(num_requests=20, prompt_len=16, output_len=8, length_dist="uniform",
                                         seed=11))
    assert shorter == longer[:20] and make_requests(spec) == longer
    rng = random.Random(11)  # the draws, in order: the prompt's length, its ids, the output's length
    first_len = max(1, round(rng.uniform(16 * 0.5, 16 * 1.5)))
    assert len(longer[0].prompt_token_ids) == first_len


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
    reqs = make_requests(WorkloadSpec(num_requests=2, jsonl=str(path), output_len=3))
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


def sharegpt_file(tmp_path, conversations):
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(conversations))
    return str(path)


def convo(human_chars: int, gpt_chars: int, *, first="human") -> dict:
    return {"id": "x", "conversations": [{"from": first, "value": "h" * human_chars},
                                         {"from": "gpt", "value": "g" * gpt_chars},
                                         {"from": "human", "value": "ignored: only the first exchange counts"}]}


def test_sharegpt_lengths_follow_the_conversations_filtered_as_vllm_does(tmp_path):
    kept = [convo(400, 800), convo(40, 2000), convo(100, 60)]  # 100+200, 10+500, 25+15 tokens at 4 chars a token
    dropped = [convo(8, 800),      # a 2-token prompt (< 4)
               convo(4400, 40),    # a 1100-token prompt (> 1024)
               convo(3600, 4800),  # 900 + 1200 tokens (> 2048 in all)
               convo(400, 800, first="gpt"),  # not a human turn first
               {"id": "y", "conversations": [{"from": "human", "value": "only one turn"}]}]
    spec = WorkloadSpec(num_requests=3, sharegpt=sharegpt_file(tmp_path, kept + dropped))
    spec.check(max_model_len=2048)
    requests = make_requests(spec)
    assert sorted((r.prompt_len, r.output_len) for r in requests) == [(10, 500), (25, 15), (100, 200)]
    assert make_requests(spec) == requests  # the same work every replicate
    assert len(make_requests(WorkloadSpec(num_requests=2, sharegpt=spec.sharegpt))) == 2


@pytest.mark.parametrize(("content", "message"), [
    ("[{\"conversations\": [", "not valid JSON at line 1"),
    ("{\"conversations\": []}", "a JSON list of conversations, but this one holds a dict"),
    (json.dumps([convo(2, 2)]), "no usable conversations"),
])
def test_a_sharegpt_file_that_cannot_be_used_is_named_with_the_reason(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message) as caught:
        make_requests(WorkloadSpec(sharegpt=str(path)))
    assert str(path) in str(caught.value)


def test_a_shared_prefix_starts_every_prompt_warm_up_included():
    spec = WorkloadSpec(num_requests=6, prompt_len=8, shared_prefix_len=32)
    requests = make_requests(spec) + make_requests(spec, warmup=True)
    prefixes = {r.prompt_token_ids[:32] for r in requests}
    assert len(prefixes) == 1 and all(r.prompt_len == 40 for r in requests)
    assert len({r.prompt_token_ids[32:] for r in make_requests(spec)}) == 6  # each its own continuation
    with pytest.raises(ConfigError, match="shared_prefix_len must be an integer >= 0"):
        WorkloadSpec(shared_prefix_len=-1).check(max_model_len=None)


def test_with_a_tokenizer_sharegpt_text_is_counted_and_sent_as_its_own_tokens(tmp_path):
    """A word-level tokenizer built here (nothing downloaded): lengths are its token counts, and the prompt
    goes to the engine as its token ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "far", "away", "[UNK]"]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]").save_pretrained(tmp_path / "tok")
    prompt, reply = "the cat sat on the mat", "a dog ran far far away"  # 6 and 6 words
    spec = WorkloadSpec(num_requests=1, tokenizer=str(tmp_path / "tok"),
                        sharegpt=sharegpt_file(tmp_path, [{"conversations": [{"from": "human", "value": prompt},
                                                                             {"from": "gpt", "value": reply}]}]))
    (request,) = make_requests(spec)
    assert request.prompt_token_ids == (0, 1, 2, 3, 0, 4) and request.output_len == 6
    with pytest.raises(ConfigError, match="workload.tokenizer='/nowhere/tok' cannot be loaded"):
        make_requests(WorkloadSpec(sharegpt=spec.sharegpt, tokenizer="/nowhere/tok"))


def test_open_loop_arrivals_are_one_sequence_of_draws_scaled_by_the_rate_whatever_the_count():
    """Arrivals come from their own random stream: a run at twice the rate with twice the requests starts
    with the same arrivals, halved (the prompts' draws do not shift them), so attainment against the rate is
    one smooth curve, not a new schedule at every rate."""
    from dataclasses import replace

    from throttle_sweep.measurement.workload import WorkloadSpec, make_requests

    slow = make_requests(WorkloadSpec(num_requests=20, loop="open", rate=2.0, seed=3))
    fast = make_requests(WorkloadSpec(num_requests=40, loop="open", rate=4.0, seed=3))
    assert [r.arrival_s / 2 for r in slow] == pytest.approx([r.arrival_s for r in fast[:20]], rel=1e-12)
    assert [r.prompt_token_ids for r in slow] == [r.prompt_token_ids for r in fast[:20]]
    # another arrival seed: the same prompts, another schedule (a replicate that samples the arrivals' noise)
    spec = WorkloadSpec(num_requests=20, loop="open", rate=2.0, seed=3)
    other = make_requests(replace(spec, arrival_seed=4))
    assert [r.prompt_token_ids for r in other] == [r.prompt_token_ids for r in slow]
    assert [r.arrival_s for r in other] != [r.arrival_s for r in slow]
    assert make_requests(replace(spec, arrival_seed=3)) == slow  # the workload's own seed by default
